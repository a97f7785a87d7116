/* kvhttp.h — what the parts of kvhttp (the OpenAI-compatible HTTP front of kvd) share. */
#ifndef KVD_TOOLS_KVHTTP_H
#define KVD_TOOLS_KVHTTP_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include "shm/kvclient.h"

#define KVH_MAX_CHOICES	8	/* n: slots of one session (kvd's default max-slots) */
#define KVH_MAX_STOPS	4	/* OpenAI's limit on stop strings */

/* ---- options (main.c) ---- */

struct kvh_opts {
	const char	*listen;	/* ADDR:PORT */
	const char	*socket;	/* kvd's; NULL: libkvclient's default */
	const char	*api_key_file;
	char		*api_key;	/* read from api_key_file; NULL: no auth */
	const char	*model_alias;	/* --model-name: the id /v1/models shows; NULL: kvd's */
	size_t		max_body;	/* bytes of a request body before 413 */
	unsigned int	timeout_s;	/* idle connection timeout (slow clients, slow loris) */
	unsigned int	max_clients;	/* concurrent HTTP connections */
	unsigned int	sessions;	/* kvd sessions kvhttp opens */
	unsigned int	queue_s;	/* how long a request waits for a free slot before 429 */
	int		verbose;
};

/* ---- the pool of kvd sessions (pool.c) ---- */

/* A completion routed to the request that owns its slot. */
struct kvh_cqe_node {
	struct kvh_cqe_node	*next;
	struct kvd_cqe		cqe;
};

/* The slots one request holds, in one session, and the completions queued for it. */
struct kvh_lease {
	struct kvh_conn		*conn;
	uint32_t		session_id;
	uint32_t		n;		/* slots held: slot[0, n) */
	uint32_t		slot[KVH_MAX_CHOICES];
	uint32_t		gslot[KVH_MAX_CHOICES];	/* index into the connection's slot table */
	uint32_t		off[KVH_MAX_CHOICES];	/* arena part of each slot */
	uint32_t		part_bytes;	/* size of each part */
	uint64_t		tag;		/* in every user_data: stale completions are dropped */
	int			efd;		/* eventfd: completions (or the daemon's loss) wait */
	pthread_mutex_t		mu;
	struct kvh_cqe_node	*head, **tailp;
};

/* Connect on first use (or after the daemon went away). Returns 0 or -errno. */
int kvh_pool_init(const struct kvh_opts *o);
void kvh_pool_fini(void);

/*
 * Lease n slots of one session, waiting up to o->queue_s for them. Returns
 * 0, -EAGAIN when none came free in time (429), -ECONNREFUSED and friends
 * when kvd cannot be reached (503).
 */
int kvh_lease_get(struct kvh_lease *l, uint32_t n);
void kvh_lease_put(struct kvh_lease *l);

/* The daemon's HELLO reply of the lease's connection. */
const struct kvd_hello_rep *kvh_lease_info(const struct kvh_lease *l);
struct kvc_conn *kvh_lease_kvc(const struct kvh_lease *l);
uint8_t *kvh_lease_arena(const struct kvh_lease *l);

/* user_data of kind k (KVH_UD_*) for choice i. */
enum { KVH_UD_PREFILL = 0, KVH_UD_DECODE = 1, KVH_UD_CANCEL = 2 };
uint64_t kvh_lease_ud(const struct kvh_lease *l, uint32_t i, int kind);
static inline uint32_t kvh_ud_choice(uint64_t ud) { return (uint32_t)(ud >> 2) & 0xff; }
static inline int kvh_ud_kind(uint64_t ud) { return (int)(ud & 3); }

/* Submit under the connection's lock (retrying a full SQ). 0 or -errno. */
int kvh_lease_submit(struct kvh_lease *l, const struct kvd_sqe *sqe);

/*
 * Next completion of the lease into *out, waiting up to timeout_ms while
 * also watching client_fd (-1: none) for a hang-up. Returns 0, -ETIMEDOUT,
 * -EPIPE (the HTTP client went away), -ECONNRESET (kvd went away).
 */
int kvh_lease_wait(struct kvh_lease *l, struct kvd_cqe *out, int client_fd, int timeout_ms);

/* STATS of the current connection into *out; 0 or -errno. */
int kvh_pool_stats(struct kvd_stats_rep *out, struct kvd_hello_rep *hello);

/* ---- a parsed request (openai.c) ---- */

struct kvh_req {
	int		chat;		/* /v1/chat/completions */
	int		stream;
	int		include_usage;
	int		echo;
	int		ignore_eos;	/* vLLM's extension: exactly max_tokens (benchmarks) */
	uint32_t	n;
	int64_t		max_tokens;	/* -1: up to the context */
	double		temperature;
	double		top_p;
	int		has_seed;
	uint64_t	seed;
	const char	*stop[KVH_MAX_STOPS];
	size_t		stop_len[KVH_MAX_STOPS];
	uint32_t	n_stop;
	/* The prompt: text (user turn for chat), or token ids. */
	char		*text;
	size_t		text_len;
	char		*system;
	size_t		system_len;
	struct kvc_message *msgs;	/* chat: the whole conversation, texts owned */
	size_t		n_msgs;
	double		presence, frequency;	/* OpenAI's penalties; 0: off */
	int		logprobs;	/* per-token log-probabilities asked for */
	uint32_t	top_logprobs;	/* alternatives per token */
	uint32_t	*ids;
	uint32_t	n_ids;
	json_t		*root;		/* owns the strings above that point into it */
};

/* An HTTP error with OpenAI's error object. */
struct kvh_err {
	unsigned int	status;
	const char	*type;		/* invalid_request_error, ... */
	const char	*param;		/* NULL: null */
	const char	*code;		/* NULL: null */
	char		msg[256];
	unsigned int	retry_after;	/* 429: seconds */
};

void kvh_err_set(struct kvh_err *e, unsigned int status, const char *type, const char *param,
		 const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* Parse body[0, len) for the endpoint (chat or not). 0, or -EINVAL with *e filled. */
int kvh_req_parse(struct kvh_req *r, int chat, const char *body, size_t len, struct kvh_err *e);
void kvh_req_free(struct kvh_req *r);

/* ---- one generation (gen.c) ---- */

struct kvh_choice {
	char		*text;		/* whole characters generated, stop text excluded */
	size_t		len, cap;
	size_t		emitted;	/* bytes of text already handed on */
	struct kvc_utf8	u;
	uint32_t	tokens;		/* completion tokens */
	const char	*finish;	/* NULL while running: "stop", "length" */
	int		done;		/* final CQE taken */
	int		cancelling;
	json_t		*lp;		/* logprobs: one {token, logprob, bytes, top_logprobs} per token */
	size_t		lp_sent;	/* entries already in a stream chunk */
	double		last_at;	/* CLOCK_MONOTONIC seconds of its newest token; 0: none yet */
};

/* Called with new text of choice i (a stream chunk), and once when choice i finishes. */
struct kvh_sink {
	int	(*text)(void *user, uint32_t i, const char *s, size_t len);
	int	(*finish)(void *user, uint32_t i, const char *reason);
	void	*user;
};

struct kvh_gen {
	const struct kvh_req	*req;
	struct kvh_lease	lease;
	int			have_lease;
	int			client_fd;
	uint32_t		prompt_tokens;
	int			prefix_hit;
	uint32_t		cached;		/* of prompt_tokens, from the prefix cache (choice 0's) */
	double			t0;		/* CLOCK_MONOTONIC seconds the request arrived */
	int			first_seen;	/* its first token (of any choice) was timed */
	uint32_t		max_tokens;
	uint32_t		prompt_used;	/* bytes of slot 0's part the prompt takes */
	uint32_t		started;	/* choices whose DECODE was submitted */
	struct kvh_choice	ch[KVH_MAX_CHOICES];
	uint32_t		running;	/* choices not done */
	char			id[40];
	long			created;
	char			model[80];
};

/* Lease, prefill, start decoding. 0, or -errno with *e filled. */
int kvh_gen_start(struct kvh_gen *g, const struct kvh_req *r, int client_fd, struct kvh_err *e);

/*
 * Take completions until at least one sink call happened or all choices
 * finished. Returns 1 while running, 0 when all are done, -errno (client
 * gone, kvd gone: *e says what).
 */
int kvh_gen_pump(struct kvh_gen *g, const struct kvh_sink *s, struct kvh_err *e);

/* Cancel whatever still runs, take its final completions, give the lease back. */
void kvh_gen_end(struct kvh_gen *g);

/* Map a kvd -errno to an HTTP error. */
void kvh_err_from_kvd(struct kvh_err *e, int err, uint32_t aux, uint32_t ctx_len);

/* ---- responses (openai.c) ---- */

json_t *kvh_resp_full(const struct kvh_gen *g);
json_t *kvh_resp_chunk(const struct kvh_gen *g, uint32_t i, const char *s, size_t len,
		       const char *finish, int role);
json_t *kvh_resp_usage_chunk(const struct kvh_gen *g);
/* Choice i's logprobs entries [from, to) in the endpoint's shape (chat content list or completions arrays). */
json_t *kvh_logprobs_json(const struct kvh_gen *g, uint32_t i, size_t from, size_t to);
json_t *kvh_usage(const struct kvh_gen *g);
json_t *kvh_err_json(const struct kvh_err *e);

/* ---- metrics (metrics.c) ---- */

void kvh_metrics_request(unsigned int status);
void kvh_metrics_tokens(uint32_t prompt, uint32_t completion);
/* A choice finished: "stop", "length", or NULL when its client went away (abort). */
void kvh_metrics_finished(const char *reason);
/* Seconds from a request's arrival to its first token; between two tokens of a choice. */
void kvh_metrics_ttft(double seconds);
void kvh_metrics_itl(double seconds);
/* The Prometheus text of /metrics for kvd on sock (NULL: the default), malloc'ed, in *out; its length or -errno. */
int kvh_metrics_text(char **out, const char *sock);

#endif
