/* gen.c — one OpenAI request run on leased kvd slots: prefill, decode, stop strings across tokens, cancel. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/random.h>
#include "tools/kvhttp/kvhttp.h"

#define SLICE_MS	1000	/* waits are cut into slices; none has a deadline of its own */

/* Seconds on CLOCK_MONOTONIC: what the latency histograms measure with. */
static double mono_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
#define END_SLICES	120	/* a cancel's completion: give up on a daemon silent for 2 min */
#define KVH_UD_RESET	3

void kvh_err_from_kvd(struct kvh_err *e, int err, uint32_t aux, uint32_t ctx_len)
{
	switch (err) {
	case -E2BIG:
		kvh_err_set(e, 400, "invalid_request_error", "messages", "context_length_exceeded",
			    "this model's maximum context length is %u tokens; the request needs %u", ctx_len,
			    aux);
		break;
	case -EBUSY: case -EDQUOT: case -EMFILE: case -EAGAIN:
		kvh_err_set(e, 429, "rate_limit_error", NULL, "rate_limit_exceeded", "kvd is at its limits: %s",
			    kvc_strerror(err));
		e->retry_after = 1;
		break;
	case -ENOSPC:
		kvh_err_set(e, 400, "invalid_request_error", NULL, "context_length_exceeded",
			    "the KV cache cannot hold this request: %s", kvc_strerror(err));
		break;
	case -ERANGE:
		kvh_err_set(e, 400, "invalid_request_error", "prompt", NULL, "a token id is outside the vocabulary");
		break;
	case -EINVAL: case -EFAULT:
		kvh_err_set(e, 400, "invalid_request_error", NULL, NULL, "kvd refused the request: %s",
			    kvc_strerror(err));
		break;
	case -ECONNRESET: case -EPIPE: case -ECONNREFUSED: case -ENOENT: case -ESHUTDOWN: case -ETIMEDOUT:
		kvh_err_set(e, 503, "server_error", NULL, "service_unavailable", "kvd is not available: %s",
			    kvc_strerror(err));
		e->retry_after = 1;
		break;
	default:
		kvh_err_set(e, 500, "server_error", NULL, NULL, "kvd: %s", kvc_strerror(err));
	}
}

/* The next completion of the lease of kind `kind` for choice i, taking others as they come. */
static int wait_kind(struct kvh_gen *g, struct kvd_cqe *cqe, int client_fd)
{
	for (;;) {
		int rc = kvh_lease_wait(&g->lease, cqe, client_fd, SLICE_MS);
		if (rc != -ETIMEDOUT)
			return rc;
	}
}

/* A chat the current ABI can say without KVD_FEAT_MESSAGES: [system,] user. Index of the user turn, or -1. */
static int single_turn(const struct kvh_req *r)
{
	if (r->n_msgs == 1 && r->msgs[0].role == KVD_ROLE_USER)
		return 0;
	if (r->n_msgs == 2 && r->msgs[0].role == KVD_ROLE_SYSTEM && r->msgs[1].role == KVD_ROLE_USER)
		return 1;
	return -1;
}

/* A chat prompt into a (room bytes at arena offset base). Returns bytes, or -errno with *e filled. */
static int put_chat(struct kvh_gen *g, uint8_t *a, uint32_t base, uint32_t room, struct kvd_sqe *t,
		    struct kvh_err *e)
{
	const struct kvh_req *r = g->req;
	if (kvh_lease_info(&g->lease)->features & KVD_FEAT_MESSAGES) {
		int n = kvc_messages_encode(r->msgs, r->n_msgs, NULL, 0);
		if (n > 0 && (uint32_t)n <= room)
			n = kvc_messages_encode(r->msgs, r->n_msgs, a + base, room);
		if (n < 0)
			kvh_err_set(e, 400, "invalid_request_error", "messages", NULL, "bad messages: %s",
				    kvc_strerror(n));
		t->flags = KVD_SQE_TEXT | KVD_SQE_CHAT | KVD_SQE_MESSAGES;
		return n > 0 && (uint32_t)n > room ? -E2BIG : n;
	}
	int u = single_turn(r);
	if (u < 0) {
		kvh_err_set(e, 400, "invalid_request_error", "messages", NULL, "a conversation of more than a "
			    "system message and one user message is not supported by this kvd (no KVD_FEAT_MESSAGES)");
		return -EOPNOTSUPP;
	}
	size_t ul = r->msgs[u].len, sl = u ? r->msgs[0].len : 0;
	if (ul + sl > room)
		return -E2BIG;
	memcpy(a + base, r->msgs[u].text, ul);
	if (sl) {
		memcpy(a + base + ul, r->msgs[0].text, sl);
		t->system_off = base + (uint32_t)ul;
		t->system_len = (uint32_t)sl;
	}
	t->flags = KVD_SQE_TEXT | KVD_SQE_CHAT;
	return (int)(ul + sl);
}

/* Write the prompt into slot 0's part and fill *t's prompt fields; *used: bytes taken there. */
static int put_prompt(struct kvh_gen *g, struct kvd_sqe *t, uint32_t *used, struct kvh_err *e)
{
	const struct kvh_req *r = g->req;
	uint8_t *a = kvh_lease_arena(&g->lease);
	uint32_t base = g->lease.off[0], room = g->lease.part_bytes / 2;
	int n;
	memset(t, 0, sizeof(*t));
	t->tokens_off = base;
	if (r->chat) {
		n = put_chat(g, a, base, room, t, e);
	} else if (r->ids) {
		n = (size_t)r->n_ids * 4 <= room ? (int)r->n_ids * 4 : -E2BIG;
		if (n > 0)
			memcpy(a + base, r->ids, (size_t)n);
	} else {
		n = r->text_len <= room ? (int)r->text_len : -E2BIG;
		if (n > 0)
			memcpy(a + base, r->text, (size_t)n);
		t->flags = KVD_SQE_TEXT;
	}
	if (n == -E2BIG)
		kvh_err_set(e, 413, "invalid_request_error", NULL, NULL, "the prompt is larger than kvhttp's "
			    "room for it (%u bytes)", room);
	else if (n == 0)
		kvh_err_set(e, 400, "invalid_request_error", r->chat ? "messages" : "prompt", NULL, "the prompt is empty");
	if (n <= 0)
		return n ? n : -EINVAL;
	t->n_tokens = r->ids ? r->n_ids : (uint32_t)n;
	*used = (t->system_len + (uint32_t)n + 63) & ~63u;
	return 0;
}

/* PREFILL every slot with the prompt; the first one's positions are the prompt's tokens. */
static int prefill(struct kvh_gen *g, int client_fd, struct kvh_err *e)
{
	const struct kvd_hello_rep *h = kvh_lease_info(&g->lease);
	struct kvd_sqe tmpl, sqe;
	uint32_t used = 0;
	int rc = put_prompt(g, &tmpl, &used, e);
	if (rc)
		return rc;
	for (uint32_t i = 0; i < g->req->n && !rc; i++) {
		kvc_prep_prefill(&sqe, g->lease.session_id, g->lease.slot[i],
				 kvh_lease_ud(&g->lease, i, KVH_UD_PREFILL), tmpl.tokens_off, tmpl.n_tokens);
		sqe.flags = tmpl.flags;
		sqe.system_off = tmpl.system_off;
		sqe.system_len = tmpl.system_len;
		rc = kvh_lease_submit(&g->lease, &sqe);
	}
	for (uint32_t got = 0; got < g->req->n && !rc;) {
		struct kvd_cqe cqe;
		rc = wait_kind(g, &cqe, client_fd);
		if (rc || kvh_ud_kind(cqe.user_data) != KVH_UD_PREFILL || (cqe.flags & KVD_CQE_MORE))
			continue;
		got++;
		if (cqe.res < 0)
			rc = cqe.res;
		else if (kvh_ud_choice(cqe.user_data) == 0)
			g->prompt_tokens = (uint32_t)cqe.res;
		if (cqe.flags & KVD_CQE_PREFIX_HIT)
			g->prefix_hit = 1;
		/* Choice 0's, like prompt_tokens: usage counts the prompt once, however many choices share it. */
		if (cqe.res >= 0 && kvh_ud_choice(cqe.user_data) == 0 && (cqe.flags & KVD_CQE_PREFIX_HIT) &&
		    (h->features & KVD_FEAT_CACHED_COUNT))
			g->cached = cqe.aux < (uint32_t)cqe.res ? cqe.aux : (uint32_t)cqe.res;
		if (rc == -E2BIG)
			kvh_err_from_kvd(e, rc, cqe.aux, h->ctx_len);
	}
	if (rc && rc != -E2BIG)
		kvh_err_from_kvd(e, rc, 0, h->ctx_len);
	g->prompt_used = used;
	return rc;
}

/* How many tokens to ask for: max_tokens, or up to the context (and the per-request limit). */
static int pick_max(struct kvh_gen *g, struct kvh_err *e)
{
	const struct kvd_hello_rep *h = kvh_lease_info(&g->lease);
	uint32_t lim = h->ctx_len < h->max_tokens ? h->ctx_len : h->max_tokens;
	uint32_t room = g->prompt_tokens < lim ? lim - g->prompt_tokens : 0;
	int64_t want = g->req->max_tokens;
	if (want < 0)
		want = room;
	if (want == 0 || want > room) {
		kvh_err_set(e, 400, "invalid_request_error", g->req->max_tokens < 0 ? "messages" : "max_tokens",
			    "context_length_exceeded", "this model's maximum context length is %u tokens; "
			    "the prompt has %u and %lld more were asked for", lim, g->prompt_tokens,
			    (long long)(want ? want : 1));
		return -E2BIG;
	}
	g->max_tokens = (uint32_t)want;
	uint32_t per_token = 4 + (g->req->logprobs ? kvc_logprobs_bytes(1, g->req->top_logprobs) : 0);
	uint32_t out_room = (g->lease.part_bytes - g->prompt_used) / per_token;
	if (g->max_tokens > out_room) {
		kvh_err_set(e, 400, "invalid_request_error", "max_tokens", NULL,
			    "max_tokens above kvhttp's room for the output (%u)", out_room);
		return -E2BIG;
	}
	return 0;
}

static uint32_t out_off(const struct kvh_gen *g, uint32_t i)
{
	return g->lease.off[i] + (i == 0 ? g->prompt_used : 0);
}

/* Choice i's kvd_logprob records: after its max_tokens output ids (4-aligned, as the ABI wants). */
static uint32_t lp_off(const struct kvh_gen *g, uint32_t i)
{
	return out_off(g, i) + 4 * g->max_tokens;
}

static int decode(struct kvh_gen *g, struct kvh_err *e)
{
	const struct kvh_req *r = g->req;
	uint64_t seed = r->seed;
	if (!r->has_seed && getrandom(&seed, sizeof(seed), 0) != sizeof(seed))
		seed = (uint64_t)time(NULL);
	struct kvc_sampling s = { .temperature = (float)r->temperature, .top_p = (float)r->top_p };
	if (r->logprobs && !(kvh_lease_info(&g->lease)->features & KVD_FEAT_LOGPROBS)) {
		kvh_err_set(e, 400, "invalid_request_error", "logprobs", NULL,
			    "'logprobs' is not supported by this kvd (no KVD_FEAT_LOGPROBS)");
		return -EOPNOTSUPP;
	}
	if ((r->presence || r->frequency) && !(kvh_lease_info(&g->lease)->features & KVD_FEAT_PENALTIES)) {
		kvh_err_set(e, 400, "invalid_request_error", r->presence ? "presence_penalty" : "frequency_penalty",
			    NULL, "'%s' is not supported by this kvd (no KVD_FEAT_PENALTIES)",
			    r->presence ? "presence_penalty" : "frequency_penalty");
		return -EOPNOTSUPP;
	}
	for (uint32_t i = 0; i < r->n; i++) {
		struct kvd_sqe sqe;
		kvc_prep_decode(&sqe, g->lease.session_id, g->lease.slot[i],
				kvh_lease_ud(&g->lease, i, KVH_UD_DECODE), out_off(g, i), g->max_tokens);
		sqe.flags = KVD_SQE_STREAM | (r->ignore_eos ? KVD_SQE_IGNORE_EOS : 0);
		s.seed = seed + i;
		if (kvc_prep_sampling(&sqe, &s) || kvc_prep_penalties(&sqe, (float)r->presence, (float)r->frequency)) {
			kvh_err_set(e, 400, "invalid_request_error", "temperature", NULL, "sampling out of range");
			return -EINVAL;
		}
		if (r->logprobs) {
			kvc_prep_logprobs(&sqe, lp_off(g, i), (uint8_t)r->top_logprobs);
			g->ch[i].lp = json_array();
		}
		int rc = kvh_lease_submit(&g->lease, &sqe);
		if (rc) {
			kvh_err_from_kvd(e, rc, 0, 0);
			return rc;
		}
		g->running++;
		g->started++;
	}
	return 0;
}

int kvh_gen_start(struct kvh_gen *g, const struct kvh_req *r, int client_fd, struct kvh_err *e)
{
	memset(g, 0, sizeof(*g));
	g->t0 = mono_now();	/* before the lease: a wait for a free slot is part of the first token's time */
	g->req = r;
	g->client_fd = client_fd;
	g->created = (long)time(NULL);
	uint64_t rnd = 0;
	if (getrandom(&rnd, sizeof(rnd), 0) != sizeof(rnd))
		rnd = (uint64_t)g->created;
	snprintf(g->id, sizeof(g->id), "%s-%016llx", r->chat ? "chatcmpl" : "cmpl", (unsigned long long)rnd);
	int rc = kvh_lease_get(&g->lease, r->n);
	if (rc) {
		if (rc == -E2BIG)
			kvh_err_set(e, 400, "invalid_request_error", "n", NULL, "'n' is above this kvd's slots per session");
		else
			kvh_err_from_kvd(e, rc, 0, 0);
		return rc;
	}
	g->have_lease = 1;
	rc = prefill(g, client_fd, e);
	if (!rc)
		rc = pick_max(g, e);
	if (!rc)
		rc = decode(g, e);
	return rc;
}

static int append(struct kvh_choice *c, const char *s, size_t n)
{
	if (c->len + n + 1 > c->cap) {
		size_t cap = (c->len + n + 1) * 2;
		char *t = realloc(c->text, cap);
		if (!t)
			return -ENOMEM;
		c->text = t;
		c->cap = cap;
	}
	memcpy(c->text + c->len, s, n);
	c->len += n;
	c->text[c->len] = 0;
	return 0;
}

/*
 * After new text: a stop string anywhere in what was not emitted (or
 * straddling it) ends the choice there; else emit all but the longest tail
 * that could still grow into a stop string.
 */
static size_t stop_scan(const struct kvh_req *r, struct kvh_choice *c, int *hit)
{
	size_t safe = c->len;
	*hit = 0;
	for (uint32_t k = 0; k < r->n_stop; k++) {
		size_t sl = r->stop_len[k];
		size_t from = c->emitted >= sl ? c->emitted - sl + 1 : 0;
		const char *p = c->len >= from + sl ? memmem(c->text + from, c->len - from, r->stop[k], sl) : NULL;
		if (p && (size_t)(p - c->text) < safe) {
			safe = (size_t)(p - c->text);
			*hit = 1;
		}
	}
	if (*hit) {
		c->len = safe;
		c->text[safe] = 0;
		return safe;
	}
	for (uint32_t k = 0; k < r->n_stop; k++) {
		size_t sl = r->stop_len[k];
		for (size_t t = sl - 1; t > 0; t--)
			if (t <= c->len && !memcmp(c->text + c->len - t, r->stop[k], t)) {
				if (c->len - t < safe)
					safe = c->len - t;
				break;
			}
	}
	return safe < c->emitted ? c->emitted : safe;
}

static int cancel(struct kvh_gen *g, uint32_t i)
{
	struct kvd_sqe sqe;
	kvc_prep_cancel(&sqe, g->lease.session_id, kvh_lease_ud(&g->lease, i, KVH_UD_CANCEL),
			kvh_lease_ud(&g->lease, i, KVH_UD_DECODE));
	g->ch[i].cancelling = 1;
	return kvh_lease_submit(&g->lease, &sqe);
}

/* One token's {token, logprob, bytes} (OpenAI's shape; -9999 stands for -inf, which JSON cannot say). */
static json_t *lp_one(struct kvc_conn *kc, const struct kvd_logprob *r)
{
	uint32_t len = 0;
	const char *b = kvc_token_bytes(kc, r->token, &len);
	json_t *bytes = json_array();
	for (uint32_t k = 0; k < len; k++)
		json_array_append_new(bytes, json_integer((unsigned char)b[k]));
	json_t *t = json_stringn(b ? b : "", len);
	if (!t)
		t = json_string("\ufffd");	/* a piece of a character */
	float v = kvc_logprob_value(r);
	return json_pack("{s:o,s:f,s:o}", "token", t, "logprob", v >= -9999.0f ? (double)v : -9999.0, "bytes",
			 bytes);
}

/* Choice i's records of token k into its list. */
static void lp_take(struct kvh_gen *g, uint32_t i, uint32_t k)
{
	const uint8_t *arena = kvh_lease_arena(&g->lease);
	struct kvc_conn *kc = kvh_lease_kvc(&g->lease);
	uint32_t top = g->req->top_logprobs;
	const struct kvd_logprob *r = (const struct kvd_logprob *)(arena + lp_off(g, i)) + (size_t)k * (1 + top);
	json_t *en = lp_one(kc, &r[0]), *alts = json_array();
	for (uint32_t j = 1; j <= top; j++)
		json_array_append_new(alts, lp_one(kc, &r[j]));
	json_object_set_new(en, "top_logprobs", alts);
	json_array_append_new(g->ch[i].lp, en);
}

/*
 * A token of c seen at now: the request's first one is its time to first
 * token, every later one of c a gap after the one before (0 for tokens
 * that arrived together: kvhttp times what it sees, as a client would).
 */
static void time_token(struct kvh_gen *g, struct kvh_choice *c, double now)
{
	if (!g->first_seen) {
		g->first_seen = 1;
		kvh_metrics_ttft(now - g->t0);
	} else if (c->last_at > 0) {
		kvh_metrics_itl(now - c->last_at);
	}
	c->last_at = now;
}

/* The tokens of choice i up to n_out into its text; 1 when a sink call happened. */
static int take_tokens(struct kvh_gen *g, uint32_t i, uint32_t n_out, const struct kvh_sink *s)
{
	struct kvh_choice *c = &g->ch[i];
	const uint32_t *out = (const uint32_t *)(kvh_lease_arena(&g->lease) + out_off(g, i));
	struct kvc_conn *kc = kvh_lease_kvc(&g->lease);
	double now = mono_now();
	for (; c->tokens < n_out && c->tokens < g->max_tokens && !c->finish; c->tokens++) {
		uint32_t len;
		time_token(g, c, now);
		const char *b = kvc_token_bytes(kc, __atomic_load_n(&out[c->tokens], __ATOMIC_RELAXED), &len);
		if (c->lp)
			lp_take(g, i, c->tokens);
		char buf[512 + 3];
		while (b && len) {
			uint32_t k = len < 512 ? len : 512;
			size_t w = kvc_utf8_feed(&c->u, b, k, buf);
			if (append(c, buf, w))
				return -ENOMEM;
			b += k;
			len -= k;
		}
		int hit;
		size_t safe = stop_scan(g->req, c, &hit);
		if (hit) {
			c->finish = "stop";
			c->tokens++;
			cancel(g, i);
		}
		if (safe > c->emitted) {
			s->text(s->user, i, c->text + c->emitted, safe - c->emitted);
			c->emitted = safe;
		}
	}
	return 1;
}

static void finish_choice(struct kvh_gen *g, uint32_t i, const struct kvd_cqe *cqe, const struct kvh_sink *s)
{
	struct kvh_choice *c = &g->ch[i];
	c->done = 1;
	g->running--;
	if (!c->finish) {
		char buf[4];
		size_t w = kvc_utf8_flush(&c->u, buf);
		append(c, buf, w);
		if (c->len > c->emitted)
			s->text(s->user, i, c->text + c->emitted, c->len - c->emitted);
		c->emitted = c->len;
		c->finish = (cqe->flags & KVD_CQE_LENGTH) ? "length" : "stop";
	}
	s->finish(s->user, i, c->finish);
}

int kvh_gen_pump(struct kvh_gen *g, const struct kvh_sink *s, struct kvh_err *e)
{
	int acted = 0;
	while (g->running && !acted) {
		struct kvd_cqe cqe;
		int rc = kvh_lease_wait(&g->lease, &cqe, g->client_fd, SLICE_MS);
		if (rc == -ETIMEDOUT)
			continue;
		if (rc) {
			kvh_err_from_kvd(e, rc, 0, 0);
			return rc;
		}
		uint32_t i = kvh_ud_choice(cqe.user_data);
		if (kvh_ud_kind(cqe.user_data) != KVH_UD_DECODE || i >= g->req->n || g->ch[i].done ||
		    (cqe.flags & KVD_CQE_PROGRESS))
			continue;
		if (cqe.res < 0 && !(cqe.flags & KVD_CQE_MORE)) {
			kvh_err_from_kvd(e, cqe.res, cqe.aux, kvh_lease_info(&g->lease)->ctx_len);
			g->ch[i].done = 1;
			g->running--;
			return cqe.res;
		}
		acted = take_tokens(g, i, cqe.n_out, s);
		if (acted < 0)
			return acted;
		if (!(cqe.flags & KVD_CQE_MORE)) {
			finish_choice(g, i, &cqe, s);
			acted = 1;
		}
	}
	return g->running ? 1 : 0;
}

/* Wait for the finals of cancelled choices and the RESETs; the daemon may be gone (then stop). */
static void drain(struct kvh_gen *g, uint32_t resets)
{
	for (int slices = 0; (g->running || resets) && slices < END_SLICES;) {
		struct kvd_cqe cqe;
		int rc = kvh_lease_wait(&g->lease, &cqe, -1, SLICE_MS);
		if (rc == -ETIMEDOUT) {
			slices++;
			continue;
		}
		if (rc)
			return;
		uint32_t i = kvh_ud_choice(cqe.user_data);
		int kind = kvh_ud_kind(cqe.user_data);
		if (kind == KVH_UD_RESET)
			resets--;
		else if (kind == KVH_UD_DECODE && !(cqe.flags & KVD_CQE_MORE) && i < g->req->n && !g->ch[i].done) {
			g->ch[i].done = 1;
			g->running--;
		}
	}
}

void kvh_gen_end(struct kvh_gen *g)
{
	if (g->have_lease) {
		uint32_t resets = 0;
		for (uint32_t i = 0; i < g->started; i++)
			if (!g->ch[i].done && !g->ch[i].cancelling)
				cancel(g, i);
		/* RESET gives the slots' KV blocks back now, not when the slot is reused. */
		for (uint32_t i = 0; i < g->lease.n; i++) {
			struct kvd_sqe sqe;
			kvc_prep_reset(&sqe, g->lease.session_id, g->lease.slot[i],
				       kvh_lease_ud(&g->lease, i, KVH_UD_RESET));
			if (kvh_lease_submit(&g->lease, &sqe) == 0)
				resets++;
		}
		drain(g, resets);
		kvh_lease_put(&g->lease);
		g->have_lease = 0;
	}
	for (uint32_t i = 0; i < KVH_MAX_CHOICES; i++) {
		free(g->ch[i].text);
		json_decref(g->ch[i].lp);
	}
}
