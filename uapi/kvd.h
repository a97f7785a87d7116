/* kvd.h — the ABI between the kvd daemon and its clients (version 2). */
#ifndef _UAPI_KVD_H
#define _UAPI_KVD_H

#include <linux/types.h>

/*
 * Conventions
 *
 * - Every struct here has a fixed size pinned by uapi/kvd_pins.h, which the
 *   daemon and libkvclient compile, so layout drift breaks their builds.
 *   Fields are naturally aligned and explicit resv/pad fields fill every
 *   hole. Senders zero reserved fields; receivers refuse non-zero ones with
 *   -EINVAL, so a later version can give them meaning.
 * - Shared regions are located by byte offsets from the start of the region,
 *   never by pointers.
 * - Results are 0 or a positive count on success, -errno on failure:
 *     -EINVAL     malformed message or SQE (bad opcode, size, reserved field)
 *     -EPROTO     wrong magic or unsupported ABI version
 *     -EMSGSIZE   a control message longer than any the daemon takes
 *     -EFAULT     an offset/length pair that does not lie inside the arena
 *     -ERANGE     a token id >= the model's vocabulary size
 *     -E2BIG      prompt plus max_tokens exceed the model's context length or
 *                 the per-request limit (HELLO max_tokens); cqe.aux says
 *                 how many positions the request needs
 *     -ENOENT     unknown session or sequence slot
 *     -EBUSY      too many requests in flight for the connection or its uid
 *     -ENOSPC     the KV-cache pool cannot hold the request
 *     -EDQUOT     the caller's uid is over a quota (KV cache, shared-region bytes)
 *     -EMFILE     too many sessions for this connection or uid; too many
 *                 connections for the uid (max-uid-connections: the new one
 *                 is sent a KVD_MSG_ERROR reply of sequence 0 and status
 *                 -EMFILE at once, then closed); or the daemon is out of file
 *                 descriptors (RLIMIT_NOFILE): SESSION_OPEN could not create
 *                 the region's memfd or doorbells, or a new connection is
 *                 refused (its HELLO answered with a KVD_MSG_ERROR reply of
 *                 status -EMFILE, then closed)
 *     -ESHUTDOWN  the daemon is draining and takes no new work
 *     -ERESTART   (libkvclient, never the daemon) the daemon restarted while
 *                 the request was in flight and it was not applied: the
 *                 session is as it was before it; resubmit it
 *     -ESTALE     SESSION_OPEN with a resume token the daemon does not hold
 *                 (never given out, closed, expired, lost with its state, or
 *                 another uid's); an APPEND or DECODE on a resumed slot whose
 *                 KV could not be restored
 *     -ECANCELED  the request was cancelled (by CANCEL or by session close)
 *     -EIO        the compute backend failed; the daemon stays up
 *
 * Resource exhaustion never takes the daemon down, and each case clears by
 * itself once the pressure goes:
 *   KV pool full    a request that could never fit completes -ENOSPC at
 *                   once; requests that fit wait (or preempt idle sequences,
 *                   recomputed later) until blocks are free.
 *   uid quotas      -EDQUOT (KV blocks: --kv-quota; region bytes), -EMFILE
 *                   (sessions), -EBUSY (requests in flight); counts drop as
 *                   that uid's sessions and connections go.
 *   out of fds      -EMFILE as above; the daemon keeps serving the
 *                   connections it has.
 *   CQ full         not an error: completions wait in the daemon, in order
 *                   (KVD_RING_CQ_OVERFLOW set, overflow = how many); while
 *                   a CQ's worth waits, the daemon stops consuming that
 *                   client's SQ (its submissions then see a full SQ) and
 *                   generates nothing more for it. Reading the CQ resumes
 *                   everything; nothing is dropped.
 */

#define KVD_MAGIC        0x3144564bU /* "KVD1" little-endian */
/* 2: struct kvd_sqe grew to 128 bytes with a reserved tail. */
#define KVD_ABI_VERSION  2U

/* Feature bits, offered by the client in HELLO and acknowledged by the daemon. */
#define KVD_FEAT_RING_WAKEUP   (1U << 0) /* NEED_WAKEUP flags are honoured both ways */
#define KVD_FEAT_CQ_OVERFLOW   (1U << 1) /* a full CQ is back-pressured, never dropped */
#define KVD_FEAT_PREFIX_CACHE  (1U << 2) /* prompts sharing a prefix reuse KV blocks */
#define KVD_FEAT_PRIORITY      (1U << 3) /* kvd_sqe.priority is honoured */
#define KVD_FEAT_SAMPLING      (1U << 4) /* temperature/top-k/top-p/min-p/penalty */
#define KVD_FEAT_VOCAB         (1U << 5) /* HELLO reply passes the vocabulary memfd */
#define KVD_FEAT_TEXT          (1U << 6) /* KVD_SQE_TEXT / KVD_SQE_CHAT prompts */
#define KVD_FEAT_PLAIN_TEXT    (1U << 7) /* KVD_SQE_PLAIN / KVD_SQE_SPECIAL choose how text is read */
#define KVD_FEAT_SYSTEM        (1U << 8) /* CHAT prompts may carry a system message */
#define KVD_FEAT_PROGRESS      (1U << 9) /* KVD_SQE_PROGRESS: prefill progress CQEs */
#define KVD_FEAT_MESSAGES      (1U << 10) /* KVD_SQE_MESSAGES: a whole conversation as a chat prompt */
#define KVD_FEAT_LOGPROBS      (1U << 11) /* KVD_SQE_LOGPROBS: per-token log-probabilities */
#define KVD_FEAT_PENALTIES     (1U << 12) /* presence/frequency penalties (OpenAI's) */
#define KVD_FEAT_CACHED_COUNT  (1U << 13) /* PREFIX_HIT + aux: prompt positions the prefix cache supplied */
#define KVD_FEAT_RESUME        (1U << 14) /* sessions carry resume tokens; their KV survives a
					   * daemon restart ("Resuming after a restart") */
#define KVD_FEAT_ALL           ((1U << 15) - 1)

/* ------------------------------------------------------------------------ */
/* Control messages: one per SOCK_SEQPACKET datagram, requests and replies. */

enum kvd_msg_type {
	KVD_MSG_HELLO = 1,		/* negotiate ABI and features; learn the model */
	KVD_MSG_SESSION_OPEN = 2,	/* create a session; first one passes the region */
	KVD_MSG_SESSION_CLOSE = 3,	/* cancel its requests, free its sequences */
	KVD_MSG_STATS = 4,		/* daemon-wide counters */
	KVD_MSG_ERROR = 5,		/* reply to a message the daemon could not parse */
	KVD_MSG_LAST
};

/* Starts every control message. */
struct kvd_msg_hdr {
	__u32	magic;		/* KVD_MAGIC */
	__u16	type;		/* enum kvd_msg_type; a reply repeats the request's */
	__u16	flags;		/* KVD_MSGF_* */
	__u32	len;		/* bytes of the whole message, header included */
	__u32	seq;		/* chosen by the client, echoed in the reply */
	__s32	status;		/* replies: 0 or -errno; requests: 0 */
	__u32	resv;		/* zero */
};

#define KVD_MSGF_REPLY	(1U << 0) /* set on every message the daemon sends */

struct kvd_hello_req {
	struct kvd_msg_hdr hdr;
	__u32	abi_version;	/* KVD_ABI_VERSION the client was built against */
	__u32	features;	/* KVD_FEAT_* the client wants */
	__u64	resv[2];	/* zero */
};

struct kvd_hello_rep {
	struct kvd_msg_hdr hdr;
	__u32	abi_version;	/* the daemon's KVD_ABI_VERSION */
	__u32	features;	/* requested features the daemon grants */
	__u32	vocab_size;	/* token ids must be below this */
	__u32	ctx_len;	/* max positions of one sequence */
	__u32	bos_id;		/* begin-of-sequence token, or ~0U if none */
	__u32	eos_id;		/* end-of-sequence token, or ~0U if none */
	__u32	eot_id;		/* end-of-turn token (chat), or ~0U if none */
	__u32	max_sessions;	/* per connection */
	__u32	max_sq_entries;	/* power of two */
	__u32	max_cq_entries;	/* power of two */
	__u32	max_arena_bytes; /* token arena size limit per connection */
	__u32	kv_block_tokens; /* tokens per KV-cache block */
	__u64	kv_blocks_total; /* blocks in the daemon's pool */
	char	model_name[64];	/* NUL-terminated, from general.name */
	char	backend[16];	/* "cpu" or "cuda", NUL-terminated */
	__u32	flags;		/* KVD_HELLOF_* */
	__u32	vocab_bytes;	/* size of the vocabulary memfd, 0 if none */
	__u32	max_tokens;	/* per request: prompt plus generated */
	__u32	max_slots;	/* sequence slots per session */
	__u32	daemon_pid;	/* the daemon's pid (not the socket's opener: systemd, under
				 * socket activation) */
	__u32	resv0;		/* zero */
	__u64	resv[1];	/* zero */
};

#define KVD_HELLOF_VOCAB (1U << 0) /* this reply carries one fd: the vocabulary memfd (only
				    * a connection's first HELLO's reply does) */

/*
 * The vocabulary memfd (sealed, read-only; mmap it PROT_READ, MAP_SHARED):
 * the header, then offsets (n_tokens + 1,) __u32 into the bytes area, then
 * the bytes: token i's text is bytes[offsets[i], offsets[i + 1]) (the raw
 * bytes it stands for; empty for control tokens), and flags (n_tokens,) __u8.
 */
struct kvd_vocab_hdr {
	__u32	magic;		/* KVD_VOCAB_MAGIC */
	__u32	n_tokens;
	__u64	offsets_off;	/* byte offset of offsets[] from the start */
	__u64	bytes_off;	/* byte offset of the bytes area */
	__u64	bytes_len;
	__u64	flags_off;	/* byte offset of flags[] */
	__u64	resv[3];	/* zero */
};

#define KVD_VOCAB_MAGIC	0x5644564bU /* "KVDV" */
#define KVD_TOKF_CONTROL (1U << 0) /* a control token (BOS, EOS, <|im_start|>, ...) */
#define KVD_TOKF_EOG	 (1U << 1) /* ends generation */

struct kvd_session_open_req {
	struct kvd_msg_hdr hdr;
	__u32	sq_entries;	/* power of two, <= max_sq_entries; 0 = default */
	__u32	cq_entries;	/* power of two, <= max_cq_entries; 0 = default */
	__u32	arena_bytes;	/* multiple of 4, <= max_arena_bytes; 0 = default */
	__u32	flags;		/* KVD_OPEN_* (KVD_FEAT_RESUME); else zero */
	__u64	token[2];	/* KVD_OPEN_RESUME: the session's resume token; else zero */
};

/*
 * KVD_OPEN_RESUME: reopen the session a SESSION_OPEN reply gave this token
 * (its resume_token), typically on a new connection after the daemon
 * restarted. It gets the same session_id back (its table index must be free
 * on this connection: else -EBUSY), its slots as they stood after their
 * last completed request, and, in this connection's CQ, for each slot that
 * completed one, that request's final CQE again with KVD_CQE_REPLAY (so a
 * client can tell whether the completion it never saw was applied).
 * -ESTALE: no such token (or another uid's; one session, one uid); -EBUSY:
 * the session is open on a live connection.
 */
#define KVD_OPEN_RESUME	(1U << 0)

/*
 * The shared region of a connection (one per connection, shared by its
 * sessions), at the offsets the reply gives: the SQ ring header, the CQ ring
 * header, sq_entries SQEs, cq_entries CQEs, then the token arena. Every part
 * starts on a 64-byte boundary. The client writes only SQ tail, SQEs, CQ
 * head, CQ flags and the arena; the daemon writes SQ head, SQ flags, CQ
 * tail, CQEs, CQ overflow and the output areas named by SQEs.
 *
 * Reply to SESSION_OPEN. On the first open of a connection the daemon sends,
 * as SCM_RIGHTS with this reply, three fds in this order: the sealed memfd
 * holding the region (rings and arena), the kick doorbell (client ->
 * daemon) and the call doorbell (daemon -> client); KVD_OPENF_FDS is set
 * then. Later sessions of the same connection share that region and those
 * doorbells. A doorbell is the client's end of a datagram socketpair whose
 * other end only the daemon holds: ring one by writing 8 bytes (any value),
 * clear one by reading what is there (8 bytes a ring; several may wait).
 * Nothing done to these fds reaches the daemon's own ends.
 */
struct kvd_session_open_rep {
	struct kvd_msg_hdr hdr;
	__u32	session_id;	/* names the session in SQEs and SESSION_CLOSE */
	__u32	flags;		/* KVD_OPENF_* */
	__u32	sq_entries;	/* granted */
	__u32	cq_entries;	/* granted */
	__u64	region_bytes;	/* size of the memfd to mmap (MAP_SHARED) */
	__u64	sq_off;		/* struct kvd_ring_hdr of the SQ */
	__u64	sqes_off;	/* sq_entries x struct kvd_sqe */
	__u64	cq_off;		/* struct kvd_ring_hdr of the CQ */
	__u64	cqes_off;	/* cq_entries x struct kvd_cqe */
	__u64	arena_off;	/* token arena: __u32 token ids */
	__u32	arena_bytes;	/* granted */
	__u32	resv0;		/* zero */
	/* Only with KVD_FEAT_RESUME granted: the reply is 96 bytes without these. */
	__u64	resume_token[2]; /* reopens this session after a restart (KVD_OPEN_RESUME);
				  * secret: whoever holds it and has the uid may resume it */
	__u32	restored_slots;	/* KVD_OPEN_RESUME: slots whose KV came back */
	__u32	lost_slots;	/* KVD_OPEN_RESUME: slots that held KV that could not be restored:
				 * an APPEND or DECODE there completes -ESTALE */
};

#define KVD_OPENF_FDS	(1U << 0) /* this reply carries the three fds */
#define KVD_OPENF_RESUMED (1U << 1) /* KVD_OPEN_RESUME: the session came back from the last run */

struct kvd_session_close_req {
	struct kvd_msg_hdr hdr;
	__u32	session_id;
	__u32	resv;		/* zero */
};

/* Reply to STATS (the request is a bare struct kvd_msg_hdr). */
struct kvd_stats_rep {
	struct kvd_msg_hdr hdr;
	__u64	requests;		/* completed since start */
	__u64	tokens_prefilled;	/* prompt tokens computed */
	__u64	tokens_generated;	/* tokens sampled */
	__u64	kv_blocks_total;
	__u64	kv_blocks_used;		/* held by a sequence */
	__u64	kv_blocks_cached;	/* free but holding a reusable prefix */
	__u64	prefix_hit_tokens;	/* prompt tokens served from the prefix cache */
	__u64	prefix_miss_tokens;	/* prompt tokens computed for lack of a hit */
	__u64	evictions;		/* cached blocks reclaimed */
	__u64	preemptions;		/* sequences paused to free KV memory */
	__u32	connections;		/* open now */
	__u32	sessions;		/* open now */
	__u64	steps;			/* engine steps run since start */
	__u32	restored_sessions;	/* sessions brought back from the last run at start */
	__u32	restored_blocks;	/* KV blocks they and the prefix cache got back */
	__u32	restored_prefixes;	/* prefix-cache entries (registered blocks) restored */
	__u32	resumed_sessions;	/* restored sessions a client has reopened since */
	__u64	resv[1];		/* zero */
};

/* ------------------------------------------------------------------------ */
/* Rings: single producer, single consumer, in the shared region.           */

/*
 * The producer owns tail, the consumer owns head; each lives on its own
 * cache line so the two sides never write the same line. The producer
 * writes an entry, then stores tail with release; the consumer loads tail
 * with acquire, reads entries, then stores head with release (pairing with
 * the producer's acquire load of head before it reuses a slot).
 */
struct kvd_ring_hdr {
	__u32	head;		/* consumer's index, free-running */
	__u32	pad0[15];
	__u32	tail;		/* producer's index, free-running */
	__u32	pad1[15];
	__u32	ring_mask;	/* ring_entries - 1 */
	__u32	ring_entries;	/* power of two */
	__u32	flags;		/* KVD_RING_*; both sides change it, only with atomic RMW */
	__u32	overflow;	/* CQ: completions waiting in the daemon */
	__u32	resv[12];	/* zero */
};

/* kvd_ring_hdr.flags */
#define KVD_RING_NEED_WAKEUP	(1U << 0) /* set by the consumer: it sleeps, the producer must
					   * ring its doorbell */
#define KVD_RING_CQ_OVERFLOW	(1U << 1) /* CQ, set by the daemon: it holds completions that did
					   * not fit; a client that frees CQ room while this is set
					   * kicks the daemon if the SQ shows NEED_WAKEUP */

/* ------------------------------------------------------------------------ */
/* Submission and completion entries.                                       */

/*
 * Requests. Each session has max_slots sequence slots; slot names one. A
 * slot's requests run in submission order; different slots (and sessions,
 * and connections) run together, batched in the same engine steps.
 *
 * PREFILL   puts the prompt into the slot's KV cache (without APPEND the
 *           slot is reset first). One CQE: res = positions now cached.
 * DECODE    samples up to max_tokens tokens continuing the slot's sequence,
 *           writing token i as a __u32 at out_off + 4 * i in the arena.
 * GENERATE  PREFILL then DECODE as one request.
 * CANCEL    ends the request whose user_data is target_user_data on this
 *           connection: that request's final CQE has KVD_CQE_CANCELLED and
 *           res = tokens produced so far; the CANCEL's own CQE has res 0, or
 *           -ENOENT if no such request is in flight.
 * RESET     forgets the slot's sequence and returns its KV blocks; res 0.
 *
 * DECODE and GENERATE post one final CQE (no KVD_CQE_MORE): res = tokens
 * produced, flags EOS (an end-of-generation token was sampled; it is
 * written and counted), LENGTH (max_tokens or the context length reached)
 * or CANCELLED (with SHUTDOWN when the daemon's drain ended it); with
 * KVD_SQE_STREAM a CQE with KVD_CQE_MORE precedes it for every token but
 * the last (token = the id, n_out = tokens written so far); the final CQE
 * carries the last token the same way. The
 * last sampled token is not yet in the KV cache; a later APPEND or DECODE
 * on the slot feeds it first. An invalid SQE completes at once with res
 * -errno (see Conventions) and changes nothing.
 *
 * Text prompts (KVD_SQE_TEXT): n_tokens bytes of UTF-8 at tokens_off, no
 * NUL (-EINVAL), tokenized by the daemon. Alone, a special token's
 * spelling in it ("<|im_end|>") becomes that control token, unless
 * KVD_SQE_PLAIN. With KVD_SQE_CHAT the text is a user turn (and
 * system_off/system_len a system turn before it) rendered with the model's
 * chat template: the template's own markers are always control tokens,
 * while the messages' text is plain text unless KVD_SQE_SPECIAL, so text
 * from an untrusted user cannot end its turn or open another. Without
 * APPEND the prompt is the whole conversation (BOS first if the model
 * wants one; with no system message, the template's default system prompt
 * if it has one); with APPEND it is the next turn(s) of the slot's
 * conversation. PLAIN or SPECIAL without TEXT, or both together, are
 * -EINVAL; PLAIN with CHAT and SPECIAL without CHAT restate the default.
 * On an op without a prompt (NOP, DECODE, CANCEL, RESET), TEXT, CHAT,
 * PLAIN, SPECIAL, PROGRESS or a system message is -EINVAL.
 * A text prompt whose bytes (system message included) could not fit the
 * per-request limit whatever they tokenize to completes -E2BIG before it
 * is tokenized.
 *
 * Prefill progress (KVD_SQE_PROGRESS, PREFILL and GENERATE only, else
 * -EINVAL): after each engine step that computed part of the prompt and
 * left some of it to do, a CQE with KVD_CQE_MORE | KVD_CQE_PROGRESS: res =
 * positions of the slot's sequence cached so far, aux = positions it holds
 * once the prompt is in (the res a PREFILL completes with; without APPEND,
 * the prompt's own length), token and n_out 0. At most one per engine
 * step, res rising (a prompt preempted and recomputed says nothing until it
 * passes what it said); none for a prompt that goes in in one step (or
 * comes from the prefix cache), and none once its first token is sampled:
 * they all precede a GENERATE's tokens. They wait in the daemon when the
 * CQ is full and count toward back-pressure, like streamed tokens.
 *
 * Message lists (KVD_SQE_TEXT | KVD_SQE_CHAT | KVD_SQE_MESSAGES): the n_tokens
 * bytes at tokens_off are a whole conversation, records one after the
 * other with no padding: a struct kvd_chat_msg (8 bytes: role, zero resv,
 * len), then len bytes of UTF-8 content, then the next record. At least
 * one and at most KVD_CHAT_MAX_MSGS records that fill the n_tokens bytes
 * exactly; role a KVD_ROLE_*; content well-formed UTF-8 without NUL (may
 * be empty); anything else is -EINVAL, and so are messages the template
 * refuses (its raise_exception(), e.g. roles out of order): that request
 * alone fails. They are rendered with the model's chat template in order,
 * then the assistant's opening unless KVD_SQE_NO_GEN_PROMPT (OpenAI's
 * add_generation_prompt), with the same marker/text rule as CHAT (the
 * content is plain text unless SPECIAL). Without APPEND the list is the
 * whole conversation (BOS first if the model wants one; the template's
 * default system prompt if the list has no system message), so successive
 * requests of one conversation share their rendered prefix and the prefix
 * cache finds it; with APPEND it is the next turn(s) after the slot's
 * conversation, as for CHAT (NO_GEN_PROMPT with APPEND: -EINVAL). A
 * system message (system_len) with MESSAGES is -EINVAL: it goes in the list.
 *
 * Log-probabilities (KVD_SQE_LOGPROBS, DECODE/GENERATE only, else -EINVAL):
 * for sampled token i, the daemon writes 1 + top_logprobs struct
 * kvd_logprob at logprobs_off + i * 8 * (1 + top_logprobs) before the CQE
 * that reports the token: first the sampled token itself, then the
 * top_logprobs (0..KVD_MAX_TOP_LOGPROBS, else -EINVAL) most likely tokens,
 * most likely first (equal ones lower id first). They are the model's raw
 * next-token distribution, log-softmax of the logits, before any penalty,
 * temperature or filter (what OpenAI and vLLM report by default), so they
 * depend on that row's logits alone, whatever shares the step. The whole
 * area (max_tokens records) must lie in the arena, 4-byte aligned
 * (-EFAULT). Without LOGPROBS, logprobs_off and top_logprobs must be 0.
 *
 * Penalties (KVD_FEAT_PENALTIES): OpenAI's and vLLM's presence and frequency
 * penalties, over the tokens this request has generated so far (not the
 * prompt): logit[t] -= presence * (count[t] > 0) + frequency * count[t],
 * after the repeat penalty and before temperature. presence_milli and
 * frequency_milli are the penalties x 1000, in [-2000, 2000] (else -EINVAL);
 * 0 is off.
 *
 * Sampling: temperature_milli 0 is greedy; top_k 0, top_p_e4 0 or 10000,
 * min_p_e4 0, repeat_penalty_milli 0 or 1000 are off; repeat_last_n 0
 * means 64. The same seed and inputs give the same tokens, alone or
 * batched with any other work.
 *
 * Wake-ups: the daemon sets KVD_RING_NEED_WAKEUP in the SQ header before it
 * sleeps; a client that sees it after publishing its tail rings the kick
 * doorbell. A client sets KVD_RING_NEED_WAKEUP in the CQ header before it
 * sleeps on the call doorbell (then looks at the CQ once more); the daemon
 * rings the call doorbell at most once per engine step when it is set. A
 * new connection's SQ starts with NEED_WAKEUP set: its first SQE kicks.
 */
enum kvd_op {
	KVD_OP_NOP = 0,		/* completes at once with res 0 */
	KVD_OP_PREFILL = 1,	/* run the prompt into slot's KV cache; res = positions cached */
	KVD_OP_DECODE = 2,	/* sample up to max_tokens continuing slot's sequence */
	KVD_OP_GENERATE = 3,	/* PREFILL then DECODE as one request */
	KVD_OP_CANCEL = 4,	/* cancel the request whose user_data is target_user_data */
	KVD_OP_RESET = 5,	/* forget slot's sequence, returning its KV blocks */
	KVD_OP_LAST
};

/* kvd_sqe.flags */
#define KVD_SQE_APPEND		(1U << 0) /* PREFILL/GENERATE: extend slot's sequence, do not reset it */
#define KVD_SQE_STREAM		(1U << 1) /* post a CQE with KVD_CQE_MORE per token */
#define KVD_SQE_IGNORE_EOS	(1U << 2) /* keep going past end-of-sequence tokens */
#define KVD_SQE_TEXT		(1U << 3) /* the prompt is n_tokens bytes of UTF-8 text at tokens_off,
					   * tokenized by the daemon (special tokens parsed unless
					   * PLAIN); see "Text prompts" above */
#define KVD_SQE_CHAT		(1U << 4) /* with TEXT: a user turn, rendered with the model's
					   * chat template (the whole prompt, or the next turn with APPEND);
					   * the template's markers are control tokens, the message text
					   * (and system message) plain text unless SPECIAL is set */
#define KVD_SQE_PLAIN		(1U << 5) /* with TEXT: plain text: a special token's spelling in it
					   * ("<|im_end|>") is ordinary text, never the control token
					   * (the default with CHAT); without TEXT or with SPECIAL: -EINVAL */
#define KVD_SQE_SPECIAL		(1U << 6) /* with TEXT|CHAT: parse special tokens in the message text
					   * too (for trusted text only; the default without CHAT);
					   * without TEXT or with PLAIN: -EINVAL */
#define KVD_SQE_PROGRESS	(1U << 7) /* PREFILL/GENERATE (else -EINVAL): post KVD_CQE_PROGRESS
					   * CQEs as the prompt is prefilled (at most one per engine
					   * step; see "Prefill progress" above) */
#define KVD_SQE_MESSAGES	(1U << 8) /* with TEXT|CHAT: tokens_off/n_tokens hold a message list
					   * (struct kvd_chat_msg records), not one user turn; see
					   * "Message lists" above */
#define KVD_SQE_NO_GEN_PROMPT	(1U << 9) /* with MESSAGES, without APPEND: no assistant opening after
					   * the last message (add_generation_prompt false) */
#define KVD_SQE_LOGPROBS	(1U << 10) /* DECODE/GENERATE: a struct kvd_logprob record per sampled
					   * token at logprobs_off; see "Log-probabilities" above */
#define KVD_SQE_FLAGS_ALL	((1U << 11) - 1)

/* kvd_sqe.priority */
#define KVD_PRIO_INTERACTIVE	0
#define KVD_PRIO_BACKGROUND	1

/*
 * 128 bytes, two cache lines; resv leaves room for later fields (senders
 * zero it; an SQE with any of it set completes -EINVAL). Sampling knobs are
 * fixed-point integers: the ABI carries no floating point. temperature 0
 * means greedy; top_k 0, top_p_e4 0 or 10000, min_p_e4 0 and
 * repeat_penalty_milli 0 or 1000 each disable that filter.
 */
struct kvd_sqe {
	__u8	opcode;		/* enum kvd_op */
	__u8	priority;	/* KVD_PRIO_* */
	__u16	flags;		/* KVD_SQE_* */
	__u32	session_id;	/* from SESSION_OPEN */
	__u64	user_data;	/* echoed in every CQE of this request */
	__u32	tokens_off;	/* PREFILL/GENERATE: arena byte offset of prompt ids */
	__u32	n_tokens;	/* PREFILL/GENERATE: number of prompt ids */
	__u32	out_off;	/* DECODE/GENERATE: arena byte offset for sampled ids */
	__u32	max_tokens;	/* DECODE/GENERATE: room at out_off, in tokens */
	__u64	seed;		/* sampler seed; the same seed gives the same tokens */
	__u16	temperature_milli; /* temperature x 1000 */
	__u16	top_k;		/* keep the k most likely tokens */
	__u16	top_p_e4;	/* nucleus mass x 10000 */
	__u16	min_p_e4;	/* min probability relative to the top x 10000 */
	__u16	repeat_penalty_milli; /* penalty x 1000 on recent tokens */
	__u16	repeat_last_n;	/* window of the penalty, in tokens */
	__u32	slot;		/* sequence slot within the session */
	__u64	target_user_data; /* CANCEL: the request to cancel; else zero */
	__u32	system_off;	/* TEXT|CHAT: arena byte offset of a system message (UTF-8) */
	__u32	system_len;	/* its length in bytes; 0: none (system_off must be 0 too).
				 * Rendered as a system turn before the user turn, also with
				 * APPEND (mid-conversation), plain text unless SPECIAL.
				 * Nonzero without CHAT or on an opcode without a prompt:
				 * -EINVAL; outside the arena: -EFAULT */
	__u32	logprobs_off;	/* LOGPROBS: arena byte offset of the kvd_logprob records, 4-aligned */
	__u8	top_logprobs;	/* LOGPROBS: alternatives per token, <= KVD_MAX_TOP_LOGPROBS */
	__u8	resv1;		/* zero */
	__s16	presence_milli;	/* presence penalty x 1000, -2000..2000; 0 off */
	__s16	frequency_milli; /* frequency penalty x 1000, -2000..2000; 0 off */
	__u16	resv2;		/* zero */
	__u32	resv3;		/* zero */
	__u64	resv[5];	/* zero */
};

/* One message of a KVD_SQE_MESSAGES list: this header, then len bytes of UTF-8. */
struct kvd_chat_msg {
	__u8	role;		/* KVD_ROLE_* */
	__u8	resv[3];	/* zero */
	__u32	len;		/* content bytes that follow (unaligned) */
};

enum kvd_role {
	KVD_ROLE_SYSTEM = 1,
	KVD_ROLE_USER = 2,
	KVD_ROLE_ASSISTANT = 3,
	KVD_ROLE_LAST
};

#define KVD_CHAT_MAX_MSGS	4096	/* records in one message list */

/*
 * One log-probability (KVD_SQE_LOGPROBS): logprob holds the bit pattern of
 * an IEEE 754 binary32 (memcpy it into a float), natural log, <= 0; -inf
 * for a token the model gives no probability.
 */
struct kvd_logprob {
	__u32	token;
	__u32	logprob;
};

#define KVD_MAX_TOP_LOGPROBS	20

/* kvd_cqe.flags */
#define KVD_CQE_MORE		(1U << 0) /* more CQEs of this request follow */
#define KVD_CQE_EOS		(1U << 1) /* stopped at an end-of-sequence token */
#define KVD_CQE_LENGTH		(1U << 2) /* stopped at max_tokens or the context length */
#define KVD_CQE_CANCELLED	(1U << 3) /* stopped by CANCEL or session close */
#define KVD_CQE_PREFIX_HIT	(1U << 4) /* part of the prompt came from the prefix cache: on the
					   * final CQE (res >= 0) of a PREFILL or GENERATE, aux =
					   * how many positions it supplied (KVD_FEAT_CACHED_COUNT) */
#define KVD_CQE_SHUTDOWN	(1U << 5) /* with CANCELLED: the daemon is shutting down (its drain
					   * deadline passed), not a CANCEL or session close (res =
					   * tokens produced, as for a cancel); a request a CANCEL
					   * had ended already gets CANCELLED alone. SQEs seen while
					   * it drains complete -ESHUTDOWN */
#define KVD_CQE_PROGRESS	(1U << 6) /* with MORE: prefill progress, not a token: res =
					   * positions of the slot's sequence cached so far, aux =
					   * positions once the prompt is in (without APPEND: prompt
					   * positions cached, of the prompt's) */
#define KVD_CQE_REPLAY		(1U << 7) /* after KVD_OPEN_RESUME: the last final CQE of this slot
					   * before the restart, posted again; its request was applied */
#define KVD_CQE_RESTARTED	(1U << 8) /* made by libkvclient, never the daemon: the daemon
					   * restarted with this request in flight (res -ERESTART: not
					   * applied; with REPLAY: applied, res its result) */

/* 32 bytes. */
struct kvd_cqe {
	__u64	user_data;	/* from the SQE */
	__s32	res;		/* >= 0: tokens produced (prefill: positions cached); -errno */
	__u32	flags;		/* KVD_CQE_* */
	__u32	token;		/* streaming: the newest token id; else the last one */
	__u32	n_out;		/* tokens written at out_off so far */
	__u32	slot;		/* sequence slot, from the SQE */
	__u32	aux;		/* PROGRESS: positions once the prompt is in. res -E2BIG:
				 * positions the request needs: the slot's cached positions +
				 * prompt tokens + max_tokens, over HELLO ctx_len; or, refused
				 * at admission by the per-request limit (HELLO max_tokens),
				 * prompt + max_tokens alone (what the slot holds does not
				 * count toward it), for a text prompt too long to tokenize
				 * a lower bound of that. aux > ctx_len: the context was
				 * exceeded, else max_tokens. PREFIX_HIT (final CQE of a
				 * PREFILL or GENERATE, res >= 0): positions of the prompt
				 * the prefix cache supplied, not computed. Else 0 */
};

#endif /* _UAPI_KVD_H */
