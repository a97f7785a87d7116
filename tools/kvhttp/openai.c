/* openai.c — OpenAI request bodies into struct kvh_req, and the response objects built from a generation. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tools/kvhttp/kvhttp.h"

void kvh_err_set(struct kvh_err *e, unsigned int status, const char *type, const char *param,
		 const char *code, const char *fmt, ...)
{
	va_list ap;
	e->status = status;
	e->type = type;
	e->param = param;
	e->code = code;
	e->retry_after = 0;
	va_start(ap, fmt);
	vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
	va_end(ap);
}

#define BAD(e, param, ...) \
	(kvh_err_set((e), 400, "invalid_request_error", (param), NULL, __VA_ARGS__), -EINVAL)

/* Fields that change the result and this kvd cannot honour: refused by name, never ignored. */
static const char *const unsupported[] = {
	"logit_bias",
	"tools", "tool_choice", "functions", "function_call", "best_of", "suffix", NULL,
};

/* A field set to something other than its no-op value. */
static int is_set(const char *k, json_t *v)
{
	if (json_is_null(v) || json_is_false(v))
		return 0;
	if (!strcmp(k, "logit_bias") && json_is_object(v))
		return json_object_size(v) != 0;
	if ((!strcmp(k, "tools") || !strcmp(k, "functions")) && json_is_array(v))
		return json_array_size(v) != 0;
	if (!strcmp(k, "tool_choice") && json_is_string(v))
		return strcmp(json_string_value(v), "none") != 0;
	if (!strcmp(k, "best_of") && json_is_integer(v))
		return json_integer_value(v) != 1;
	return 1;
}

static int check_unsupported(json_t *root, struct kvh_err *e)
{
	for (const char *const *k = unsupported; *k; k++) {
		json_t *v = json_object_get(root, *k);
		if (v && is_set(*k, v))
			return BAD(e, *k, "'%s' is not supported by this kvd", *k);
	}
	return 0;
}

static int get_num(json_t *root, const char *k, double lo, double hi, double *out, struct kvh_err *e)
{
	json_t *v = json_object_get(root, k);
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_number(v))
		return BAD(e, k, "'%s' must be a number", k);
	double x = json_number_value(v);
	if (!(x >= lo && x <= hi))
		return BAD(e, k, "'%s' must be from %g to %g", k, lo, hi);
	*out = x;
	return 0;
}

static int get_int(json_t *root, const char *k, int64_t lo, int64_t hi, int64_t *out, struct kvh_err *e)
{
	json_t *v = json_object_get(root, k);
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_integer(v))
		return BAD(e, k, "'%s' must be an integer", k);
	json_int_t x = json_integer_value(v);
	if (x < lo || x > hi)
		return BAD(e, k, "'%s' must be from %lld to %lld", k, (long long)lo, (long long)hi);
	*out = x;
	return 0;
}

static int get_bool(json_t *root, const char *k, int *out, struct kvh_err *e)
{
	json_t *v = json_object_get(root, k);
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_boolean(v))
		return BAD(e, k, "'%s' must be a boolean", k);
	*out = json_is_true(v);
	return 0;
}

static int parse_stop(struct kvh_req *r, json_t *root, struct kvh_err *e)
{
	json_t *v = json_object_get(root, "stop");
	if (!v || json_is_null(v))
		return 0;
	if (json_is_string(v)) {
		v = json_pack("[O]", v);
		json_object_set_new(root, "stop", v);	/* root owns the array from here */
	}
	if (!json_is_array(v) || json_array_size(v) > KVH_MAX_STOPS)
		return BAD(e, "stop", "'stop' must be a string or an array of up to %d strings", KVH_MAX_STOPS);
	size_t i;
	json_t *s;
	json_array_foreach(v, i, s) {
		if (!json_is_string(s) || !json_string_length(s))
			return BAD(e, "stop", "'stop' must hold non-empty strings");
		r->stop[r->n_stop] = json_string_value(s);
		r->stop_len[r->n_stop++] = json_string_length(s);
	}
	return 0;
}

/* chat: logprobs true and top_logprobs 0..20; completions: logprobs 0..5 alternatives. */
static int parse_logprobs(struct kvh_req *r, json_t *root, struct kvh_err *e)
{
	json_t *v = json_object_get(root, "logprobs");
	int64_t top = 0;
	int rc = 0;
	if (!v || json_is_null(v))
		return json_is_integer(json_object_get(root, "top_logprobs")) &&
		       json_integer_value(json_object_get(root, "top_logprobs")) ?
		       BAD(e, "top_logprobs", "'top_logprobs' needs 'logprobs'") : 0;
	if (r->chat) {
		rc = get_bool(root, "logprobs", &r->logprobs, e);
		if (!rc)
			rc = get_int(root, "top_logprobs", 0, KVD_MAX_TOP_LOGPROBS, &top, e);
	} else {
		rc = get_int(root, "logprobs", 0, 5, &top, e);
		r->logprobs = !rc;
	}
	r->top_logprobs = (uint32_t)top;
	return rc;
}

static int parse_common(struct kvh_req *r, json_t *root, struct kvh_err *e)
{
	int64_t n = 1, mt = -1, mct = -1, seed = -1;
	int rc = check_unsupported(root, e);
	if (!rc)
		rc = get_bool(root, "stream", &r->stream, e);
	if (!rc)
		rc = get_int(root, "n", 1, KVH_MAX_CHOICES, &n, e);
	if (!rc)
		rc = get_int(root, "max_tokens", 1, 1 << 24, &mt, e);
	if (!rc)
		rc = get_int(root, "max_completion_tokens", 1, 1 << 24, &mct, e);
	if (!rc)
		rc = get_num(root, "temperature", 0, 2, &r->temperature, e);
	if (!rc)
		rc = get_num(root, "top_p", 0, 1, &r->top_p, e);
	if (!rc)
		rc = get_int(root, "seed", INT64_MIN, INT64_MAX, &seed, e);
	if (!rc)
		rc = get_bool(root, "ignore_eos", &r->ignore_eos, e);
	if (!rc)
		rc = parse_logprobs(r, root, e);
	if (!rc)
		rc = get_num(root, "presence_penalty", -2, 2, &r->presence, e);
	if (!rc)
		rc = get_num(root, "frequency_penalty", -2, 2, &r->frequency, e);
	if (!rc)
		rc = parse_stop(r, root, e);
	if (rc)
		return rc;
	r->has_seed = json_is_integer(json_object_get(root, "seed"));
	r->seed = (uint64_t)seed;
	r->n = (uint32_t)n;
	r->max_tokens = mct > 0 ? mct : mt;
	json_t *so = json_object_get(root, "stream_options");
	if (so && !json_is_null(so)) {
		if (!json_is_object(so))
			return BAD(e, "stream_options", "'stream_options' must be an object");
		if ((rc = get_bool(so, "include_usage", &r->include_usage, e)))
			return rc;
	}
	json_t *rf = json_object_get(root, "response_format");
	if (rf && !json_is_null(rf)) {
		const char *t = json_string_value(json_object_get(rf, "type"));
		if (!t)
			return BAD(e, "response_format", "'response_format' must be an object with a 'type'");
		if (strcmp(t, "text"))
			return BAD(e, "response_format", "response_format type '%s' is not supported by this kvd "
				   "(only \"text\")", t);
	}
	json_t *m = json_object_get(root, "model");
	if (m && !json_is_null(m) && !json_is_string(m))
		return BAD(e, "model", "'model' must be a string");
	return 0;
}

/* A message's content: a string, or an array of {"type":"text","text":...} parts joined. */
static int content_text(json_t *msg, size_t i, char **out, size_t *len, struct kvh_err *e)
{
	json_t *c = json_object_get(msg, "content");
	if (json_is_string(c)) {
		*out = strndup(json_string_value(c), json_string_length(c));
		*len = json_string_length(c);
		return *out ? 0 : -ENOMEM;
	}
	if (!json_is_array(c))
		return BAD(e, "messages", "messages[%zu].content must be a string or an array of text parts", i);
	size_t j, cap = 1, n = 0;
	json_t *p;
	json_array_foreach(c, j, p)
		cap += json_string_length(json_object_get(p, "text"));
	char *s = malloc(cap);
	if (!s)
		return -ENOMEM;
	json_array_foreach(c, j, p) {
		const char *t = json_string_value(json_object_get(p, "type"));
		json_t *tx = json_object_get(p, "text");
		if (!t || strcmp(t, "text") || !json_is_string(tx)) {
			free(s);
			return BAD(e, "messages", "messages[%zu].content[%zu]: only text parts are supported", i, j);
		}
		memcpy(s + n, json_string_value(tx), json_string_length(tx));
		n += json_string_length(tx);
	}
	s[n] = 0;
	*out = s;
	*len = n;
	return 0;
}

/*
 * The conversation, kept whole: kvd renders it (KVD_SQE_MESSAGES) where it
 * grants KVD_FEAT_MESSAGES; gen.c falls back to one user turn (and a
 * system message) with KVD_SQE_CHAT, or refuses what that cannot say.
 */
static int parse_messages(struct kvh_req *r, json_t *root, struct kvh_err *e)
{
	json_t *ms = json_object_get(root, "messages");
	if (!json_is_array(ms) || !json_array_size(ms))
		return BAD(e, "messages", "'messages' must be a non-empty array");
	r->msgs = calloc(json_array_size(ms), sizeof(*r->msgs));
	if (!r->msgs)
		return -ENOMEM;
	size_t i;
	json_t *m;
	json_array_foreach(ms, i, m) {
		const char *role = json_string_value(json_object_get(m, "role"));
		if (!json_is_object(m) || !role)
			return BAD(e, "messages", "messages[%zu] must be an object with a 'role'", i);
		uint8_t rl = !strcmp(role, "system") || !strcmp(role, "developer") ? KVD_ROLE_SYSTEM :
			     !strcmp(role, "user") ? KVD_ROLE_USER : !strcmp(role, "assistant") ? KVD_ROLE_ASSISTANT : 0;
		if (!rl)
			return BAD(e, "messages", "messages[%zu].role '%s' is not supported by this kvd (system, "
				   "user, assistant)", i, role);
		char *t;
		size_t len;
		int rc = content_text(m, i, &t, &len, e);
		if (rc)
			return rc;
		r->msgs[i] = (struct kvc_message){ .role = rl, .text = t, .len = len };
		r->n_msgs = i + 1;
	}
	return 0;
}

static int parse_prompt(struct kvh_req *r, json_t *root, struct kvh_err *e)
{
	json_t *p = json_object_get(root, "prompt");
	if (json_is_array(p) && json_array_size(p) == 1 && !json_is_integer(json_array_get(p, 0)))
		p = json_array_get(p, 0);	/* a batch of one */
	if (json_is_string(p)) {
		r->text = strndup(json_string_value(p), json_string_length(p));
		r->text_len = json_string_length(p);
		return r->text ? 0 : -ENOMEM;
	}
	if (!json_is_array(p) || !json_array_size(p))
		return BAD(e, "prompt", "'prompt' must be a string or a non-empty array of token ids");
	r->n_ids = (uint32_t)json_array_size(p);
	r->ids = malloc(r->n_ids * sizeof(*r->ids));
	if (!r->ids)
		return -ENOMEM;
	size_t i;
	json_t *t;
	json_array_foreach(p, i, t) {
		if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > UINT32_MAX)
			return BAD(e, "prompt", "'prompt' must be one string or one array of token ids "
				   "(a batch of prompts is not supported)");
		r->ids[i] = (uint32_t)json_integer_value(t);
	}
	return 0;
}

int kvh_req_parse(struct kvh_req *r, int chat, const char *body, size_t len, struct kvh_err *e)
{
	memset(r, 0, sizeof(*r));
	r->chat = chat;
	r->temperature = 1.0;
	r->top_p = 1.0;
	json_error_t je;
	r->root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
	if (!r->root)
		return BAD(e, NULL, "the body is not valid JSON: %s (line %d, column %d)", je.text, je.line,
			   je.column);
	if (!json_is_object(r->root))
		return BAD(e, NULL, "the body must be a JSON object");
	int rc = parse_common(r, r->root, e);
	if (!rc && !chat)
		rc = get_bool(r->root, "echo", &r->echo, e);
	if (!rc)
		rc = chat ? parse_messages(r, r->root, e) : parse_prompt(r, r->root, e);
	if (rc == -ENOMEM)
		kvh_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
	return rc;
}

void kvh_req_free(struct kvh_req *r)
{
	free(r->text);
	free(r->system);
	free(r->ids);
	for (size_t i = 0; i < r->n_msgs; i++)
		free((char *)r->msgs[i].text);
	free(r->msgs);
	json_decref(r->root);
	memset(r, 0, sizeof(*r));
}

/* ---- responses ---- */

json_t *kvh_err_json(const struct kvh_err *e)
{
	return json_pack("{s:{s:s,s:s,s:s?,s:s?}}", "error", "message", e->msg, "type", e->type, "param",
			 e->param, "code", e->code);
}

json_t *kvh_usage(const struct kvh_gen *g)
{
	uint32_t done = 0;
	for (uint32_t i = 0; i < g->req->n; i++)
		done += g->ch[i].tokens;
	json_t *u = json_pack("{s:I,s:I,s:I,s:{s:I}}", "prompt_tokens", (json_int_t)g->prompt_tokens,
			      "completion_tokens", (json_int_t)done, "total_tokens",
			      (json_int_t)(g->prompt_tokens + done), "prompt_tokens_details",
			      "cached_tokens", (json_int_t)g->cached);
	return u;
}

static json_t *head(const struct kvh_gen *g, const char *object)
{
	return json_pack("{s:s,s:s,s:I,s:s}", "id", g->id, "object", object, "created",
			 (json_int_t)g->created, "model", g->model);
}

static json_t *text_of(const char *s, size_t len)
{
	return json_stringn_nocheck(s ? s : "", s ? len : 0);
}

json_t *kvh_resp_full(const struct kvh_gen *g)
{
	const struct kvh_req *r = g->req;
	json_t *o = head(g, r->chat ? "chat.completion" : "text_completion");
	json_t *cs = json_array();
	for (uint32_t i = 0; i < r->n; i++) {
		const struct kvh_choice *c = &g->ch[i];
		json_t *ch;
		if (r->chat) {
			ch = json_pack("{s:I,s:{s:s,s:o},s:s,s:o}", "index", (json_int_t)i, "message", "role",
				       "assistant", "content", text_of(c->text, c->len), "finish_reason",
				       c->finish ? c->finish : "stop", "logprobs",
				       kvh_logprobs_json(g, i, 0, c->lp ? json_array_size(c->lp) : 0));
		} else {
			json_t *t = text_of(c->text, c->len);
			if (r->echo && r->text) {
				char *s = malloc(r->text_len + c->len + 1);
				if (s) {
					memcpy(s, r->text, r->text_len);
					memcpy(s + r->text_len, c->text ? c->text : "", c->len);
					json_decref(t);
					t = json_stringn_nocheck(s, r->text_len + c->len);
					free(s);
				}
			}
			ch = json_pack("{s:I,s:o,s:s,s:o}", "index", (json_int_t)i, "text", t, "finish_reason",
				       c->finish ? c->finish : "stop", "logprobs",
				       kvh_logprobs_json(g, i, 0, c->lp ? json_array_size(c->lp) : 0));
		}
		json_array_append_new(cs, ch);
	}
	json_object_set_new(o, "choices", cs);
	json_object_set_new(o, "usage", kvh_usage(g));
	return o;
}

/* One stream chunk: text s of choice i, or its finish reason; role on a chat stream's first. */
json_t *kvh_resp_chunk(const struct kvh_gen *g, uint32_t i, const char *s, size_t len,
		       const char *finish, int role)
{
	const struct kvh_req *r = g->req;
	json_t *o = head(g, r->chat ? "chat.completion.chunk" : "text_completion");
	json_t *ch;
	if (r->chat) {
		json_t *d = json_object();
		if (role)
			json_object_set_new(d, "role", json_string("assistant"));
		if (s)
			json_object_set_new(d, "content", text_of(s, len));
		ch = json_pack("{s:I,s:o}", "index", (json_int_t)i, "delta", d);
	} else {
		ch = json_pack("{s:I,s:o}", "index", (json_int_t)i, "text", text_of(s, len));
	}
	/* The entries of the tokens taken since the last chunk. */
	struct kvh_choice *c = (struct kvh_choice *)&g->ch[i];
	size_t to = c->lp ? json_array_size(c->lp) : 0;
	json_object_set_new(ch, "logprobs", kvh_logprobs_json(g, i, c->lp_sent, to));
	c->lp_sent = to;
	json_object_set_new(ch, "finish_reason", finish ? json_string(finish) : json_null());
	json_object_set_new(o, "choices", json_pack("[o]", ch));
	if (r->include_usage)
		json_object_set_new(o, "usage", json_null());
	return o;
}

json_t *kvh_resp_usage_chunk(const struct kvh_gen *g)
{
	json_t *o = head(g, g->req->chat ? "chat.completion.chunk" : "text_completion");
	json_object_set_new(o, "choices", json_array());
	json_object_set_new(o, "usage", kvh_usage(g));
	return o;
}

json_t *kvh_logprobs_json(const struct kvh_gen *g, uint32_t i, size_t from, size_t to)
{
	const struct kvh_choice *c = &g->ch[i];
	if (!g->req->logprobs || !c->lp)
		return json_null();
	if (g->req->chat) {
		json_t *a = json_array();
		for (size_t k = from; k < to; k++)
			json_array_append(a, json_array_get(c->lp, k));
		return json_pack("{s:o}", "content", a);
	}
	json_t *toks = json_array(), *lps = json_array(), *tops = json_array();
	for (size_t k = from; k < to; k++) {
		json_t *en = json_array_get(c->lp, k), *alt = json_object(), *t;
		size_t j;
		json_array_append(toks, json_object_get(en, "token"));
		json_array_append(lps, json_object_get(en, "logprob"));
		json_array_foreach(json_object_get(en, "top_logprobs"), j, t)
			json_object_set(alt, json_string_value(json_object_get(t, "token")), json_object_get(t, "logprob"));
		json_array_append_new(tops, alt);
	}
	return json_pack("{s:o,s:o,s:o}", "tokens", toks, "token_logprobs", lps, "top_logprobs", tops);
}
