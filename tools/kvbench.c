/* kvbench.c — load generator for kvd: concurrent streamed requests, throughput and latency tables. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "shm/kvclient.h"
#include "tools/common.h"
#include "uapi/kvd.h"

#define SLOT		0
#define WAIT_MS		100	/* kvc_wait() slices, so a stop is seen promptly */
#define STATS_MS	100	/* STATS poll period */
#define FIRST_ID	100	/* prompt ids start here, past the usual special tokens */
#define PLOT_BINS	60	/* time bins of the plot */

/* splitmix64: seedable with any value, plenty for token ids and arrivals. */
static uint64_t rng_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform in [lo, hi]. */
static uint32_t rng_range(uint64_t *s, uint32_t lo, uint32_t hi)
{
	return lo + (uint32_t)(rng_next(s) % ((uint64_t)hi - lo + 1));
}

/* Room for element n of p (sz-byte elements, *cap of them): p, moved, or NULL (p kept). */
static void *grow(void *p, size_t *cap, size_t n, size_t sz)
{
	if (n < *cap)
		return p;
	size_t nc = *cap ? *cap * 2 : 64;
	void *q = realloc(p, nc * sz);
	if (q)
		*cap = nc;
	return q;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Nearest-rank percentile p (0..100] of sorted v (n,); NAN when n is 0. */
static double pct(const double *v, size_t n, double p)
{
	size_t k = (size_t)ceil(p / 100.0 * (double)n);
	return n ? v[k ? k - 1 : 0] : NAN;
}

/* ---------------------------------------------------------------------- */
/* Options.                                                               */

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

enum { OPT_SOCKET = 256, OPT_PREFIX, OPT_SEED, OPT_TEMP, OPT_CSV, OPT_PLOT, OPT_JSON };

static const struct option longopts[] = {
	{ "socket", required_argument, NULL, OPT_SOCKET }, { "clients", required_argument, NULL, 'c' },
	{ "requests", required_argument, NULL, 'n' }, { "duration", required_argument, NULL, 'd' },
	{ "rate", required_argument, NULL, 'r' }, { "prompt-len", required_argument, NULL, 'p' },
	{ "output-len", required_argument, NULL, 'o' },
	{ "shared-prefix", required_argument, NULL, OPT_PREFIX },
	{ "seed", required_argument, NULL, OPT_SEED }, { "temp", required_argument, NULL, OPT_TEMP },
	{ "csv", required_argument, NULL, OPT_CSV }, { "plot", required_argument, NULL, OPT_PLOT },
	{ "json", no_argument, NULL, OPT_JSON }, { "help", no_argument, NULL, 'h' },
	{ NULL, 0, NULL, 0 },
};

static const char usage_text[] =
	"usage: kvbench [options]\n"
	"\n"
	"Drives a kvd daemon with streamed GENERATE requests of random token ids and\n"
	"prints throughput and latency. Each client is one connection with one session\n"
	"running one request at a time; every request resets its slot and produces\n"
	"exactly its output length (end-of-sequence is ignored).\n"
	"\n"
	"      --socket PATH       daemon socket (default $KVD_SOCKET, /run/kvd/kvd.sock\n"
	"                          for root, else $XDG_RUNTIME_DIR/kvd.sock)\n"
	"  -c, --clients N         concurrent clients (default 1)\n"
	"  -n, --requests N        requests in all (default 8 per client, or none with -d)\n"
	"  -d, --duration S        hand out requests for S seconds; those in flight finish\n"
	"  -r, --rate R            Poisson arrivals, R requests/s over all clients (seeded);\n"
	"                          a request waits while every client is busy (default:\n"
	"                          closed loop, each client sends its next at once)\n"
	"  -p, --prompt-len A[:B]  prompt tokens, uniform in A..B (default 128)\n"
	"  -o, --output-len A[:B]  output tokens, uniform in A..B (default 128)\n"
	"      --shared-prefix N   every prompt starts with the same N tokens (default 0)\n"
	"      --seed S            seeds prompts, lengths, arrivals and sampling (default 1)\n"
	"      --temp T            sampling temperature (default 0: greedy)\n"
	"      --csv FILE          one line per request: client, start, TTFT, tokens, ...\n"
	"      --plot FILE.png     throughput and latency over time (needs gnuplot)\n"
	"      --json              one JSON object instead of the table\n"
	"  -h, --help\n"
	"\n"
	"TTFT: submission to the first token's CQE; ITL: gaps between a request's token\n"
	"CQEs. SIGINT/SIGTERM stops the run, cancels what is in flight and prints what\n"
	"was measured. Exit status: 0 ok, 1 runtime error or nothing completed, 2 usage.\n";

/* "A" or "A:B" with lo <= A <= B <= hi; a message on stderr when it is not. */
static int parse_range(const char *opt, const char *s, uint32_t lo, uint32_t hi, struct range *r)
{
	const char *colon = strchr(s, ':');
	char *a = strndup(s, colon ? (size_t)(colon - s) : strlen(s));
	uint64_t x = 0, y = 0;
	if (!a)
		return -ENOMEM;
	/* Each side a whole number of its own. */
	int rc = tool_parse_u64(NULL, opt, a, lo, hi, &x);
	free(a);
	if (!rc && colon)
		rc = tool_parse_u64(NULL, opt, colon + 1, lo, hi, &y);
	if (!rc && colon && x > y)
		rc = -EINVAL;
	if (rc) {
		fprintf(stderr, "kvbench: bad value '%s' for %s: expected N or A:B, integers from %u to %u, "
			"A <= B\n", s, opt, lo, hi);
		return rc;
	}
	r->lo = (uint32_t)x;
	r->hi = colon ? (uint32_t)y : (uint32_t)x;
	return 0;
}

/* Returns 0, 1 after --help, or TOOL_EXIT_USAGE after a message. */
static int parse_opts(int argc, char **argv, struct opts *o)
{
	const char *who = "kvbench";
	uint64_t u = 0;
	int ch;

	while ((ch = getopt_long(argc, argv, "c:n:d:r:p:o:h", longopts, NULL)) != -1) {
		int bad = 0;
		switch (ch) {
		case OPT_SOCKET: o->socket = optarg; break;
		case OPT_CSV: o->csv = optarg; break;
		case OPT_PLOT: o->plot = optarg; break;
		case OPT_JSON: o->json = 1; break;
		case 'c':
			bad = tool_parse_u64(who, "--clients", optarg, 1, 4096, &u);
			o->clients = (uint32_t)u;
			break;
		case 'n': bad = tool_parse_u64(who, "--requests", optarg, 1, UINT32_MAX, &o->requests); break;
		case 'd': bad = tool_parse_double(who, "--duration", optarg, 0.001, 1e6, &o->duration); break;
		case 'r': bad = tool_parse_double(who, "--rate", optarg, 1e-6, 1e6, &o->rate); break;
		case 'p': bad = parse_range("--prompt-len", optarg, 1, 1u << 24, &o->prompt); break;
		case 'o': bad = parse_range("--output-len", optarg, 1, 1u << 24, &o->output); break;
		case OPT_PREFIX:
			bad = tool_parse_u64(who, "--shared-prefix", optarg, 0, 1u << 24, &u);
			o->shared_prefix = (uint32_t)u;
			break;
		case OPT_SEED: bad = tool_parse_u64(who, "--seed", optarg, 0, UINT64_MAX, &o->seed); break;
		case OPT_TEMP: bad = tool_parse_double(who, "--temp", optarg, 0, 65.535, &o->temp); break;
		case 'h':
			fputs(usage_text, stdout);
			return 1;
		default:
			bad = -1;	/* getopt said why */
		}
		if (bad) {	/* the parser or getopt said why */
			fputs(usage_text, stderr);
			return TOOL_EXIT_USAGE;
		}
	}
	const char *why = optind != argc ? "unexpected arguments" :
		o->shared_prefix > o->prompt.lo ? "--shared-prefix is longer than the shortest prompt" :
		o->plot && strpbrk(o->plot, "'\n") ? "--plot: the name may not hold ' or a newline" :
		NULL;
	if (why) {
		fprintf(stderr, "kvbench: %s\n", why);
		return TOOL_EXIT_USAGE;
	}
	if (!o->requests && !o->duration)
		o->requests = 8ull * o->clients;
	return 0;
}

/* ---------------------------------------------------------------------- */
/* The run.                                                               */

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

/*
 * Hand out the next request: 1 with its arrival time in *when (s since t0;
 * 0 in closed loop), or 0 when the run is over.
 */
static int ticket(struct bench *b, double *when)
{
	const struct opts *o = &b->o;
	int ok = 0;

	if (tool_interrupted || atomic_load(&b->failed))
		return 0;
	double t = tool_now_s() - b->t0;
	pthread_mutex_lock(&b->lock);
	*when = o->rate > 0 ? b->next_arrival : 0;
	if ((o->requests && b->issued >= o->requests) || (o->duration && t >= o->duration) ||
	    (o->duration && *when >= o->duration))
		goto out;
	if (o->rate > 0) {
		double u = (double)(rng_next(&b->arrival_rng) >> 11) * 0x1p-53;	/* [0, 1) */
		b->next_arrival += -log1p(-u) / o->rate;
	}
	b->issued++;
	ok = 1;
out:
	pthread_mutex_unlock(&b->lock);
	return ok;
}

/*
 * Write a prompt into the arena, submit one streamed GENERATE as user_data
 * ud and take its CQEs to the final one, timing each token. Fills *s and
 * the client's tokens; the request's own failure lands in s->res. Returns
 * 0, or -errno when the connection itself fails.
 */
static int run_request(struct client *cl, uint64_t ud, struct sample *s)
{
	struct bench *b = cl->b;
	const struct opts *o = &b->o;
	uint32_t *in = (uint32_t *)(kvc_arena(cl->c, NULL) + cl->in_off);
	struct kvd_sqe sqe;
	struct kvd_cqe cqe;
	int err, cancel_sent = 0;

	memset(s, 0, sizeof(*s));
	s->client = cl->idx;
	s->prompt = rng_range(&cl->rng, o->prompt.lo, o->prompt.hi);
	uint32_t want = rng_range(&cl->rng, o->output.lo, o->output.hi);
	s->ttft = -1;
	s->tok0 = cl->nt;
	memcpy(in, b->prefix, o->shared_prefix * sizeof(*in));
	for (uint32_t i = o->shared_prefix; i < s->prompt; i++)
		in[i] = b->ids[rng_next(&cl->rng) % b->n_ids];

	kvc_prep_generate(&sqe, cl->session, SLOT, ud, cl->in_off, s->prompt, cl->out_off, want);
	sqe.flags = KVD_SQE_STREAM | KVD_SQE_IGNORE_EOS;
	struct kvc_sampling sp = { .temperature = (float)o->temp, .seed = rng_next(&cl->rng) };
	kvc_prep_sampling(&sqe, &sp);	/* the range was checked while parsing */
	double t_sub = tool_now_s(), t_prev = 0;
	s->start = t_sub - b->t0;
	if ((err = kvc_submit(cl->c, &sqe)))
		return err;	/* one request at a time: the SQ is never full */

	for (;;) {
		if (tool_interrupted && !cancel_sent) {
			kvc_prep_cancel(&sqe, cl->session, ud | 1, ud);
			if ((err = kvc_submit(cl->c, &sqe)) && err != -EAGAIN)
				return err;
			cancel_sent = !err;
		}
		err = kvc_wait(cl->c, &cqe, WAIT_MS);
		if (err == -ETIMEDOUT || err == -EINTR)
			continue;
		if (err)
			return err;
		double t = tool_now_s();
		if (cqe.user_data != ud)
			continue;	/* our CANCEL's */
		int more = cqe.flags & KVD_CQE_MORE;
		/* The final CQE carries the last token; that one has no MORE CQE. */
		if (cqe.res > 0 && (more || (size_t)cqe.res > cl->nt - s->tok0)) {
			struct tok *q = grow(cl->t, &cl->cap_t, cl->nt, sizeof(*q));
			if (!q)
				return -ENOMEM;
			cl->t = q;
			cl->t[cl->nt++] = (struct tok){ t - b->t0, t_prev > 0 ? t - t_prev : -1 };
			s->ttft = s->ttft < 0 ? t - t_sub : s->ttft;
			t_prev = t;
		}
		if (more)
			continue;
		s->res = cqe.res;
		s->tokens = cqe.res > 0 ? (uint32_t)cqe.res : 0;
		s->cancelled = (cqe.flags & KVD_CQE_CANCELLED) || cqe.res == -ECANCELED;
		s->dur = t - t_sub;
		s->ntok = cl->nt - s->tok0;
		if (cqe.res >= 0 && !s->cancelled && (s->tokens != want || s->ntok != want) &&
		    !cl->warned++)
			fprintf(stderr, "kvbench: client %u: asked for %u tokens (IGNORE_EOS), got %u in "
				"%zu CQEs, flags 0x%x\n", cl->idx, want, s->tokens, s->ntok, cqe.flags);
		return 0;
	}
}

static void *client_main(void *arg)
{
	struct client *cl = arg;
	struct bench *b = cl->b;
	uint64_t ud = 0;
	double when, d;

	while (ticket(b, &when)) {
		while (!tool_interrupted && (d = b->t0 + when - tool_now_s()) > 0)
			tool_sleep_s(d < 0.1 ? d : 0.1);
		if (tool_interrupted)
			break;
		struct sample s;
		ud += 2;	/* odd user_data: CANCELs */
		int err = run_request(cl, ud, &s);
		struct sample *q = err ? NULL : grow(cl->s, &cl->cap_s, cl->ns, sizeof(*q));
		if (!q) {
			cl->err = err ? err : -ENOMEM;
			atomic_store(&b->failed, 1);
			break;
		}
		cl->s = q;
		cl->s[cl->ns++] = s;
		if (s.res == -ESHUTDOWN) {	/* draining: every later request would fail too */
			cl->err = s.res;
			atomic_store(&b->failed, 1);
		}
	}
	return NULL;
}

static void note_stats(struct bench *b, const struct kvd_stats_rep *st)
{
	b->kv_peak = st->kv_blocks_used > b->kv_peak ? st->kv_blocks_used : b->kv_peak;
	b->kv_total = st->kv_blocks_total;
}

static void *stats_main(void *arg)
{
	struct bench *b = arg;
	struct kvd_stats_rep st;

	while (!atomic_load(&b->done) && !(b->stats_err = kvc_stats(b->sc, &st))) {
		note_stats(b, &st);
		tool_sleep_s(STATS_MS / 1e3);
	}
	return NULL;
}

/* ---------------------------------------------------------------------- */
/* Results.                                                               */

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

/* Sorted gaps (ms) of request s into g; returns their count and their sum in *sum. */
static size_t sample_gaps(const struct client *cl, const struct sample *s, double *g, double *sum)
{
	size_t n = 0;
	*sum = 0;
	for (size_t j = s->tok0; j < s->tok0 + s->ntok; j++)
		if (cl->t[j].gap >= 0)
			*sum += (g[n++] = cl->t[j].gap * 1e3);
	qsort(g, n, sizeof(*g), cmp_double);
	return n;
}

static int compute(const struct bench *b, const struct kvd_stats_rep *st0,
		   const struct kvd_stats_rep *st1, double wall, struct results *r)
{
	size_t n_req = 0, n_tok = 0, nt = 0, ng = 0;
	double end = 0, sum;

	memset(r, 0, sizeof(*r));
	for (uint32_t i = 0; i < b->o.clients; i++) {
		n_req += b->cl[i].ns;
		n_tok += b->cl[i].nt;
	}
	double *ttft = malloc((n_req + n_tok + 1) * sizeof(*ttft)), *gap = ttft + n_req;
	if (!ttft)
		return -ENOMEM;
	for (uint32_t i = 0; i < b->o.clients; i++) {
		for (size_t k = 0; k < b->cl[i].ns; k++) {
			const struct sample *s = &b->cl[i].s[k];
			if (s->res < 0 && !s->cancelled) {
				if (!r->errors++)
					r->first_err = s->res;
				continue;
			}
			/* A cancelled request's tokens and gaps were measured all the same. */
			r->cancelled += s->cancelled;
			r->done += !s->cancelled;
			r->tokens += s->tokens;
			end = fmax(end, s->start + s->dur);
			if (s->ttft >= 0)
				ttft[nt++] = s->ttft * 1e3;
			ng += sample_gaps(&b->cl[i], s, gap + ng, &sum);
		}
	}
	qsort(ttft, nt, sizeof(*ttft), cmp_double);
	qsort(gap, ng, sizeof(*gap), cmp_double);
	r->dur = end > 0 ? end : wall;
	r->tok_s = r->dur > 0 ? (double)r->tokens / r->dur : 0;
	r->req_s = r->dur > 0 ? (double)r->done / r->dur : 0;
	r->ttft50 = pct(ttft, nt, 50);
	r->ttft99 = pct(ttft, nt, 99);
	r->itl50 = pct(gap, ng, 50);
	r->itl99 = pct(gap, ng, 99);
	r->kv_peak = b->kv_total ? (double)b->kv_peak / (double)b->kv_total : 0;
	r->hit = st1->prefix_hit_tokens - st0->prefix_hit_tokens;
	r->miss = st1->prefix_miss_tokens - st0->prefix_miss_tokens;
	r->hit_rate = r->hit + r->miss ? (double)r->hit / (double)(r->hit + r->miss) : NAN;
	free(ttft);
	return 0;
}

/* The run's settings in one line, for the table and the plot's title. */
static void describe(const struct opts *o, char *buf, size_t cap)
{
	char mode[32] = "closed loop", pl[24], ol[24], pre[32] = "", temp[24] = "";
	if (o->rate > 0)
		snprintf(mode, sizeof(mode), "Poisson %.3g req/s", o->rate);
	snprintf(pl, sizeof(pl), o->prompt.lo == o->prompt.hi ? "%u" : "%u..%u", o->prompt.lo,
		 o->prompt.hi);
	snprintf(ol, sizeof(ol), o->output.lo == o->output.hi ? "%u" : "%u..%u", o->output.lo,
		 o->output.hi);
	if (o->shared_prefix)
		snprintf(pre, sizeof(pre), ", shared prefix %u", o->shared_prefix);
	if (o->temp > 0)
		snprintf(temp, sizeof(temp), ", temp %g", o->temp);
	snprintf(buf, cap, "%u client%s, %s, prompt %s, output %s tokens%s%s, seed %" PRIu64,
		 o->clients, o->clients == 1 ? "" : "s", mode, pl, ol, pre, temp, o->seed);
}

static void print_table(const struct bench *b, const struct results *r)
{
	char what[256];
	describe(&b->o, what, sizeof(what));
	printf("kvbench: %s\n", what);
	printf("  %-24s %" PRIu64 "\n", "requests completed", r->done);
	printf("  %-24s %" PRIu64 "%s%s%s\n", "errors", r->errors, r->errors ? " (first: " : "",
	       r->errors ? strerror(-r->first_err) : "", r->errors ? ")" : "");
	if (r->cancelled)
		printf("  %-24s %" PRIu64 " (their tokens count below)\n", "cancelled", r->cancelled);
	printf("  %-24s %.2f s\n", "duration", r->dur);
	printf("  %-24s %.1f\n", "output tok/s", r->tok_s);
	printf("  %-24s %.2f\n", "requests/s", r->req_s);
	printf(isnan(r->ttft50) ? "  %-24s -\n" : "  %-24s %.2f / %.2f\n", "TTFT p50 / p99 (ms)",
	       r->ttft50, r->ttft99);
	printf(isnan(r->itl50) ? "  %-24s -\n" : "  %-24s %.2f / %.2f\n", "ITL p50 / p99 (ms)",
	       r->itl50, r->itl99);
	printf("  %-24s %.1f %% (%" PRIu64 " of %" PRIu64 " blocks)\n", "KV pool peak use",
	       r->kv_peak * 100, b->kv_peak, b->kv_total);
	printf(isnan(r->hit_rate) ? "  %-24s - (no prompt tokens)\n" :
	       "  %-24s %.1f %% (%" PRIu64 " of %" PRIu64 " prompt tokens)\n", "prefix hit rate",
	       r->hit_rate * 100, r->hit, r->hit + r->miss);
}

/* Flat, so that a shell script can pick fields out with sed. */
static void print_json(const struct bench *b, const struct results *r)
{
	const struct opts *o = &b->o;
	const struct { const char *k; double v; } f[] = {
		{ "clients", o->clients }, { "rate", o->rate }, { "prompt_len", o->prompt.hi },
		{ "output_len", o->output.hi }, { "shared_prefix", o->shared_prefix },
		{ "requests", (double)r->done }, { "errors", (double)r->errors },
		{ "cancelled", (double)r->cancelled }, { "output_tokens", (double)r->tokens },
		{ "duration_s", r->dur }, { "output_tok_s", r->tok_s }, { "requests_s", r->req_s },
		{ "ttft_p50_ms", r->ttft50 }, { "ttft_p99_ms", r->ttft99 },
		{ "itl_p50_ms", r->itl50 }, { "itl_p99_ms", r->itl99 }, { "kv_peak", r->kv_peak },
		{ "kv_peak_blocks", (double)b->kv_peak }, { "kv_blocks_total", (double)b->kv_total },
		{ "prefix_hit_rate", r->hit_rate }, { "prefix_hit_tokens", (double)r->hit },
		{ "prefix_miss_tokens", (double)r->miss },
	};
	for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
		printf(isnan(f[i].v) ? "%c\"%s\":null" : "%c\"%s\":%.10g", i ? ',' : '{', f[i].k,
		       f[i].v);
	puts("}");
}

/* A value in ms and a comma, or just the comma when there is none. */
static void csv_ms(FILE *f, double ms)
{
	if (!isnan(ms))
		fprintf(f, "%.3f", ms);
	fputc(',', f);
}

static int write_csv(const struct bench *b, const char *path)
{
	size_t most = 1;
	for (uint32_t i = 0; i < b->o.clients; i++)
		most = b->cl[i].nt > most ? b->cl[i].nt : most;
	double *g = malloc(most * sizeof(*g)), sum;
	FILE *f = g ? fopen(path, "w") : NULL;
	if (!f) {
		int err = g ? -errno : -ENOMEM;
		free(g);
		return err;
	}
	fputs("client,request,start_s,prompt_tokens,output_tokens,ttft_ms,duration_ms,"
	      "itl_mean_ms,itl_p50_ms,itl_p99_ms,itl_max_ms,status\n", f);
	for (uint32_t i = 0; i < b->o.clients; i++) {
		for (size_t k = 0; k < b->cl[i].ns; k++) {
			const struct sample *s = &b->cl[i].s[k];
			size_t ng = sample_gaps(&b->cl[i], s, g, &sum);
			fprintf(f, "%u,%zu,%.6f,%u,%u,", s->client, k, s->start, s->prompt, s->tokens);
			csv_ms(f, s->ttft >= 0 ? s->ttft * 1e3 : NAN);
			csv_ms(f, s->dur * 1e3);
			csv_ms(f, ng ? sum / (double)ng : NAN);
			csv_ms(f, pct(g, ng, 50));
			csv_ms(f, pct(g, ng, 99));
			csv_ms(f, ng ? g[ng - 1] : NAN);
			fprintf(f, "%s\n", s->cancelled ? "cancelled" : s->res < 0 ?
				strerror(-s->res) : "ok");
		}
	}
	free(g);
	int err = ferror(f) ? -EIO : 0;
	if (fclose(f) && !err)
		err = -errno;
	return err;
}

/*
 * Hand gnuplot the run's tokens (arrival, gap), KV pool use and each
 * request's TTFT; it bins output tok/s itself. Returns 0 or -errno.
 */
static int write_plot(const struct bench *b, const struct results *r, const char *path)
{
	size_t n_gap = 0, n_ttft = 0;
	FILE *p = popen("gnuplot", "w");
	if (!p)
		return -errno;
	fputs("$tok << EOD\n", p);
	for (uint32_t i = 0; i < b->o.clients; i++) {
		for (size_t k = 0; k < b->cl[i].nt; k++) {
			const struct tok *t = &b->cl[i].t[k];
			n_gap += t->gap >= 0;
			fprintf(p, t->gap >= 0 ? "%.4f %.4f\n" : "%.4f -\n", t->t, t->gap * 1e3);
		}
	}
	fputs("EOD\n$ttft << EOD\n", p);
	for (uint32_t i = 0; i < b->o.clients; i++) {
		for (size_t k = 0; k < b->cl[i].ns; k++) {
			const struct sample *s = &b->cl[i].s[k];
			if (s->res >= 0 && s->ttft >= 0 && ++n_ttft)
				fprintf(p, "%.4f %.4f\n", s->start + s->ttft, s->ttft * 1e3);
		}
	}
	char what[256];
	describe(&b->o, what, sizeof(what));
	const double w = (r->dur > 0 ? r->dur : 1) / PLOT_BINS;
	fprintf(p, "EOD\nset terminal pngcairo size 1000,720 noenhanced\nset output '%s'\n"
		"set datafile missing '-'\nset grid\nset key top right opaque\n"
		"set multiplot layout 2,1 title 'kvbench: %s'\nset xlabel 'time (s)'\n"
		"set xrange [0:*]\nset ylabel 'output tok/s'\nset yrange [0:*]\nw = %.6f\n"
		"set boxwidth w\nset style fill solid 0.5 noborder\n"
		"plot $tok using (w * (floor($1 / w) + 0.5)):(1 / w) smooth frequency with boxes "
		"title 'output tok/s'\nset ylabel 'latency (ms)'\nset yrange [*:*]\n"
		"set logscale y\n", path, what, w);
	/* gnuplot fails on a curve without a point: leave out the empty ones. */
	if (n_gap || n_ttft)
		fprintf(p, "plot %s%s%s\n", n_gap ? "$tok using 1:2 with points pt 7 ps 0.2 title 'ITL'" : "",
			n_gap && n_ttft ? ", " : "",
			n_ttft ? "$ttft using 1:2 with points pt 7 ps 0.6 title 'TTFT'" : "");
	fputs("unset multiplot\n", p);
	int st = pclose(p);
	if (st == -1)
		return -errno;
	if (WIFEXITED(st) && WEXITSTATUS(st) == 127)
		return -ENOENT;	/* the shell found no gnuplot */
	return WIFEXITED(st) && !WEXITSTATUS(st) ? 0 : -EIO;
}

/* ---------------------------------------------------------------------- */
/* Setup.                                                                 */


/* The ids prompts are drawn from: FIRST_ID and up, plain text (no KVD_TOKF_* flag). */
static int pick_ids(struct bench *b, const struct kvd_hello_rep *h)
{
	if (h->vocab_size <= FIRST_ID)
		return -EINVAL;
	b->ids = malloc((h->vocab_size - FIRST_ID) * sizeof(*b->ids));
	if (!b->ids)
		return -ENOMEM;
	for (uint32_t id = FIRST_ID; id < h->vocab_size; id++) {
		int f = kvc_token_flags(b->sc, id);
		/* Without a vocabulary, at least keep clear of the ids the daemon names. */
		if (f == 0 || (f == -ENODATA && id != h->bos_id && id != h->eos_id &&
			       id != h->eot_id))
			b->ids[b->n_ids++] = id;
	}
	return b->n_ids ? 0 : -ENODATA;
}

static int open_client(struct client *cl, uint64_t *master)
{
	const struct opts *o = &cl->b->o;
	char who[32];
	int err;

	snprintf(who, sizeof(who), "client %u", cl->idx);
	cl->rng = rng_next(master);
	char tag[48];
	snprintf(tag, sizeof(tag), "kvbench: %s", who);
	if ((err = tool_connect(&cl->c, o->socket, tag)))
		return err;
	/* Room for the longest prompt and reply, page-rounded. */
	uint32_t in_bytes = (o->prompt.hi * 4 + 63) & ~63u, out_bytes = (o->output.hi * 4 + 63) & ~63u;
	uint32_t arena = (in_bytes + out_bytes + 4095) & ~4095u;
	if ((err = kvc_session_open_ex(cl->c, 0, 0, arena, &cl->session))) {
		fprintf(stderr, "kvbench: %s: cannot open a session: %s%s\n", who, strerror(-err),
			err == -EMFILE ? " (the daemon's --max-uid-sessions?)" :
			err == -EDQUOT ? " (the daemon's --max-uid-arena?)" : "");
		return err;
	}
	/* No spinning: dozens of clients spinning on their CQs would starve the daemon. */
	kvc_set_spin(cl->c, 0);
	if ((err = kvc_arena_alloc(cl->c, in_bytes, &cl->in_off)) ||
	    (err = kvc_arena_alloc(cl->c, out_bytes, &cl->out_off)))
		fprintf(stderr, "kvbench: %s: arena: %s\n", who, strerror(-err));
	return err;
}

/* Connect everything; 0, or an exit status after a message. */
static int setup(struct bench *b)
{
	const struct opts *o = &b->o;
	int err;

	if (tool_connect(&b->sc, o->socket, "kvbench: stats"))
		return TOOL_EXIT_RUNTIME;
	const struct kvd_hello_rep *h = kvc_info(b->sc);
	uint32_t limit = h->max_tokens && h->max_tokens < h->ctx_len ? h->max_tokens : h->ctx_len;
	if ((uint64_t)o->prompt.hi + o->output.hi > limit) {
		fprintf(stderr, "kvbench: prompt %u plus output %u tokens exceed the daemon's %u per "
			"request\n", o->prompt.hi, o->output.hi, limit);
		return TOOL_EXIT_USAGE;
	}
	if ((err = pick_ids(b, h))) {
		fprintf(stderr, "kvbench: no prompt token ids to draw from: %s\n", strerror(-err));
		return TOOL_EXIT_RUNTIME;
	}
	uint64_t master = o->seed;
	b->prefix = malloc((o->shared_prefix + 1) * sizeof(*b->prefix));
	b->cl = calloc(o->clients, sizeof(*b->cl));
	if (!b->prefix || !b->cl) {
		fprintf(stderr, "kvbench: out of memory\n");
		return TOOL_EXIT_RUNTIME;
	}
	for (uint32_t i = 0; i < o->shared_prefix; i++)
		b->prefix[i] = b->ids[rng_next(&master) % b->n_ids];
	b->arrival_rng = rng_next(&master);
	for (uint32_t i = 0; i < o->clients && !tool_interrupted; i++) {
		b->cl[i].b = b;
		b->cl[i].idx = i;
		if (open_client(&b->cl[i], &master))
			return TOOL_EXIT_RUNTIME;
	}
	return tool_interrupted ? TOOL_EXIT_RUNTIME : 0;
}

/* The results as a table or JSON, then --csv and --plot: 0 or the exit status. */
static int report(struct bench *b, const struct results *r)
{
	const struct opts *o = &b->o;
	int err, rc;
	if (o->json)
		print_json(b, r);
	else
		print_table(b, r);
	rc = fflush(stdout) ? TOOL_EXIT_RUNTIME : 0;
	if (o->csv && (err = write_csv(b, o->csv))) {
		fprintf(stderr, "kvbench: --csv %s: %s\n", o->csv, strerror(-err));
		rc = TOOL_EXIT_RUNTIME;
	}
	if (o->plot && (err = write_plot(b, r, o->plot))) {
		fprintf(stderr, "kvbench: --plot %s: %s\n", o->plot, err == -ENOENT ?
			"gnuplot not found" : err == -EIO ? "gnuplot failed" : strerror(-err));
		rc = TOOL_EXIT_RUNTIME;
	}
	if (!r->done) {
		fprintf(stderr, "kvbench: no request completed\n");
		rc = TOOL_EXIT_RUNTIME;
	}
	return rc;
}

int main(int argc, char **argv)
{
	static struct bench b;
	struct kvd_stats_rep st0, st1;
	struct results r;
	uint32_t started = 0;
	int err, rc;

	b.o = (struct opts){ .clients = 1, .prompt = { 128, 128 }, .output = { 128, 128 },
			     .seed = 1 };
	if ((rc = parse_opts(argc, argv, &b.o)))
		return rc == 1 ? 0 : rc;
	const struct opts *o = &b.o;

	/* No SA_RESTART: a signal must cut a sleep short. */
	tool_catch_signals((const int[]){ SIGINT, SIGTERM, 0 });
	signal(SIGPIPE, SIG_IGN);	/* a failing gnuplot must not kill us */
	pthread_mutex_init(&b.lock, NULL);

	if ((rc = setup(&b)))
		goto out;
	rc = TOOL_EXIT_RUNTIME;
	if ((err = kvc_stats(b.sc, &st0))) {
		fprintf(stderr, "kvbench: stats: %s\n", tool_conn_error(err));
		goto out;
	}
	b.t0 = tool_now_s();
	note_stats(&b, &st0);
	if ((err = pthread_create(&b.sth, NULL, stats_main, &b))) {
		fprintf(stderr, "kvbench: pthread_create: %s\n", strerror(err));
		goto out;
	}
	for (; started < o->clients; started++) {
		if ((err = pthread_create(&b.cl[started].th, NULL, client_main, &b.cl[started]))) {
			fprintf(stderr, "kvbench: pthread_create: %s\n", strerror(err));
			atomic_store(&b.failed, 1);
			break;
		}
	}
	for (uint32_t i = 0; i < started; i++)
		pthread_join(b.cl[i].th, NULL);
	double wall = tool_now_s() - b.t0;
	atomic_store(&b.done, 1);
	pthread_join(b.sth, NULL);
	for (uint32_t i = 0, bad = 0; i < started; i++)
		if (b.cl[i].err && !bad++)
			fprintf(stderr, "kvbench: client %u: %s\n", i, tool_conn_error(b.cl[i].err));
	if (atomic_load(&b.failed))
		goto out;
	if ((err = b.stats_err ? b.stats_err : kvc_stats(b.sc, &st1))) {
		fprintf(stderr, "kvbench: stats: %s\n", tool_conn_error(err));
		goto out;
	}
	note_stats(&b, &st1);
	if ((err = compute(&b, &st0, &st1, wall, &r))) {
		fprintf(stderr, "kvbench: %s\n", strerror(-err));
		goto out;
	}
	rc = report(&b, &r);
out:
	for (uint32_t i = 0; b.cl && i < o->clients; i++) {
		kvc_close(b.cl[i].c);
		free(b.cl[i].s);
		free(b.cl[i].t);
	}
	kvc_close(b.sc);
	free(b.cl);
	free(b.prefix);
	free(b.ids);
	return rc;
}
