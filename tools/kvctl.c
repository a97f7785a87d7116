/* kvctl.c — command-line client of kvd: generate, chat, stats, info. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "shm/kvclient.h"
#include "tools/common.h"
#include "uapi/kvd.h"

#define SLOT		0
#define WAIT_MS		200	/* kvc_wait() slices, so a SIGINT that misses poll() is seen */

static const char *global_socket;	/* --socket before the command */

/* A SIGINT must interrupt poll() and getline(): tool_catch_signals() sets no SA_RESTART. */
static void catch_sigint(void)
{
	tool_catch_signals((const int[]){ SIGINT, 0 });
}

/* ---------------------------------------------------------------------- */
/* Options.                                                               */

struct opts {
	const char		*socket;	/* NULL: the library's default */
	uint32_t		max_tokens;
	struct kvc_sampling	sp;
	int			raw;
	int			json;
	int			poll;		/* busy-poll the CQ: never sleep, never need a wake-up */
};

enum {
	OPT_SOCKET = 256, OPT_TEMP, OPT_TOP_K, OPT_TOP_P, OPT_MIN_P, OPT_REPEAT, OPT_SEED,
	OPT_RAW, OPT_JSON, OPT_POLL,
};

static const struct option gen_longopts[] = {
	{ "socket", required_argument, NULL, OPT_SOCKET },
	{ "n-predict", required_argument, NULL, 'n' },
	{ "temp", required_argument, NULL, OPT_TEMP },
	{ "top-k", required_argument, NULL, OPT_TOP_K },
	{ "top-p", required_argument, NULL, OPT_TOP_P },
	{ "min-p", required_argument, NULL, OPT_MIN_P },
	{ "repeat-penalty", required_argument, NULL, OPT_REPEAT },
	{ "seed", required_argument, NULL, OPT_SEED },
	{ "raw", no_argument, NULL, OPT_RAW },
	{ "json", no_argument, NULL, OPT_JSON },
	{ "poll", no_argument, NULL, OPT_POLL },
	{ "help", no_argument, NULL, 'h' },
	{ NULL, 0, NULL, 0 },
};

static const char usage_main[] =
	"usage: kvctl [--socket PATH] COMMAND [options]\n"
	"\n"
	"commands:\n"
	"  generate PROMPT   stream a continuation of PROMPT (\"-\": read stdin)\n"
	"  chat              interactive chat, one user turn per line of stdin\n"
	"  stats             the daemon's counters\n"
	"  info              the model and limits the daemon serves\n"
	"\n"
	"  --socket PATH     daemon socket (default $KVD_SOCKET, /run/kvd/kvd.sock for root,\n"
	"                    else $XDG_RUNTIME_DIR/kvd.sock)\n"
	"  -h, --help        this text; COMMAND --help for a command's options\n"
	"\n"
	"exit status: 0 ok, 1 runtime error, 2 usage error\n";

static const char usage_sampling[] =
	"  -n, --n-predict N   tokens to generate (default %u)\n"
	"      --temp T        temperature (default 0: greedy)\n"
	"      --top-k K       keep the K most likely tokens (0: off)\n"
	"      --top-p P       nucleus sampling mass (1: off)\n"
	"      --min-p P       drop tokens below P x the top probability (0: off)\n"
	"      --repeat-penalty R  penalise the last 64 tokens (1: off)\n"
	"      --seed S        sampler seed (default 0)\n"
	"      --socket PATH   daemon socket\n";

static void usage_generate(FILE *f)
{
	fprintf(f, "usage: kvctl generate PROMPT [options]\n\n"
		"Streams the continuation of PROMPT (UTF-8 text, tokenized by the daemon) to\n"
		"stdout and a summary to stderr; Ctrl-C cancels the request.\n\n");
	fprintf(f, usage_sampling, 128u);
	fprintf(f, "      --poll          busy-poll for completions (a core spins; no wake-ups)\n");
	fprintf(f, "      --raw           print token ids instead of text\n"
		"      --json          print one JSON object at the end instead\n"
		"  -h, --help\n");
}

static void usage_chat(FILE *f)
{
	fprintf(f, "usage: kvctl chat [options]\n\n"
		"Each line of stdin is a user turn; the replies stream to stdout. The\n"
		"conversation lives in the daemon's KV cache. /reset forgets it; Ctrl-C\n"
		"cancels a reply (at the prompt it quits, as does end of input).\n\n");
	fprintf(f, usage_sampling, 256u);
	fprintf(f, "  -h, --help\n");
}

static void usage_stats(FILE *f)
{
	fprintf(f, "usage: kvctl stats [--json] [--socket PATH]\n");
}

static void usage_info(FILE *f)
{
	fprintf(f, "usage: kvctl info [--json] [--socket PATH]\n");
}

/*
 * Parse a command's options; the shared sampling set is accepted by
 * generate and chat, --json by the others. Returns 0, 1 after --help, or
 * TOOL_EXIT_USAGE after a message.
 */
static int parse_opts(int argc, char **argv, struct opts *o, int sampling,
		      void (*usage)(FILE *))
{
	static const struct option simple[] = {
		{ "socket", required_argument, NULL, OPT_SOCKET },
		{ "json", no_argument, NULL, OPT_JSON },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int ch;
	double d = 0;
	uint64_t u = 0;
	const char *who = argv[0];	/* "kvctl CMD", as getopt's own messages */

	optind = 0;	/* glibc: reinitialise, scanning from argv[1] */
	while ((ch = getopt_long(argc, argv, sampling ? "n:h" : "h",
				 sampling ? gen_longopts : simple, NULL)) != -1) {
		int bad = 0;
		switch (ch) {
		case OPT_SOCKET: o->socket = optarg; break;
		case OPT_RAW: o->raw = 1; break;
		case OPT_POLL: o->poll = 1; break;
		case OPT_JSON: o->json = 1; break;
		case 'n':
			bad = tool_parse_u64(who, "-n", optarg, 1, UINT32_MAX / 4, &u);
			o->max_tokens = (uint32_t)u;
			break;
		case OPT_TEMP:
			bad = tool_parse_double(who, "--temp", optarg, 0, 65.535, &d);
			o->sp.temperature = (float)d;
			break;
		case OPT_TOP_K:
			bad = tool_parse_u64(who, "--top-k", optarg, 0, 65535, &u);
			o->sp.top_k = (uint32_t)u;
			break;
		case OPT_TOP_P:
			bad = tool_parse_double(who, "--top-p", optarg, 0, 1, &d);
			o->sp.top_p = (float)d;
			break;
		case OPT_MIN_P:
			bad = tool_parse_double(who, "--min-p", optarg, 0, 1, &d);
			o->sp.min_p = (float)d;
			break;
		case OPT_REPEAT:
			bad = tool_parse_double(who, "--repeat-penalty", optarg, 0, 65.535, &d);
			o->sp.repeat_penalty = (float)d;
			break;
		case OPT_SEED:
			bad = tool_parse_u64(who, "--seed", optarg, 0, UINT64_MAX, &o->sp.seed);
			break;
		case 'h':
			usage(stdout);
			return 1;
		default:
			bad = -1;	/* getopt said why */
		}
		if (bad) {	/* the parser or getopt said why */
			usage(stderr);
			return TOOL_EXIT_USAGE;
		}
	}
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Connection.                                                            */

static struct kvc_conn *connect_or_complain(const char *path)
{
	struct kvc_conn *c;
	return tool_connect(&c, path, "kvctl") ? NULL : c;
}

/* ---------------------------------------------------------------------- */
/* One GENERATE, streamed.                                                */

struct turn {
	uint32_t	n;		/* tokens produced */
	uint32_t	flags;		/* of the final CQE */
	int		res;		/* the final CQE's res: n, or -errno */
	uint32_t	out_off;	/* where the ids are in the arena */
	double		t_submit, t_first, t_last, t_end;
};

struct printer {
	struct kvc_conn	*c;
	int		raw;
	int		quiet;		/* --json: print at the end instead */
	int		warned;
	struct kvc_utf8	u;
};

static void print_token(struct printer *pr, uint32_t id)
{
	if (pr->quiet)
		return;
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

static const char *stop_name(uint32_t flags)
{
	if (flags & KVD_CQE_CANCELLED)
		return "cancelled";
	if (flags & KVD_CQE_EOS)
		return "eos";
	if (flags & KVD_CQE_LENGTH)
		return "length";
	return "none";
}

/*
 * One CQE of a streaming turn: print the tokens it brings (out: the output
 * buffer in the arena, *printed: how many are out already). Returns 1 when
 * the turn is over (t filled in), 0 while it goes on.
 */
static int turn_cqe(const struct kvd_cqe *cqe, const uint32_t *out, uint32_t *printed,
		    struct printer *pr, const struct opts *o, struct turn *t)
{
	if (cqe->res < 0) {
		t->res = cqe->res;
		t->t_end = tool_now_s();
		return 1;
	}
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
	if (!more) {
		t->res = cqe->res;
		t->n = upto;
		t->flags = cqe->flags;
		t->t_end = tool_now_s();
		return 1;
	}
	t->t_last = tool_now_s();
	return 0;
}

/*
 * Put text in the arena, submit one GENERATE (flags | STREAM) as user_data
 * ud and print its tokens as they come; a SIGINT sends CANCEL (as ud + 1).
 * The request's own failure lands in t->res; returns 0 or -errno when the
 * connection itself fails.
 */
static int run_turn(struct kvc_conn *c, uint32_t session, uint64_t ud, const char *text,
		    size_t len, uint16_t flags, const struct opts *o, struct turn *t)
{
	struct printer pr = { .c = c, .raw = o->raw, .quiet = o->json };
	struct kvd_sqe sqe;
	struct kvd_cqe cqe;
	uint32_t in_off;
	int cancel_sent = 0, err, poll_cq = o->poll;

	memset(t, 0, sizeof(*t));
	kvc_arena_reset(c);
	uint8_t *arena = kvc_arena(c, NULL);
	if (len > UINT32_MAX || kvc_arena_alloc(c, (uint32_t)len, &in_off) ||
	    kvc_arena_alloc(c, o->max_tokens * 4, &t->out_off)) {
		t->res = -EMSGSIZE;
		return 0;
	}
	memcpy(arena + in_off, text, len);
	const uint32_t *out = (const uint32_t *)(arena + t->out_off);

	kvc_prep_generate(&sqe, session, SLOT, ud, in_off, (uint32_t)len, t->out_off,
			  o->max_tokens);
	sqe.flags = flags | KVD_SQE_STREAM;
	kvc_prep_sampling(&sqe, &o->sp);	/* ranges were checked while parsing */
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
		if (poll_cq) {
			while ((err = kvc_peek(c, &cqe)) == -EAGAIN && !tool_interrupted)
				;
		} else {
			err = kvc_wait(c, &cqe, WAIT_MS);
		}
		if (err == -ETIMEDOUT || err == -EINTR || err == -EAGAIN)
			continue;
		if (err)
			return err;
		do {
			/* Others are our CANCEL's, or an earlier turn's. */
			if (cqe.user_data == ud && turn_cqe(&cqe, out, &printed, &pr, o, t))
				goto done;
		} while (kvc_peek(c, &cqe) == 0);
		fflush(stdout);
	}
done:
	/* A character the stream ended inside of stays unprinted. */
	if (!pr.quiet)
		fflush(stdout);
	if (t->n && t->t_last < t->t_first)
		t->t_last = t->t_end;
	return 0;
}

/* Decode speed: tokens after the first over the time they took. */
static double turn_rate(const struct turn *t)
{
	if (t->n >= 2 && t->t_last > t->t_first)
		return (t->n - 1) / (t->t_last - t->t_first);
	return t->t_end > t->t_submit ? t->n / (t->t_end - t->t_submit) : 0;
}

/* The request's failure as one line; hints where the fix is the user's. */
static void report_error(int res)
{
	const char *hint = res == -EMSGSIZE ? " (prompt plus -n do not fit the shared arena)" :
			   res == -E2BIG ? " (prompt plus -n exceed the context length)" :
			   res == -ERANGE ? " (token id outside the vocabulary)" :
			   res == -EOPNOTSUPP || res == -EINVAL ? " (daemon refused the request)" : "";
	fprintf(stderr, "kvctl: request failed: %s%s\n", strerror(-res), hint);
}

static char *read_all(FILE *f, size_t *len)
{
	size_t cap = 4096, n = 0;
	char *buf = malloc(cap);
	while (buf) {
		n += fread(buf + n, 1, cap - n, f);
		if (n < cap)
			break;
		char *nb = realloc(buf, cap *= 2);
		if (!nb)
			free(buf);
		buf = nb;
	}
	*len = n;
	return buf;
}

/* Connect to a daemon that takes text prompts and open a session; NULL after saying why. */
static struct kvc_conn *open_text_session(const struct opts *o, uint32_t *session)
{
	struct kvc_conn *c = connect_or_complain(o->socket);
	if (!c)
		return NULL;
	if (!(kvc_info(c)->features & KVD_FEAT_TEXT)) {
		fprintf(stderr, "kvctl: the daemon does not take text prompts\n");
		kvc_close(c);
		return NULL;
	}
	int err = kvc_session_open(c, session);
	if (err) {
		fprintf(stderr, "kvctl: cannot open a session: %s\n", strerror(-err));
		kvc_close(c);
		return NULL;
	}
	return c;
}

/* generate --json: the turn's text, its token ids, why it stopped and its speed. */
static int print_turn_json(struct kvc_conn *c, const struct turn *t, double rate)
{
	const uint32_t *ids = (const uint32_t *)(kvc_arena(c, NULL) + t->out_off);
	size_t cap = 0;
	for (uint32_t i = 0; i < t->n; i++) {
		uint32_t k = 0;
		cap += kvc_token_bytes(c, ids[i], &k) ? k : 0;
	}
	char *text = malloc(cap + 1), *p = text;
	if (!text) {
		fprintf(stderr, "kvctl: out of memory\n");
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < t->n; i++) {
		uint32_t k;
		const char *s = kvc_token_bytes(c, ids[i], &k);
		if (s) {
			memcpy(p, s, k);
			p += k;
		}
	}
	fputs("{\"text\":", stdout);
	tool_json_string(stdout, text, (size_t)(p - text));
	fputs(",\"tokens\":[", stdout);
	for (uint32_t i = 0; i < t->n; i++)
		printf("%s%" PRIu32, i ? "," : "", ids[i]);
	printf("],\"stop\":\"%s\",\"tokens_per_second\":%.2f}\n", stop_name(t->flags), rate);
	free(text);
	return 0;
}

static int cmd_generate(int argc, char **argv)
{
	struct opts o = { .socket = global_socket, .max_tokens = 128 };
	int rc = parse_opts(argc, argv, &o, 1, usage_generate);
	if (rc)
		return rc == 1 ? 0 : rc;
	if (optind != argc - 1) {
		fprintf(stderr, "kvctl generate: expected one PROMPT\n");
		usage_generate(stderr);
		return TOOL_EXIT_USAGE;
	}
	char *stdin_text = NULL;
	const char *prompt = argv[optind];
	size_t len = strlen(prompt);
	if (!strcmp(prompt, "-")) {
		prompt = stdin_text = read_all(stdin, &len);
		if (!stdin_text) {
			fprintf(stderr, "kvctl: out of memory\n");
			return TOOL_EXIT_RUNTIME;
		}
	}

	rc = TOOL_EXIT_RUNTIME;
	uint32_t session;
	struct kvc_conn *c = open_text_session(&o, &session);
	if (!c)
		goto out_free;

	struct turn t;
	catch_sigint();
	int err = run_turn(c, session, 1, prompt, len, KVD_SQE_TEXT, &o, &t);
	if (err) {
		fprintf(stderr, "\nkvctl: %s\n", tool_conn_error(err));
		goto out_close;
	}
	if (t.res < 0) {
		report_error(t.res);
		goto out_close;
	}
	double rate = turn_rate(&t);
	if (o.json) {
		if (print_turn_json(c, &t, rate))
			goto out_close;
	} else {
		putchar('\n');
		fprintf(stderr, "kvctl: %u tokens in %.2f s, %.1f tok/s, first token %.0f ms, stop: %s\n",
			t.n, t.t_end - t.t_submit, rate,
			t.t_first ? (t.t_first - t.t_submit) * 1e3 : 0.0, stop_name(t.flags));
	}
	rc = fflush(stdout) ? TOOL_EXIT_RUNTIME : 0;
out_close:
	kvc_close(c);
out_free:
	free(stdin_text);
	return rc;
}

/* ---------------------------------------------------------------------- */
/* chat                                                                   */

/* Wait for the CQE of user_data ud, skipping others; its res, or -errno of the wait. */
static int wait_for(struct kvc_conn *c, uint64_t ud)
{
	struct kvd_cqe cqe;
	for (;;) {
		int err = kvc_wait(c, &cqe, -1);
		if (err == -EINTR)
			continue;
		if (err)
			return err;
		if (cqe.user_data == ud && !(cqe.flags & KVD_CQE_MORE))
			return cqe.res;
	}
}

/* /reset: forget the conversation the slot holds; 0, or -errno after saying why. */
static int reset_slot(struct kvc_conn *c, uint32_t session, uint64_t ud)
{
	struct kvd_sqe sqe;
	kvc_prep_reset(&sqe, session, SLOT, ud);
	int err = kvc_submit(c, &sqe);
	if (!err)
		err = wait_for(c, ud);
	if (err < 0 && err != -ECONNRESET && err != -EPIPE)
		fprintf(stderr, "kvctl: reset failed: %s\n", strerror(-err));
	return err < 0 ? err : 0;
}

static int cmd_chat(int argc, char **argv)
{
	struct opts o = { .socket = global_socket, .max_tokens = 256 };
	int rc = parse_opts(argc, argv, &o, 1, usage_chat);
	if (rc)
		return rc == 1 ? 0 : rc;
	if (optind != argc) {
		usage_chat(stderr);
		return TOOL_EXIT_USAGE;
	}
	uint32_t session;
	struct kvc_conn *c = open_text_session(&o, &session);
	if (!c)
		return TOOL_EXIT_RUNTIME;
	rc = TOOL_EXIT_RUNTIME;
	int err;

	catch_sigint();
	const int tty = isatty(STDIN_FILENO);
	char *line = NULL;
	size_t cap = 0;
	uint64_t ud = 0;
	int history = 0;	/* the slot holds earlier turns: APPEND to them */
	for (;;) {
		if (tty) {
			fputs("> ", stdout);
			fflush(stdout);
		}
		tool_interrupted = 0;
		ssize_t n = getline(&line, &cap, stdin);
		if (n < 0) {
			if (tty)
				putchar('\n');
			break;
		}
		while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
			line[--n] = '\0';
		if (n == 0)
			continue;
		ud += 2;
		if (!strcmp(line, "/reset")) {
			err = reset_slot(c, session, ud);
			if (err == -ECONNRESET || err == -EPIPE)
				goto conn_lost;
			if (err < 0)
				continue;
			history = 0;
			if (tty)
				fprintf(stderr, "(history cleared)\n");
			continue;
		}
		struct turn t;
		uint16_t flags = KVD_SQE_TEXT | KVD_SQE_CHAT | (history ? KVD_SQE_APPEND : 0);
		err = run_turn(c, session, ud, line, (size_t)n, flags, &o, &t);
		if (err)
			goto conn_lost;
		if (t.res < 0) {
			report_error(t.res);
			if (t.res == -E2BIG && history)
				fprintf(stderr, "kvctl: the conversation is full; /reset starts over\n");
			continue;
		}
		history = 1;
		putchar('\n');
		if (t.flags & KVD_CQE_CANCELLED)
			fprintf(stderr, "(cancelled)\n");
		fflush(stdout);
	}
	rc = 0;
	goto out_line;
conn_lost:
	fprintf(stderr, "\nkvctl: %s\n", tool_conn_error(err));
out_line:
	free(line);
	kvc_close(c);
	return rc;
}

/* ---------------------------------------------------------------------- */
/* stats, info                                                            */

static const struct { const char *name; size_t off; int u32; } stats_fields[] = {
#define F(x) { #x, offsetof(struct kvd_stats_rep, x), sizeof(((struct kvd_stats_rep *)0)->x) == 4 }
	F(requests), F(tokens_prefilled), F(tokens_generated), F(kv_blocks_total),
	F(kv_blocks_used), F(kv_blocks_cached), F(prefix_hit_tokens), F(prefix_miss_tokens),
	F(evictions), F(preemptions), F(connections), F(sessions),
#undef F
};

static int cmd_stats(int argc, char **argv)
{
	struct opts o = { .socket = global_socket };
	int rc = parse_opts(argc, argv, &o, 0, usage_stats);
	if (rc)
		return rc == 1 ? 0 : rc;
	if (optind != argc) {
		usage_stats(stderr);
		return TOOL_EXIT_USAGE;
	}
	struct kvc_conn *c = connect_or_complain(o.socket);
	if (!c)
		return TOOL_EXIT_RUNTIME;
	struct kvd_stats_rep st;
	int err = kvc_stats(c, &st);
	kvc_close(c);
	if (err) {
		fprintf(stderr, "kvctl: stats: %s\n", strerror(-err));
		return TOOL_EXIT_RUNTIME;
	}
	const size_t n = sizeof(stats_fields) / sizeof(stats_fields[0]);
	if (o.json)
		putchar('{');
	for (size_t i = 0; i < n; i++) {
		const uint8_t *p = (const uint8_t *)&st + stats_fields[i].off;
		uint64_t v;
		if (stats_fields[i].u32) {
			uint32_t v32;
			memcpy(&v32, p, 4);
			v = v32;
		} else {
			memcpy(&v, p, 8);
		}
		if (o.json)
			printf("%s\"%s\":%" PRIu64, i ? "," : "", stats_fields[i].name, v);
		else
			printf("%-20s %" PRIu64 "\n", stats_fields[i].name, v);
	}
	if (o.json)
		puts("}");
	return fflush(stdout) ? TOOL_EXIT_RUNTIME : 0;
}

static const char *const feature_names[] = {
	"ring_wakeup", "cq_overflow", "prefix_cache", "priority", "sampling", "vocab", "text",
};

/* A token id field: a number, or none / null for ~0U. */
static void print_id(const char *name, uint32_t id, int json)
{
	if (json)
		printf(",\"%s\":", name);
	else
		printf("%-18s ", name);
	if (id == ~0U)
		fputs(json ? "null" : "none\n", stdout);
	else
		printf(json ? "%" PRIu32 : "%" PRIu32 "\n", id);
}

static int cmd_info(int argc, char **argv)
{
	struct opts o = { .socket = global_socket };
	int rc = parse_opts(argc, argv, &o, 0, usage_info);
	if (rc)
		return rc == 1 ? 0 : rc;
	if (optind != argc) {
		usage_info(stderr);
		return TOOL_EXIT_USAGE;
	}
	struct kvc_conn *c = connect_or_complain(o.socket);
	if (!c)
		return TOOL_EXIT_RUNTIME;
	const struct kvd_hello_rep *h = kvc_info(c);
	const int js = o.json;
	const struct { const char *name; uint64_t v; } nums[] = {
		{ "abi_version", h->abi_version }, { "vocab_size", h->vocab_size },
		{ "ctx_len", h->ctx_len }, { "max_tokens", h->max_tokens },
		{ "max_sessions", h->max_sessions }, { "max_slots", h->max_slots },
		{ "max_sq_entries", h->max_sq_entries }, { "max_cq_entries", h->max_cq_entries },
		{ "max_arena_bytes", h->max_arena_bytes }, { "kv_block_tokens", h->kv_block_tokens },
		{ "kv_blocks_total", h->kv_blocks_total }, { "vocab_bytes", h->vocab_bytes },
	};

	if (js) {
		fputs("{\"model\":", stdout);
		tool_json_string(stdout, h->model_name, strlen(h->model_name));
		fputs(",\"backend\":", stdout);
		tool_json_string(stdout, h->backend, strlen(h->backend));
	} else {
		printf("%-18s %s\n%-18s %s\n", "model", h->model_name, "backend", h->backend);
	}
	for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++)
		printf(js ? ",\"%s\":%" PRIu64 : "%-18s %" PRIu64 "\n", nums[i].name, nums[i].v);
	print_id("bos_id", h->bos_id, js);
	print_id("eos_id", h->eos_id, js);
	print_id("eot_id", h->eot_id, js);
	printf(js ? ",\"features\":[" : "%-18s", "features");
	int k = 0;
	for (unsigned int b = 0; b < sizeof(feature_names) / sizeof(feature_names[0]); b++)
		if (h->features & (1U << b))
			printf(js ? "%s\"%s\"" : "%s%s", js ? (k++ ? "," : "") : " ",
			       feature_names[b]);
	puts(js ? "]}" : "");
	kvc_close(c);
	return fflush(stdout) ? TOOL_EXIT_RUNTIME : 0;
}

int main(int argc, char **argv)
{
	static const struct {
		const char *name;
		int (*fn)(int, char **);
	} cmds[] = {
		{ "generate", cmd_generate }, { "chat", cmd_chat },
		{ "stats", cmd_stats }, { "info", cmd_info },
	};
	const char *sock = NULL;
	int i = 1;

	/* Options before the command: --socket and --help. */
	for (; i < argc && argv[i][0] == '-'; i++) {
		if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			fputs(usage_main, stdout);
			return 0;
		} else if (!strcmp(argv[i], "--socket") && i + 1 < argc) {
			sock = argv[++i];
		} else if (!strncmp(argv[i], "--socket=", 9)) {
			sock = argv[i] + 9;
		} else {
			fprintf(stderr, "kvctl: unknown option '%s'\n", argv[i]);
			fputs(usage_main, stderr);
			return TOOL_EXIT_USAGE;
		}
	}
	if (i == argc) {
		fputs(usage_main, stderr);
		return TOOL_EXIT_USAGE;
	}
	global_socket = sock;
	for (size_t k = 0; k < sizeof(cmds) / sizeof(cmds[0]); k++) {
		if (strcmp(argv[i], cmds[k].name))
			continue;
		char name[32];	/* getopt prefixes its messages with argv[0] */
		snprintf(name, sizeof(name), "kvctl %s", cmds[k].name);
		argv[i] = name;
		return cmds[k].fn(argc - i, argv + i);
	}
	fprintf(stderr, "kvctl: unknown command '%s'\n", argv[i]);
	fputs(usage_main, stderr);
	return TOOL_EXIT_USAGE;
}
