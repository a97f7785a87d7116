/* kvtext.c — libkvclient's conveniences: kvd's errno meanings, streamed UTF-8, message lists, text in and out. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include "shm/kvclient.h"
#include "shm/kvclient_priv.h"

#define KVC_TEXT_SLICE_MS 200	/* how often a blocked kvc_generate_text() looks at o->cancel */
#define KVC_TEXT_UD 1		/* user_data when the caller picks none */

const char *kvc_strerror(int err)
{
	switch (err < 0 ? -err : err) {
	case 0:		return "success";
	case EINVAL:	return "malformed request: bad opcode, flag, size or reserved field "
			       "(or a flag this daemon does not serve)";
	case EPROTO:	return "the daemon speaks another ABI version, or broke the protocol";
	case EMSGSIZE:	return "a control message longer than the daemon takes";
	case EFAULT:	return "an offset and length that do not lie inside the shared arena";
	case ERANGE:	return "a token id outside the model's vocabulary";
	case E2BIG:	return "prompt plus max_tokens exceed the context length or the "
			       "per-request limit";
	case ENOENT:	return "no such session or sequence slot (connecting: no socket at that path)";
	case EBUSY:	return "too many requests in flight for this connection or uid";
	case ENOSPC:	return "the KV-cache pool cannot hold the request (or the shared arena is full)";
	case EDQUOT:	return "the uid is over a quota (KV cache or shared-region bytes)";
	case EMFILE:	return "too many sessions or connections for this uid, or the daemon is out "
			       "of file descriptors";
	case ESHUTDOWN:	return "kvd is shutting down and takes no new work";
	case ECANCELED:	return "the request was cancelled";
	case ERESTART:	return "the daemon restarted with the request in flight; it was not applied: "
			       "resubmit it";
	case ESTALE:	return "the daemon holds no such session (closed, expired, or its KV was lost)";
	case EIO:	return "the daemon's compute backend failed (the daemon stays up)";
	case ECONNRESET:
	case EPIPE:	return "the daemon went away";
	case ECONNREFUSED: return "nothing listens on the socket: kvd is not running";
	case ETIMEDOUT:	return "the daemon did not answer in time";
	case EOPNOTSUPP: return "the daemon did not grant the feature this needs";
	case ENOTCONN:	return "no session is open on this connection yet";
	case EAGAIN:	return "the ring is full, or no completion is ready: try again";
	default:	return strerror(err < 0 ? -err : err);
	}
}

/* The features o asks for that the daemon must have granted. */
static uint32_t needed_features(const struct kvc_text_opts *o)
{
	uint32_t f = KVD_FEAT_TEXT;
	if (o->system_len)
		f |= KVD_FEAT_SYSTEM;
	if (o->flags & (KVD_SQE_PLAIN | KVD_SQE_SPECIAL))
		f |= KVD_FEAT_PLAIN_TEXT;
	if (o->flags & KVD_SQE_PROGRESS)
		f |= KVD_FEAT_PROGRESS;
	return f;
}

/* Copy text, system and the output room into the arena and fill *sqe; 0 or -errno. */
static int text_prep(struct kvc_conn *c, uint32_t session, uint32_t slot, const char *text,
		     size_t len, const struct kvc_text_opts *o, struct kvd_sqe *sqe)
{
	uint32_t in_off, sys_off = 0, out_off = 0;
	uint8_t *arena = kvc_arena(c, NULL);
	uint64_t ud = o->user_data ? o->user_data : KVC_TEXT_UD;
	int err;

	if (len == 0 || len > UINT32_MAX || o->system_len > UINT32_MAX ||
	    (o->system_len && !o->chat) || o->max_tokens > UINT32_MAX / 4)
		return -EINVAL;
	if ((err = kvc_arena_alloc(c, (uint32_t)len, &in_off)) ||
	    (o->system_len && (err = kvc_arena_alloc(c, (uint32_t)o->system_len, &sys_off))) ||
	    (o->max_tokens && (err = kvc_arena_alloc(c, o->max_tokens * 4, &out_off))))
		return err;
	memcpy(arena + in_off, text, len);
	if (o->system_len)
		memcpy(arena + sys_off, o->system, o->system_len);
	if (o->max_tokens)
		kvc_prep_generate(sqe, session, slot, ud, in_off, (uint32_t)len, out_off,
				  o->max_tokens);
	else
		kvc_prep_prefill(sqe, session, slot, ud, in_off, (uint32_t)len);
	sqe->flags = o->flags | KVD_SQE_TEXT | (o->chat ? KVD_SQE_CHAT : 0) |
		     (o->max_tokens ? KVD_SQE_STREAM : 0);
	sqe->priority = o->priority;
	sqe->system_off = sys_off;
	sqe->system_len = (uint32_t)o->system_len;
	return o->sampling ? kvc_prep_sampling(sqe, o->sampling) : 0;
}

struct text_run {
	struct kvc_conn		*c;
	const uint32_t		*out;		/* (max_tokens,) in the arena */
	uint32_t		max_tokens;
	uint32_t		done;		/* tokens passed to fn */
	struct kvc_utf8		u;
	kvc_text_fn		fn;
	void			*user;
	int			stop;		/* fn asked to cancel */
	int			cancel_sent;	/* our CANCEL is in the SQ: its CQE will come */
	int			cancel_done;	/* and we took it */
	int			over;		/* the request's final CQE was taken */
	int			res;		/* its res */
	struct kvc_text_result	fin;		/* its flags and aux */
};

/* Pass the tokens out[done, upto) to fn, whole characters only. */
static void text_emit(struct text_run *r, uint32_t upto)
{
	char buf[256 + 3];
	if (upto > r->max_tokens)
		upto = r->max_tokens;
	for (; r->done < upto; r->done++) {
		uint32_t len;
		const char *s = kvc_token_bytes(r->c, r->out[r->done], &len);
		while (s && len) {
			uint32_t k = len < 256 ? len : 256;
			size_t n = kvc_utf8_feed(&r->u, s, k, buf);
			if (n && r->fn && !r->stop && r->fn(r->user, buf, n))
				r->stop = 1;
			s += k;
			len -= k;
		}
	}
}

/* Cancel the request once; 0, or -errno of the submit (-EAGAIN: try again later). */
static int text_cancel(struct text_run *r, const struct kvd_sqe *q)
{
	struct kvd_sqe cq;
	if (r->cancel_sent)
		return 0;
	kvc_prep_cancel(&cq, q->session_id, q->user_data + 1, q->user_data);
	int err = kvc_submit(r->c, &cq);
	r->cancel_sent = !err;
	return err == -EAGAIN ? 0 : err;
}

/* One CQE of ours: tokens to fn, progress to o->progress; the final one ends the request. */
static void text_cqe(struct text_run *r, const struct kvd_cqe *e, const struct kvc_text_opts *o)
{
	if (e->flags & KVD_CQE_PROGRESS) {
		if (o->progress)
			o->progress(r->user, (uint32_t)(e->res > 0 ? e->res : 0), e->aux);
		return;
	}
	if (e->res >= 0 && r->max_tokens)
		text_emit(r, (e->flags & KVD_CQE_MORE) ? e->n_out : (uint32_t)e->res);
	if (e->flags & KVD_CQE_MORE)
		return;
	r->over = 1;
	r->res = e->res;
	r->fin.flags = e->flags;
	r->fin.aux = e->aux;
}

/*
 * Take CQEs until the request's final one and, once a CANCEL went out,
 * the CANCEL's own too: left in the CQ, it would pass for the final CQE
 * of a later call whose user_data is this one's + 1. Returns 0 (r->res
 * is the request's), or -errno of the connection.
 */
static int text_loop(struct text_run *r, const struct kvd_sqe *q, const struct kvc_text_opts *o)
{
	for (;;) {
		struct kvd_cqe e;
		int err;
		if (r->over && (!r->cancel_sent || r->cancel_done))
			return 0;
		if (!r->over && (r->stop || (o->cancel && *o->cancel)) && (err = text_cancel(r, q)))
			return err;
		err = kvc_wait(r->c, &e, KVC_TEXT_SLICE_MS);
		if (err == -ETIMEDOUT || err == -EINTR)
			continue;
		if (err)
			return err;
		if (r->cancel_sent && e.user_data == q->user_data + 1)
			r->cancel_done = 1;
		else if (e.user_data == q->user_data && !r->over)
			text_cqe(r, &e, o);
		/* else another request's: dropped */
	}
}

/* Whether the daemon is gone from c, so nothing writes into its arena any more. */
static int conn_dead(int err)
{
	return err == -ECONNRESET || err == -EPIPE;
}

int kvc_generate_text(struct kvc_conn *c, uint32_t session, uint32_t slot, const char *text,
		      size_t len, const struct kvc_text_opts *o, kvc_text_fn fn, void *user,
		      struct kvc_text_result *out)
{
	static const struct kvc_text_opts none;
	struct kvd_sqe sqe;
	uint32_t mark;

	if (!o)
		o = &none;
	uint32_t need = needed_features(o);
	if ((kvc_info(c)->features & need) != need)
		return -EOPNOTSUPP;
	if (!kvc_arena(c, NULL))
		return -ENOTCONN;
	/* The arena holds this call's parts only while it runs: take them off the top. */
	if (kvc_arena_alloc(c, 0, &mark))
		return -ENOSPC;
	int rc = text_prep(c, session, slot, text, len, o, &sqe);
	if (!rc)
		rc = kvc_submit(c, &sqe);
	if (rc) {
		kvc__arena_release(c, mark);	/* nothing was sent */
		return rc;
	}
	struct text_run r = {
		.c = c, .out = (const uint32_t *)(kvc_arena(c, NULL) + sqe.out_off),
		.max_tokens = o->max_tokens, .fn = fn, .user = user,
	};
	rc = text_loop(&r, &sqe, o);
	char tail[3];
	size_t n = kvc_utf8_flush(&r.u, tail);
	if (n && fn && !r.stop)
		fn(user, tail, n);
	if (!rc && out)
		*out = r.fin;
	/* A request that may still run writes into its output room: keep it. */
	if (r.over || conn_dead(rc))
		kvc__arena_release(c, mark);
	return rc ? rc : r.res;
}

/* Bytes of the UTF-8 sequence lead byte b starts; 1 for ASCII and invalid leads. */
static size_t utf8_seq_len(uint8_t b)
{
	if (b >= 0xf0 && b < 0xf8)
		return 4;
	if (b >= 0xe0)
		return b < 0xf0 ? 3 : 1;
	return b >= 0xc0 ? 2 : 1;
}

size_t kvc_utf8_feed(struct kvc_utf8 *u, const char *in, size_t len, char *out)
{
	size_t n = u->n;
	memcpy(out, u->held, n);
	memcpy(out + n, in, len);
	n += len;
	u->n = 0;

	/* Find the last lead byte among the final four; hold its sequence if short. */
	size_t i = n, k = 0;
	while (i > 0 && k < 3 && ((uint8_t)out[i - 1] & 0xc0) == 0x80) {
		i--;
		k++;
	}
	if (i > 0) {
		size_t lead = i - 1, have = n - lead;
		if (have < utf8_seq_len((uint8_t)out[lead])) {
			u->n = (uint8_t)have;
			memcpy(u->held, out + lead, have);
			n = lead;
		}
	}
	return n;
}

size_t kvc_utf8_flush(struct kvc_utf8 *u, char *out)
{
	size_t n = u->n;
	memcpy(out, u->held, n);
	u->n = 0;
	return n;
}

int kvc_messages_encode(const struct kvc_message *msgs, size_t n, void *out, size_t cap)
{
	uint64_t total = 0;

	if (!n || n > KVD_CHAT_MAX_MSGS || !msgs)
		return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		if (msgs[i].role < KVD_ROLE_SYSTEM || msgs[i].role >= KVD_ROLE_LAST ||
		    (!msgs[i].text && msgs[i].len))
			return -EINVAL;
		if (msgs[i].len > UINT32_MAX)
			return -E2BIG;
		total += sizeof(struct kvd_chat_msg) + msgs[i].len;
		if (total > INT_MAX)
			return -E2BIG;
	}
	if (!out || total > cap)
		return (int)total;
	uint8_t *w = out;
	for (size_t i = 0; i < n; i++) {
		struct kvd_chat_msg h = { .role = msgs[i].role, .len = (uint32_t)msgs[i].len };

		memcpy(w, &h, sizeof(h));
		w += sizeof(h);
		if (msgs[i].len)
			memcpy(w, msgs[i].text, msgs[i].len);
		w += msgs[i].len;
	}
	return (int)total;
}
