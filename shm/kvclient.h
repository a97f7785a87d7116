/* kvclient.h — libkvclient, the client side of kvd's ABI. */
#ifndef KVD_KVCLIENT_H
#define KVD_KVCLIENT_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "uapi/kvd.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Every call returns 0 or a count on success and -errno on failure; the
 * daemon's own errors (uapi/kvd.h, "Conventions") come back unchanged.
 * A peer hang-up reads as -ECONNRESET (-EPIPE when it is noticed by a send).
 *
 * Use a struct kvc_conn from one thread at a time, with one exception:
 * one thread may submit (kvc_submit, the arena allocator) while another
 * consumes (kvc_peek, kvc_wait). A lock inside keeps the two apart where
 * they meet (the record of requests in flight, a reconnect that either
 * side may run; see "Surviving a daemon restart").
 */
struct kvc_conn;

/* The ABI version this library speaks (KVD_ABI_VERSION of its uapi/kvd.h). */
uint32_t kvc_abi_version(void);

/*
 * Fill a control-message header for a request of the given type and total
 * length; the caller zeroes the rest of the message first.
 */
void kvc_msg_init(struct kvd_msg_hdr *h, uint16_t type, uint32_t len, uint32_t seq);

/*
 * Check a reply received for request seq of the given type and minimum
 * length: magic, reply flag, type, length and status. Returns the reply's
 * status (0 or -errno) or -EPROTO if the reply itself is malformed.
 */
int kvc_msg_check_reply(const struct kvd_msg_hdr *h, size_t got, uint16_t type,
			uint32_t min_len, uint32_t seq);

/* ---------------------------------------------------------------------- */
/* Connection.                                                            */

/*
 * The socket kvc_connect(NULL) uses, NUL-terminated into buf: $KVD_SOCKET,
 * else /run/kvd/kvd.sock for root, else $XDG_RUNTIME_DIR/kvd.sock (or
 * /run/user/<uid>/kvd.sock). Returns its length or -ENAMETOOLONG.
 */
int kvc_default_socket(char *buf, size_t cap);

/*
 * Connect to the daemon at path (NULL: kvc_default_socket()) and say HELLO
 * asking for every feature this library knows; map the vocabulary when the
 * daemon passes it. On success *out owns the socket and mappings; free it
 * with kvc_close(). Returns 0, -errno of socket()/connect() (-ENOENT or
 * -ECONNREFUSED when no daemon listens), -EPROTO for a daemon speaking
 * another ABI, or the daemon's refusal (-EMFILE: its uid holds too many
 * connections). Every control round trip, this HELLO included, waits at
 * most $KVD_CTRL_TIMEOUT_MS (30000 by default) for its reply: -ETIMEDOUT.
 * $KVD_RECONNECT_MS, a positive number, turns reconnecting on for that
 * long (kvc_set_reconnect()).
 */
int kvc_connect(struct kvc_conn **out, const char *path);

/* Unmap, close and free everything of c (the daemon then ends its sessions). NULL is fine. */
void kvc_close(struct kvc_conn *c);

/*
 * The daemon's HELLO reply: features granted, model facts and limits.
 * Owned by c; valid until kvc_close(). model_name and backend are
 * NUL-terminated.
 */
const struct kvd_hello_rep *kvc_info(const struct kvc_conn *c);

/*
 * File descriptors for callers running their own event loop: the socket
 * (readable or hung up only when the daemon goes away) and the call doorbell
 * (readable when completions arrive, once kvc_arm() asked for it; -1 before
 * the first session). See kvc_arm() for the loop. A reconnect keeps their
 * numbers (the new connection's fds are dup'ed onto them): poll() needs
 * nothing, an epoll set must have them added again.
 */
int kvc_socket_fd(const struct kvc_conn *c);
int kvc_call_fd(const struct kvc_conn *c);

/* ---------------------------------------------------------------------- */
/* Sessions and the shared region.                                        */

/*
 * Open a session with the daemon's default ring and arena sizes; its id
 * goes to *session_id. The first open of a connection maps the shared
 * region (rings and token arena) that all its sessions then share.
 * Returns 0 or -errno (-EMFILE: too many sessions).
 */
int kvc_session_open(struct kvc_conn *c, uint32_t *session_id);

/*
 * Same, asking for ring and arena sizes (0 = daemon default; powers of two,
 * arena a multiple of 4). Sizes matter only on the connection's first open.
 * After a reconnect that could reopen no session (the daemon lost them),
 * the next open is the new connection's first: a 0 size asks the old
 * region's again, so the new one takes the old one's address and
 * kvc_arena() stays what it was.
 */
int kvc_session_open_ex(struct kvc_conn *c, uint32_t sq_entries, uint32_t cq_entries,
			uint32_t arena_bytes, uint32_t *session_id);

/*
 * Close a session: the daemon cancels its requests and frees its
 * sequences. A reconnect no longer reopens it, whatever the return.
 */
int kvc_session_close(struct kvc_conn *c, uint32_t session_id);

/* Daemon-wide counters into *out. */
int kvc_stats(struct kvc_conn *c, struct kvd_stats_rep *out);

/*
 * The token arena, shared with the daemon (NULL before the first session);
 * its size goes to *bytes unless bytes is NULL. SQEs name places in it by
 * byte offset: write prompt ids (or text) there and read sampled ids in
 * place. Owned by c.
 */
uint8_t *kvc_arena(const struct kvc_conn *c, uint32_t *bytes);

/*
 * A bump allocator over the arena for callers that need no more: reserve
 * bytes (rounded up to 64) and put their offset in *off. Returns 0,
 * -ENOSPC when the arena is full, -ENOTCONN before the first session.
 * kvc_arena_reset() frees every reservation at once; call it only when no
 * request still uses the arena.
 */
int kvc_arena_alloc(struct kvc_conn *c, uint32_t bytes, uint32_t *off);
void kvc_arena_reset(struct kvc_conn *c);

/* ---------------------------------------------------------------------- */
/* Submission and completion.                                             */

/*
 * Copy *sqe into the next SQ slot, publish it, and kick the daemon only if
 * it sleeps. The daemon validates the copy; a bad SQE completes with
 * res -errno. Returns 0, -EAGAIN when the SQ is full (consume completions
 * and retry), -ENOTCONN before the first session (or after a reconnect
 * that reopened none), -ENOMEM, -EPIPE when the kick found the daemon gone
 * (the SQE was not sent). With reconnecting on, that kick reconnects
 * first: the SQE goes to the new daemon, or gets its final CQE from the
 * reconnect (-EPIPE only when reconnecting fails).
 */
int kvc_submit(struct kvc_conn *c, const struct kvd_sqe *sqe);

/*
 * Take the next completion into *out without blocking: 0, or -EAGAIN when
 * none is ready. With reconnecting on, it also looks whether the daemon
 * hung up (at most once a millisecond) and reconnects then, which blocks
 * for up to the reconnect time: -ECONNRESET when that fails, -EINTR.
 */
int kvc_peek(struct kvc_conn *c, struct kvd_cqe *out);

/*
 * Take the next completion into *out, waiting up to timeout_ms (< 0:
 * forever). Spins on the CQ for the spin time first (kvc_set_spin), then
 * sleeps on the call doorbell. Returns 0, -ETIMEDOUT, -EINTR when a signal
 * interrupted the sleep (call again), -ECONNRESET when the daemon went away
 * (with reconnecting on: and could not be reached again in time; the
 * reconnect's time does not count against timeout_ms).
 */
int kvc_wait(struct kvc_conn *c, struct kvd_cqe *out, int timeout_ms);

/*
 * How long kvc_wait() spins on the CQ before it sleeps, counted from the
 * call (default 50 us; 0: never spin). A caller that consumes a stream of
 * completions and waits again at once gets the io_uring SQPOLL idle rule:
 * busy-poll while completions keep coming within usec of each other, sleep
 * on the doorbell as soon as a window passes with none. Never spinning
 * without bound is what keeps a client from starving the daemon of a core.
 */
void kvc_set_spin(struct kvc_conn *c, unsigned int usec);

/*
 * For an external event loop: ask the daemon to ring the call doorbell
 * (set KVD_RING_NEED_WAKEUP on the CQ), then look at the CQ once more.
 * Returns 1 when a completion is already there (the flag is cleared again:
 * take it with kvc_peek() and do not sleep), 0 when armed (sleep until
 * kvc_call_fd() or kvc_socket_fd() is readable), -ENOTCONN before the first
 * session. After waking, call kvc_ack() before peeking:
 *
 *	for (;;) {
 *		while (kvc_peek(c, &cqe) == 0)
 *			handle(&cqe);
 *		if (kvc_arm(c) == 1)
 *			continue;
 *		poll({ kvc_call_fd(c), POLLIN }, { kvc_socket_fd(c), POLLIN }, ...);
 *		kvc_ack(c);
 *	}
 *
 * Without the arm the daemon rings nobody, and the fd never becomes readable.
 */
int kvc_arm(struct kvc_conn *c);

/*
 * After a wake-up: clear KVD_RING_NEED_WAKEUP and read every ring waiting
 * on the call doorbell (never blocking, whatever the fd's flags), so the
 * next poll() sleeps until a new one. Returns 0, or -ENOTCONN.
 */
int kvc_ack(struct kvc_conn *c);

/*
 * kvd's meaning of a -errno (a CQE's res, a call's return) as one short
 * static string, following uapi/kvd.h's "Conventions" ("prompt plus
 * max_tokens exceed the context length or the per-request limit" for
 * -E2BIG: cqe.aux > HELLO ctx_len says the context); strerror()'s text
 * for codes kvd gives no meaning of its own. A positive err is read as -err.
 */
const char *kvc_strerror(int err);

/*
 * SQE builders: each zeroes *sqe and fills one request; set flags
 * (KVD_SQE_STREAM, ...), priority or sampling afterwards.
 */
static inline void kvc_prep(struct kvd_sqe *sqe, uint8_t opcode, uint32_t session_id,
			    uint32_t slot, uint64_t user_data)
{
	memset(sqe, 0, sizeof(*sqe));
	sqe->opcode = opcode;
	sqe->session_id = session_id;
	sqe->slot = slot;
	sqe->user_data = user_data;
}

/* tokens_off: arena offset of n_tokens prompt ids (or bytes with KVD_SQE_TEXT);
 * out_off: arena offset with room for max_tokens sampled ids. */
static inline void kvc_prep_generate(struct kvd_sqe *sqe, uint32_t session_id, uint32_t slot,
				     uint64_t user_data, uint32_t tokens_off, uint32_t n_tokens,
				     uint32_t out_off, uint32_t max_tokens)
{
	kvc_prep(sqe, KVD_OP_GENERATE, session_id, slot, user_data);
	sqe->tokens_off = tokens_off;
	sqe->n_tokens = n_tokens;
	sqe->out_off = out_off;
	sqe->max_tokens = max_tokens;
}

static inline void kvc_prep_prefill(struct kvd_sqe *sqe, uint32_t session_id, uint32_t slot,
				    uint64_t user_data, uint32_t tokens_off, uint32_t n_tokens)
{
	kvc_prep(sqe, KVD_OP_PREFILL, session_id, slot, user_data);
	sqe->tokens_off = tokens_off;
	sqe->n_tokens = n_tokens;
}

static inline void kvc_prep_decode(struct kvd_sqe *sqe, uint32_t session_id, uint32_t slot,
				   uint64_t user_data, uint32_t out_off, uint32_t max_tokens)
{
	kvc_prep(sqe, KVD_OP_DECODE, session_id, slot, user_data);
	sqe->out_off = out_off;
	sqe->max_tokens = max_tokens;
}

/*
 * A whole conversation (KVD_FEAT_MESSAGES): msgs_len bytes of a message
 * list (kvc_messages_encode()) at arena offset msgs_off, rendered with the
 * model's chat template; add KVD_SQE_NO_GEN_PROMPT to leave out the
 * assistant's opening, KVD_SQE_APPEND for the next turns of slot's
 * conversation. max_tokens 0 makes it a PREFILL.
 */
static inline void kvc_prep_messages(struct kvd_sqe *sqe, uint32_t session_id, uint32_t slot,
				     uint64_t user_data, uint32_t msgs_off, uint32_t msgs_len,
				     uint32_t out_off, uint32_t max_tokens)
{
	if (max_tokens)
		kvc_prep_generate(sqe, session_id, slot, user_data, msgs_off, msgs_len, out_off,
				  max_tokens);
	else
		kvc_prep_prefill(sqe, session_id, slot, user_data, msgs_off, msgs_len);
	sqe->flags |= KVD_SQE_TEXT | KVD_SQE_CHAT | KVD_SQE_MESSAGES;
}

/*
 * Log-probabilities (KVD_FEAT_LOGPROBS) for a DECODE or GENERATE: for each
 * sampled token, 1 + top kvd_logprob records at arena offset off (4-aligned,
 * room for kvc_logprobs_bytes(max_tokens, top)): the token's own, then the
 * top (<= KVD_MAX_TOP_LOGPROBS) most likely. Raw distribution, before
 * temperature and penalties (uapi/kvd.h, "Log-probabilities").
 */
static inline void kvc_prep_logprobs(struct kvd_sqe *sqe, uint32_t off, uint8_t top)
{
	sqe->flags |= KVD_SQE_LOGPROBS;
	sqe->logprobs_off = off;
	sqe->top_logprobs = top;
}

static inline uint32_t kvc_logprobs_bytes(uint32_t max_tokens, uint32_t top)
{
	return max_tokens * (uint32_t)sizeof(struct kvd_logprob) * (1 + top);
}

/* The records of sampled token i (0-based) of the request sqe describes, in arena. */
static inline const struct kvd_logprob *kvc_logprobs_at(const uint8_t *arena, const struct kvd_sqe *sqe,
							 uint32_t i)
{
	return (const struct kvd_logprob *)(arena + sqe->logprobs_off) + (size_t)i * (1u + sqe->top_logprobs);
}

/* A record's log-probability as a float (the ABI carries its bits). */
static inline float kvc_logprob_value(const struct kvd_logprob *lp)
{
	float f;

	memcpy(&f, &lp->logprob, sizeof(f));
	return f;
}

/*
 * OpenAI's presence and frequency penalties (KVD_FEAT_PENALTIES), each in
 * [-2, 2], over the tokens the request generates: logit -= presence *
 * (count > 0) + frequency * count. Returns 0 or -EINVAL (out of range, NaN).
 */
static inline int kvc_prep_penalties(struct kvd_sqe *sqe, float presence, float frequency)
{
	if (!(presence >= -2.0f && presence <= 2.0f) || !(frequency >= -2.0f && frequency <= 2.0f))
		return -EINVAL;
	sqe->presence_milli = (__s16)(presence * 1000.0f + (presence < 0 ? -0.5f : 0.5f));
	sqe->frequency_milli = (__s16)(frequency * 1000.0f + (frequency < 0 ? -0.5f : 0.5f));
	return 0;
}

/* Cancel the request of this connection whose user_data is target. */
static inline void kvc_prep_cancel(struct kvd_sqe *sqe, uint32_t session_id, uint64_t user_data,
				   uint64_t target)
{
	kvc_prep(sqe, KVD_OP_CANCEL, session_id, 0, user_data);
	sqe->target_user_data = target;
}

static inline void kvc_prep_reset(struct kvd_sqe *sqe, uint32_t session_id, uint32_t slot,
				  uint64_t user_data)
{
	kvc_prep(sqe, KVD_OP_RESET, session_id, slot, user_data);
}

/* Sampling in natural units; all zero is greedy with every filter off. */
struct kvc_sampling {
	float		temperature;	/* 0: greedy; up to 65.535 */
	float		top_p;		/* 0 or 1: off */
	float		min_p;		/* 0: off */
	float		repeat_penalty;	/* 0 or 1: off; up to 65.535 */
	uint32_t	top_k;		/* 0: off; up to 65535 */
	uint32_t	repeat_last_n;	/* 0: 64 */
	uint64_t	seed;
};

/* Round x * scale to a __u16 field; -EINVAL outside [0, max] (NaN included). */
static inline int kvc__fixed16(float x, float scale, float max, __u16 *out)
{
	if (!(x >= 0.0f && x <= max))
		return -EINVAL;
	*out = (__u16)(x * scale + 0.5f);
	return 0;
}

/* Store *s in the SQE's fixed-point fields. Returns 0 or -EINVAL (a value out of range). */
static inline int kvc_prep_sampling(struct kvd_sqe *sqe, const struct kvc_sampling *s)
{
	if (kvc__fixed16(s->temperature, 1000.0f, 65.535f, &sqe->temperature_milli) ||
	    kvc__fixed16(s->top_p, 10000.0f, 1.0f, &sqe->top_p_e4) ||
	    kvc__fixed16(s->min_p, 10000.0f, 1.0f, &sqe->min_p_e4) ||
	    kvc__fixed16(s->repeat_penalty, 1000.0f, 65.535f, &sqe->repeat_penalty_milli) ||
	    s->top_k > 0xffff || s->repeat_last_n > 0xffff)
		return -EINVAL;
	sqe->top_k = (__u16)s->top_k;
	sqe->repeat_last_n = (__u16)s->repeat_last_n;
	sqe->seed = s->seed;
	return 0;
}

/* One message of a conversation for kvc_messages_encode(). */
struct kvc_message {
	uint8_t		role;		/* KVD_ROLE_SYSTEM, _USER, _ASSISTANT */
	const char	*text;		/* len bytes of UTF-8, no NUL; NULL only with len 0 */
	size_t		len;
};

/*
 * Lay out n messages as a KVD_SQE_MESSAGES list (uapi/kvd.h, "Message
 * lists") in out, cap bytes (out NULL and cap 0 to count). Returns the
 * bytes the list takes, written only when they all fit (else nothing is
 * written: call again with room for the count); -EINVAL for no message,
 * more than KVD_CHAT_MAX_MSGS, an unknown role or NULL text with a length;
 * -E2BIG for a list over INT_MAX bytes. The content is not checked here
 * (UTF-8, NUL): the daemon refuses such a list with -EINVAL.
 */
int kvc_messages_encode(const struct kvc_message *msgs, size_t n, void *out, size_t cap);

/* ---------------------------------------------------------------------- */
/* Surviving a daemon restart (KVD_FEAT_RESUME).                          */

/*
 * The daemon gives each session a resume token with which a new connection
 * reopens it after the daemon restarted, its slots as they stood after
 * their last completed request (uapi/kvd.h, KVD_OPEN_RESUME). The library
 * keeps every open session's token and the requests it published whose
 * final CQE was not taken yet, so that it can do the reopening itself.
 */

/*
 * Session session_id's resume token into token. Returns 0, -ENOENT when c
 * has no such open session (closed, or lost in a restart), -EOPNOTSUPP
 * when the daemon did not grant KVD_FEAT_RESUME (or gave no token). The
 * token is a secret: with it and the uid, anyone may resume the session.
 */
int kvc_session_token(const struct kvc_conn *c, uint32_t session_id, uint64_t token[2]);

/*
 * Reopen by its token a session the daemon kept (one a program saved the
 * token of before it, or the daemon, restarted); its id, the same as
 * before, goes to *session_id, the counts of its slots whose KV came back
 * or was lost to *restored_slots and *lost_slots (either may be NULL; an
 * APPEND or DECODE on a lost slot completes -ESTALE). The sizes asked are
 * those of c's region, else the daemon's defaults: a region the session
 * was opened with other sizes for does not matter, since the first open
 * of this connection chooses it. For each slot that had completed a
 * request, its final CQE comes again, flagged KVD_CQE_REPLAY, in the CQ
 * for the caller to take. Returns 0, -EOPNOTSUPP (no KVD_FEAT_RESUME),
 * -EINVAL (an all-zero token), -ESTALE (the daemon holds no such session),
 * -EBUSY (it is open on another live connection, or its id is taken on
 * this one), or another -errno.
 */
int kvc_session_resume(struct kvc_conn *c, const uint64_t token[2], uint32_t *session_id,
		       uint32_t *restored_slots, uint32_t *lost_slots);

/*
 * Reconnect by itself for up to max_ms when the daemon goes away; 0 (the
 * default, unless $KVD_RECONNECT_MS says otherwise at kvc_connect()) keeps
 * a hang-up an error (-ECONNRESET). When kvc_wait() or kvc_peek() finds the
 * socket hung up (or kvc_submit() a refused kick), the library connects to
 * the same path again, retrying after 20 ms, doubling up to 500 ms, for up
 * to max_ms in all, says HELLO, and reopens every session by its token
 * (one that the daemon lost is forgotten: kvc_session_token() says -ENOENT
 * then). The new region takes the old one's address, holding the old
 * arena's bytes, so pointers into the arena and the offsets requests name
 * stay valid; the vocabulary and kvc_info() are the new daemon's. Then
 * every request that was in flight gets one final CQE, in submission
 * order, before any later one, all flagged KVD_CQE_RESTARTED:
 *
 *   - its own final CQE, replayed (KVD_CQE_REPLAY as well): it was applied
 *     before the daemon went, and this is its result;
 *   - res 0 with KVD_CQE_REPLAY: a slot request submitted before one of
 *     the same slot that was replayed; applied too, but its result is lost;
 *   - res -ERESTART: it was not applied (nor was anything of a session
 *     that could not be reopened); the session is as it was before it, so
 *     the same request can be submitted again as it was.
 *
 * When the daemon is not back in time, the call that noticed returns
 * -ECONNRESET (kvc_submit(): -EPIPE) and later calls stop trying; then
 * kvc_reconnect() or a new kvc_set_reconnect() tries again. A reconnect
 * blocks the submitting thread too; one that another thread runs while it
 * writes into the arena may miss those bytes (written into the old arena
 * after it was copied).
 */
void kvc_set_reconnect(struct kvc_conn *c, int max_ms);

/*
 * The same reconnect, now, for a caller running its own event loop that
 * saw kvc_socket_fd() hang up: it tries for the kvc_set_reconnect() time
 * (once, when that is 0). Returns 0, then the CQEs described there are
 * ready for kvc_peek(); -EISCONN when the daemon is still there; -EPROTO
 * when the new daemon's region would not have the old one's layout;
 * -EINTR, or -errno of the last try.
 */
int kvc_reconnect(struct kvc_conn *c);

/* ---------------------------------------------------------------------- */
/* Text, from the vocabulary the daemon maps for us (KVD_FEAT_VOCAB).     */

/*
 * Token id's bytes (not NUL-terminated; empty for control tokens) and their
 * count in *len, pointing into c's read-only mapping: valid until
 * kvc_close() (a reconnect keeps the old mapping). NULL when id is out of
 * range or there is no vocabulary.
 */
const char *kvc_token_bytes(const struct kvc_conn *c, uint32_t id, uint32_t *len);

/*
 * Copy token id's bytes into buf, NUL-terminated. Returns their count,
 * -ERANGE for an id outside the vocabulary, -ENODATA without a vocabulary,
 * -ENOSPC when cap cannot hold them and the NUL (buf is then left empty).
 */
int kvc_token_text(const struct kvc_conn *c, uint32_t id, char *buf, size_t cap);

/* Token id's KVD_TOKF_* flags, -ERANGE or -ENODATA. */
int kvc_token_flags(const struct kvc_conn *c, uint32_t id);

/*
 * Streaming UTF-8: tokens split characters, so hold back a trailing
 * incomplete sequence until the bytes completing it arrive. Zero the struct
 * to start. kvc_utf8_feed() writes to out (room for len + 3 bytes) the
 * held bytes and in[0, len) minus any new incomplete tail, and returns the
 * count written; kvc_utf8_flush() writes what is still held (room for 3).
 * Invalid bytes pass through unchanged.
 */
struct kvc_utf8 {
	uint8_t	n;
	char	held[3];
};

size_t kvc_utf8_feed(struct kvc_utf8 *u, const char *in, size_t len, char *out);
size_t kvc_utf8_flush(struct kvc_utf8 *u, char *out);

/* ---------------------------------------------------------------------- */
/* Text in, text out: the common case in one blocking call.               */

/* Called with whole UTF-8 characters as tokens arrive; nonzero cancels the request. */
typedef int (*kvc_text_fn)(void *user, const char *utf8, size_t len);

struct kvc_text_opts {
	uint32_t	max_tokens;	/* tokens to generate; 0: prefill only (res = positions) */
	int		chat;		/* render text as a user turn (KVD_SQE_CHAT) */
	const char	*system;	/* with chat: a system message, or NULL (KVD_FEAT_SYSTEM) */
	size_t		system_len;
	const struct kvc_sampling *sampling; /* NULL: greedy */
	uint16_t	flags;		/* more KVD_SQE_*: APPEND, IGNORE_EOS, PLAIN, SPECIAL, PROGRESS */
	uint8_t		priority;	/* KVD_PRIO_* */
	uint64_t	user_data;	/* of the request (0: 1); user_data + 1 is its CANCEL's */
	/* With KVD_SQE_PROGRESS: prompt positions cached so far, of total. NULL: ignored. */
	void		(*progress)(void *user, uint32_t done, uint32_t total);
	/* Polled every 200 ms and between completions: nonzero cancels. NULL: never. */
	const volatile int *cancel;
};

/*
 * Submit text (len bytes of UTF-8) as a GENERATE on session's slot (a
 * PREFILL when max_tokens is 0), streamed, and call fn with the text of
 * the tokens as they come, cut only between characters (kvc_utf8_feed());
 * returns when the request is over. The text, the system message and the
 * output take room in the arena (kvc_arena_alloc()) only for the call.
 * Use it on a connection with no other request in flight: CQEs of other
 * requests are taken and dropped. Flags the daemon did not grant (system:
 * KVD_FEAT_SYSTEM; PLAIN, SPECIAL: KVD_FEAT_PLAIN_TEXT; PROGRESS:
 * KVD_FEAT_PROGRESS) give -EOPNOTSUPP before anything is sent.
 *
 * When fn or o->cancel stopped the request, the call also takes its
 * CANCEL's CQE (user_data + 1) before it returns, so none is left behind
 * for a later call to take as its own final one: calls numbered 1, 2, 3...
 * on one connection never see each other's completions.
 *
 * Returns the final CQE's res: tokens produced, or positions cached for a
 * prefill, or -errno when the request failed (kvc_strerror() says why;
 * -ERESTART, with reconnecting on: the daemon restarted before it ran the
 * request, and the session is as it was before it: call again);
 * or -errno of the connection (kvc_wait()'s or kvc_submit()'s; out then
 * says nothing). The arena room is given back once the request is over,
 * or when the daemon went away (-ECONNRESET, -EPIPE: nothing writes there
 * any more). After any other error of the connection (-EIO, ...) the
 * request may still run and write its tokens: its room stays taken, and
 * only kvc_close() (or kvc_arena_reset() once its final CQE was taken by
 * hand) frees it. out (may be NULL) gets the final CQE's flags and aux.
 */
struct kvc_text_result {
	uint32_t	flags;		/* KVD_CQE_*: EOS, LENGTH, CANCELLED, SHUTDOWN, PREFIX_HIT */
	uint32_t	aux;		/* res -E2BIG: positions the request needed; else 0 */
};

int kvc_generate_text(struct kvc_conn *c, uint32_t session, uint32_t slot, const char *text,
		      size_t len, const struct kvc_text_opts *o, kvc_text_fn fn, void *user,
		      struct kvc_text_result *out);

#ifdef __cplusplus
}
#endif

#endif
