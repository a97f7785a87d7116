/* kvbench.h — what kvbench's run (kvbench.c) and its results (bench_results.c) share. */
#ifndef KVD_TOOLS_KVBENCH_H
#define KVD_TOOLS_KVBENCH_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include "shm/kvclient.h"

#define PLOT_BINS	60	/* time bins of the plot */

struct range { uint32_t lo, hi; };

struct opts {
	const char	*socket;	/* NULL: the library's default */
	uint32_t	clients;
	uint64_t	requests;	/* in all; 0: until --duration */
	double		duration;	/* s; 0: until --requests */
	double		rate;		/* Poisson arrivals per s over all clients; 0: closed loop */
	struct range	prompt, output;	/* tokens, uniform in [lo, hi] */
	uint32_t	shared_prefix;	/* leading prompt tokens every request shares */
	uint64_t	seed;
	double		temp;
	const char	*csv, *plot;	/* NULL: none */
	int		json;
};

/* One streamed token as the client saw it arrive. */
struct tok {
	double	t;		/* s since the run began */
	double	gap;		/* s since the request's previous token; < 0 for its first */
};

/* One request. */
struct sample {
	uint32_t	client;
	uint32_t	prompt;		/* tokens */
	uint32_t	tokens;		/* produced */
	int		res;		/* the final CQE's res: tokens, or -errno */
	int		cancelled;
	double		start;		/* submission, s since the run began */
	double		ttft;		/* submission to the first token, s; < 0 without one */
	double		dur;		/* submission to the final CQE, s */
	size_t		tok0, ntok;	/* its tokens: the client's t[tok0, tok0 + ntok) */
};

struct bench;

struct client {
	struct bench	*b;
	uint32_t	idx;
	pthread_t	th;
	struct kvc_conn	*c;
	uint32_t	session;
	uint32_t	in_off;		/* arena: prompt ids (prompt.hi,) */
	uint32_t	out_off;	/* arena: sampled ids (output.hi,) */
	uint64_t	rng;
	struct sample	*s;		/* (ns,) */
	size_t		ns, cap_s;
	struct tok	*t;		/* (nt,) */
	size_t		nt, cap_t;
	int		err;		/* the connection failed: -errno */
	int		warned;
};

struct bench {
	struct opts	o;
	uint32_t	*ids;		/* (n_ids,) prompt ids to draw from */
	uint32_t	n_ids;
	uint32_t	*prefix;	/* (o.shared_prefix,) */
	struct client	*cl;		/* (o.clients,) */
	double		t0;		/* CLOCK_MONOTONIC at the start, s */
	pthread_mutex_t	lock;		/* guards issued, next_arrival, arrival_rng */
	uint64_t	issued;		/* requests handed out */
	double		next_arrival;	/* --rate: s since t0 */
	uint64_t	arrival_rng;
	atomic_int	done;		/* the clients are through: the poller stops */
	atomic_int	failed;		/* a client lost its connection: everyone stops */
	/* The STATS poller, on its own connection. */
	struct kvc_conn	*sc;
	pthread_t	sth;
	int		stats_err;
	uint64_t	kv_peak;	/* max kv_blocks_used seen */
	uint64_t	kv_total;
};

struct results {
	uint64_t	done, errors, cancelled, tokens;
	int		first_err;
	double		dur;		/* s: start to the last final CQE */
	double		tok_s, req_s;
	double		ttft50, ttft99;	/* ms */
	double		itl50, itl99;	/* ms */
	double		kv_peak;	/* fraction of the pool */
	uint64_t	hit, miss;	/* prefix-cache tokens during the run */
	double		hit_rate;
};

/* The run's figures from its samples and the STATS before and after; 0 or -ENOMEM. */
int compute(const struct bench *b, const struct kvd_stats_rep *st0,
	    const struct kvd_stats_rep *st1, double wall, struct results *r);
/* The results as a table or JSON, then --csv and --plot: 0 or the exit status. */
int report(struct bench *b, const struct results *r);

#endif
