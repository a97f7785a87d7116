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
#include "tools/kvbench.h"
#include "uapi/kvd.h"

#define SLOT		0
#define WAIT_MS		100	/* kvc_wait() slices, so a stop is seen promptly */
#define STATS_MS	100	/* STATS poll period */
#define FIRST_ID	100	/* prompt ids start here, past the usual special tokens */

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

/* ---------------------------------------------------------------------- */
/* Options.                                                               */


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
