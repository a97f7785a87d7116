/* turn.c — kvctl's streamed turn: one text request submitted, its tokens printed as they come. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include "shm/kvclient.h"
#include "tools/common.h"
#include "tools/turn.h"

#define WAIT_MS		200	/* kvc_wait() slices, so a SIGINT that misses poll() is seen */
#define PROGRESS_AFTER_S 1.0	/* a prefill shows its progress once it takes longer */


struct printer {
	struct kvc_conn	*c;
	int		raw;
	int		quiet;		/* --json: print at the end instead */
	int		warned;
	int		progress;	/* a progress line is on stderr: erase it before output */
	struct kvc_utf8	u;
};

/* Take the progress line off the terminal, so the text starts on a clean line. */
static void progress_erase(struct printer *pr)
{
	if (pr->progress)
		fputs("\r\033[K", stderr);
	pr->progress = 0;
}

/* A progress CQE: once the prefill has run a second, redraw its line in place. */
static void progress_show(struct printer *pr, const struct kvd_cqe *cqe, const struct turn *t)
{
	if (tool_now_s() - t->t_submit < PROGRESS_AFTER_S)
		return;
	fprintf(stderr, "\rprefill %d/%u positions", cqe->res, cqe->aux);
	fflush(stderr);
	pr->progress = 1;
}

static void print_token(struct printer *pr, uint32_t id)
{
	if (pr->quiet)
		return;
	progress_erase(pr);
	if (pr->raw) {
		printf("%" PRIu32 " ", id);
		return;
	}
	uint32_t len;
	const char *s = kvc_token_bytes(pr->c, id, &len);
	if (!s) {
		printf("<%" PRIu32 ">", id);
		return;
	}
	char buf[256 + 3];
	while (len) {
		uint32_t k = len < 256 ? len : 256;
		fwrite(buf, 1, kvc_utf8_feed(&pr->u, s, k, buf), stdout);
		s += k;
		len -= k;
	}
}

const char *stop_name(uint32_t flags)
{
	if (flags & KVD_CQE_SHUTDOWN)
		return "shutdown";
	if (flags & KVD_CQE_CANCELLED)
		return "cancelled";
	if (flags & KVD_CQE_EOS)
		return "eos";
	if (flags & KVD_CQE_LENGTH)
		return "length";
	return "none";
}

/* The final CQE of the turn into t. Returns 1. */
static int turn_end(const struct kvd_cqe *cqe, uint32_t n, struct turn *t)
{
	t->res = cqe->res;
	t->n = n;
	t->flags = cqe->flags;
	t->aux = cqe->aux;
	t->t_end = tool_now_s();
	return 1;
}

/*
 * One CQE of a streaming turn: print the tokens it brings (out: the output
 * buffer in the arena, *printed: how many are out already). Returns 1 when
 * the turn is over (t filled in), 0 while it goes on.
 */
static int turn_cqe(const struct kvd_cqe *cqe, const uint32_t *out, uint32_t *printed,
		    struct printer *pr, const struct kvctl_opts *o, struct turn *t)
{
	if (cqe->flags & KVD_CQE_PROGRESS) {
		if (cqe->flags & KVD_CQE_MORE)
			progress_show(pr, cqe, t);
		return 0;
	}
	if (cqe->res < 0 || o->max_tokens == 0)	/* an error, or a prefill's one CQE */
		return turn_end(cqe, cqe->res < 0 ? 0 : (uint32_t)cqe->res, t);
	int more = cqe->flags & KVD_CQE_MORE;
	uint32_t upto = more ? cqe->n_out : (uint32_t)cqe->res;
	if (upto > o->max_tokens) {
		fprintf(stderr, "kvctl: protocol: CQE says %u tokens, asked for %u\n", upto,
			o->max_tokens);
		upto = o->max_tokens;
	}
	if (more && upto && cqe->token != out[upto - 1] && !pr->warned++)
		fprintf(stderr, "kvctl: protocol: CQE token %u but arena[%u] = %u\n", cqe->token,
			upto - 1, out[upto - 1]);
	if (upto > *printed && !t->t_first)
		t->t_first = tool_now_s();
	for (; *printed < upto; (*printed)++)
		print_token(pr, out[*printed]);
	if (!more)
		return turn_end(cqe, upto, t);
	t->t_last = tool_now_s();
	return 0;
}

/*
 * The SQE of one turn, its text (and system message) copied into the
 * arena: a GENERATE streaming o->max_tokens, or a PREFILL for -n 0.
 * Returns 0 or -EMSGSIZE when they do not fit the arena.
 */
static int turn_prep(struct kvc_conn *c, uint32_t session, uint64_t ud, const char *text,
		     size_t len, const char *system, uint16_t flags, const struct kvctl_opts *o,
		     struct kvd_sqe *sqe, struct turn *t)
{
	uint8_t *arena = kvc_arena(c, NULL);
	size_t sys_len = system ? strlen(system) : 0;
	uint32_t in_off, sys_off = 0;

	kvc_arena_reset(c);
	if (len > UINT32_MAX || sys_len > UINT32_MAX || kvc_arena_alloc(c, (uint32_t)len, &in_off) ||
	    (sys_len && kvc_arena_alloc(c, (uint32_t)sys_len, &sys_off)) ||
	    (o->max_tokens && kvc_arena_alloc(c, o->max_tokens * 4, &t->out_off)))
		return -EMSGSIZE;
	memcpy(arena + in_off, text, len);
	memcpy(arena + sys_off, system ? system : "", sys_len);
	if (o->max_tokens) {
		kvc_prep_generate(sqe, session, SLOT, ud, in_off, (uint32_t)len, t->out_off,
				  o->max_tokens);
		flags |= KVD_SQE_STREAM;
	} else {
		kvc_prep_prefill(sqe, session, SLOT, ud, in_off, (uint32_t)len);
	}
	sqe->flags = flags;
	sqe->system_off = sys_off;
	sqe->system_len = (uint32_t)sys_len;
	kvc_prep_sampling(sqe, &o->sp);	/* ranges were checked while parsing */
	return 0;
}

/*
 * The next CQE: kvc_wait() spins up to o->poll_us (--poll; else the
 * library's short default) after the last completion, then sleeps on the
 * doorbell, so a client never holds a core the daemon needs while nothing
 * comes. 0, -EAGAIN to look at the signal flag and come back, or -errno.
 */
static int next_cqe(struct kvc_conn *c, struct kvd_cqe *cqe)
{
	int err = kvc_wait(c, cqe, WAIT_MS);
	return err == -ETIMEDOUT || err == -EINTR ? -EAGAIN : err;
}

/*
 * Put text in the arena, submit one turn (flags | STREAM) as user_data ud
 * and print its tokens as they come; a SIGINT sends CANCEL (as ud + 1).
 * The request's own failure lands in t->res; returns 0 or -errno when the
 * connection itself fails.
 */
int run_turn(struct kvc_conn *c, uint32_t session, uint64_t ud, const char *text,
		    size_t len, const char *system, uint16_t flags, const struct kvctl_opts *o,
		    struct turn *t)
{
	struct printer pr = { .c = c, .raw = o->raw, .quiet = o->json };
	struct kvd_sqe sqe;
	struct kvd_cqe cqe;
	int cancel_sent = 0, err;

	memset(t, 0, sizeof(*t));
	if (turn_prep(c, session, ud, text, len, system, flags, o, &sqe, t)) {
		t->res = -EMSGSIZE;
		return 0;
	}
	const uint32_t *out = (const uint32_t *)(kvc_arena(c, NULL) + t->out_off);
	t->t_submit = tool_now_s();
	err = kvc_submit(c, &sqe);
	if (err)
		return err;

	uint32_t printed = 0;
	for (;;) {
		if (tool_interrupted && !cancel_sent) {
			kvc_prep_cancel(&sqe, session, ud + 1, ud);
			err = kvc_submit(c, &sqe);
			if (err && err != -EAGAIN)
				return err;
			cancel_sent = !err;
		}
		err = next_cqe(c, &cqe);
		if (err == -EAGAIN)
			continue;
		if (err)
			break;
		do {
			/* Others are our CANCEL's, or an earlier turn's. */
			if (cqe.user_data == ud && turn_cqe(&cqe, out, &printed, &pr, o, t))
				goto done;
		} while (kvc_peek(c, &cqe) == 0);
		fflush(stdout);
	}
done:
	t->shown = printed;
	progress_erase(&pr);
	/* A character the stream ended inside of stays unprinted. */
	if (!pr.quiet)
		fflush(stdout);
	if (t->n && t->t_last < t->t_first)
		t->t_last = t->t_end;
	return err;
}

/* Decode speed: tokens after the first over the time they took. */
double turn_rate(const struct turn *t)
{
	if (t->n >= 2 && t->t_last > t->t_first)
		return (t->n - 1) / (t->t_last - t->t_first);
	return t->t_end > t->t_submit ? t->n / (t->t_end - t->t_submit) : 0;
}

/* Whether the daemon's shutdown, not the user or the request, ended the turn. */
int turn_shutdown(const struct turn *t)
{
	return t->res == -ESHUTDOWN || (t->res >= 0 && (t->flags & KVD_CQE_SHUTDOWN));
}

/*
 * -E2BIG in kvd's terms (uapi/kvd.h, cqe.aux): aux > ctx_len says the
 * context was exceeded, else the per-request limit (HELLO max_tokens). A
 * text prompt refused before it was tokenized has only a lower bound in
 * aux, and kvctl cannot tell that case apart: "at least" stays true of both.
 */
static void report_e2big(const struct kvd_hello_rep *h, const struct turn *t, uint32_t n)
{
	int ctx = t->aux > h->ctx_len || !h->max_tokens;
	const char *what = ctx ? "the context" : "the per-request limit";
	uint32_t lim = ctx ? h->ctx_len : h->max_tokens;
	if (!t->aux)	/* a daemon that does not say */
		fprintf(stderr, "kvctl: the prompt plus %u to generate exceed the context (%u) "
			"or the per-request limit (%u)\n", n, h->ctx_len, h->max_tokens);
	else if (t->aux > n)
		fprintf(stderr, "kvctl: prompt (at least %u positions) plus %u to generate exceed "
			"%s (%u)\n", t->aux - n, n, what, lim);
	else
		fprintf(stderr, "kvctl: the prompt plus %u to generate exceed %s (%u)\n", n, what,
			lim);
}

/* The request's failure as one line, in kvd's terms. */
void report_error(struct kvc_conn *c, const struct turn *t, const struct kvctl_opts *o)
{
	if (t->res == -E2BIG)
		report_e2big(kvc_info(c), t, o->max_tokens);
	else if (t->res == -EMSGSIZE)
		fprintf(stderr, "kvctl: the prompt plus -n %u do not fit the shared arena\n",
			o->max_tokens);
	else if (t->res == -ESHUTDOWN)
		fprintf(stderr, "kvctl: kvd is shutting down\n");
	else
		fprintf(stderr, "kvctl: request failed: %s\n", kvc_strerror(t->res));
}
