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
#include "tools/chat.h"
#include "tools/common.h"
#include "tools/turn.h"
#include "uapi/kvd.h"

#define POLL_US_DEFAULT	1000	/* --poll: spin this long after each completion, then sleep */
#define POLL_US_MAX	1000000
#define CHAT_RECONNECT_MS 30000	/* chat rides out a daemon restart this long */

static const char *global_socket;	/* --socket before the command */

/* A SIGINT must interrupt poll() and getline(): tool_catch_signals() sets no SA_RESTART. */
static void catch_sigint(void)
{
	tool_catch_signals((const int[]){ SIGINT, 0 });
}

/* ---------------------------------------------------------------------- */
/* Options.                                                               */


enum {
	OPT_SOCKET = 256, OPT_TEMP, OPT_TOP_K, OPT_TOP_P, OPT_MIN_P, OPT_REPEAT, OPT_SEED,
	OPT_RAW, OPT_JSON, OPT_POLL, OPT_CHAT, OPT_SYSTEM, OPT_SPECIAL,
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
	{ "poll", optional_argument, NULL, OPT_POLL },
	{ "chat", no_argument, NULL, OPT_CHAT },
	{ "system", required_argument, NULL, OPT_SYSTEM },
	{ "special", no_argument, NULL, OPT_SPECIAL },
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
	"exit status: 0 ok, 1 runtime error, 2 usage error, 3 the daemon is shutting down\n";

static const char usage_sampling[] =
	"  -n, --n-predict N   tokens to generate (default %u)\n"
	"      --temp T        temperature (default 0: greedy)\n"
	"      --top-k K       keep the K most likely tokens (0: off)\n"
	"      --top-p P       nucleus sampling mass (1: off)\n"
	"      --min-p P       drop tokens below P x the top probability (0: off)\n"
	"      --repeat-penalty R  penalise the last 64 tokens (1: off)\n"
	"      --seed S        sampler seed (default 0)\n";

static void usage_generate(FILE *f)
{
	fprintf(f, "usage: kvctl generate PROMPT [options]\n\n"
		"Streams the continuation of PROMPT (UTF-8 text, tokenized by the daemon) to\n"
		"stdout and a summary to stderr; Ctrl-C cancels the request.\n\n");
	fprintf(f, usage_sampling, 128u);
	fprintf(f, "  -n 0                prefill only: cache the prompt, generate nothing\n"
		"      --socket PATH   daemon socket\n"
		"      --chat          the prompt is a user turn in the model's chat template\n"
		"      --system TEXT   with --chat: a system message before it\n"
		"      --special       read special tokens' spellings (<|im_end|>) in the prompt as\n"
		"                      those tokens (default: plain text; trusted text only)\n"
		"      --poll[=USEC]   busy-poll for completions, up to USEC (default %u) after each\n"
		"                      before sleeping\n", POLL_US_DEFAULT);
	fprintf(f, "      --raw           print token ids instead of text\n"
		"      --json          print one JSON object at the end instead\n"
		"  -h, --help\n");
}

static void usage_chat(FILE *f)
{
	fprintf(f, "usage: kvctl chat [options]\n\n"
		"Each line of stdin is a user turn; the replies stream to stdout. The\n"
		"conversation lives in the daemon's KV cache. /reset forgets it; Ctrl-C\n"
		"cancels a reply (at the prompt it quits, as does end of input). When kvd\n"
		"restarts, chat reconnects (for up to $KVD_RECONNECT_MS ms, default %u) and\n"
		"sends again the turn it interrupted (the whole conversation, should the\n"
		"daemon have lost it).\n\n", CHAT_RECONNECT_MS);
	fprintf(f, usage_sampling, 256u);
	fprintf(f, "      --socket PATH   daemon socket\n"
		"      --system TEXT   a system message before the first turn (and after /reset)\n"
		"      --special       read special tokens' spellings in turns as those tokens\n"
		"      --poll[=USEC]   busy-poll for completions, up to USEC (default %u) after each\n"
		"  -h, --help\n", POLL_US_DEFAULT);
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
static int parse_opts(int argc, char **argv, struct kvctl_opts *o, int sampling,
		      void (*usage)(FILE *), uint64_t n_min)
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
		case OPT_POLL:
			u = POLL_US_DEFAULT;
			bad = optarg ? tool_parse_u64(who, "--poll", optarg, 1, POLL_US_MAX, &u) : 0;
			o->poll_us = (unsigned int)u;
			break;
		case OPT_JSON: o->json = 1; break;
		case OPT_CHAT: o->chat = 1; break;
		case OPT_SYSTEM: o->system = optarg; break;
		case OPT_SPECIAL: o->special = 1; break;
		case 'n':
			bad = tool_parse_u64(who, "-n", optarg, n_min, UINT32_MAX / 4, &u);
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

/* NULL after saying why; *rc (may be NULL) the exit status that goes with it. */
static struct kvc_conn *connect_or_complain(const char *path, int *rc)
{
	struct kvc_conn *c;
	int err = tool_connect(&c, path, "kvctl");
	if (rc)
		*rc = err == -ESHUTDOWN ? TOOL_EXIT_SHUTDOWN : TOOL_EXIT_RUNTIME;
	return err ? NULL : c;
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

/*
 * Connect to a daemon that takes text prompts and open a session; NULL
 * after saying why, with the exit status in *rc.
 */
static struct kvc_conn *open_text_session(const struct kvctl_opts *o, uint32_t *session, int *rc)
{
	struct kvc_conn *c = connect_or_complain(o->socket, rc);
	if (!c)
		return NULL;
	*rc = TOOL_EXIT_RUNTIME;
	if (!(kvc_info(c)->features & KVD_FEAT_TEXT)) {
		fprintf(stderr, "kvctl: the daemon does not take text prompts\n");
		kvc_close(c);
		return NULL;
	}
	int err = kvc_session_open(c, session);
	if (err) {
		fprintf(stderr, "kvctl: cannot open a session: %s\n", kvc_strerror(err));
		if (err == -ESHUTDOWN)
			*rc = TOOL_EXIT_SHUTDOWN;
		kvc_close(c);
		return NULL;
	}
	return c;
}

/*
 * The SQE flags of a text turn the options ask for, from what the daemon
 * granted: plain text unless --special (a daemon without plain_text reads
 * text its own way), a progress line on a terminal. 0, or -EOPNOTSUPP
 * after saying which option this daemon cannot serve.
 */
static int text_flags(struct kvc_conn *c, const struct kvctl_opts *o, int chat, uint16_t *flags)
{
	const uint32_t feat = kvc_info(c)->features;
	uint16_t f = KVD_SQE_TEXT | (chat ? KVD_SQE_CHAT : 0);
	const char *missing = NULL;

	if (o->system && !(feat & KVD_FEAT_SYSTEM))
		missing = "--system: this daemon does not take a system message (feature system)";
	else if (o->special && chat && !(feat & KVD_FEAT_PLAIN_TEXT))
		missing = "--special: this daemon cannot parse special tokens in chat messages "
			  "(feature plain_text)";
	if (missing) {
		fprintf(stderr, "kvctl: %s\n", missing);
		return -EOPNOTSUPP;
	}
	if (o->special && chat)
		f |= KVD_SQE_SPECIAL;
	else if (!o->special && !chat && (feat & KVD_FEAT_PLAIN_TEXT))
		f |= KVD_SQE_PLAIN;
	if ((feat & KVD_FEAT_PROGRESS) && isatty(STDERR_FILENO))
		f |= KVD_SQE_PROGRESS;
	*flags = f;
	return 0;
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

/* generate's summary on stderr, or its JSON object on stdout. 0 or -errno. */
static int generate_report(struct kvc_conn *c, const struct turn *t, const struct kvctl_opts *o)
{
	double rate = turn_rate(t);
	if (o->max_tokens == 0) {
		if (o->json)
			printf("{\"text\":\"\",\"tokens\":[],\"stop\":\"prefill\",\"positions\":%u}\n", t->n);
		fprintf(stderr, "kvctl: prefill only: %u prompt positions cached, no tokens generated\n",
			t->n);
		return 0;
	}
	if (o->json)
		return print_turn_json(c, t, rate);
	putchar('\n');
	fprintf(stderr, "kvctl: %u tokens in %.2f s, %.1f tok/s, first token %.0f ms, stop: %s\n",
		t->n, t->t_end - t->t_submit, rate,
		t->t_first ? (t->t_first - t->t_submit) * 1e3 : 0.0, stop_name(t->flags));
	return 0;
}

/* generate's own checks of its options and PROMPT: 0, 1 after --help, or TOOL_EXIT_USAGE. */
static int generate_args(int argc, char **argv, struct kvctl_opts *o)
{
	int rc = parse_opts(argc, argv, o, 1, usage_generate, 0);
	if (rc)
		return rc;
	const char *bad = optind != argc - 1 ? "expected one PROMPT" :
			  o->system && !o->chat ? "--system needs --chat (a system message is a chat turn)" :
			  NULL;
	if (bad) {
		fprintf(stderr, "kvctl generate: %s\n", bad);
		usage_generate(stderr);
		return TOOL_EXIT_USAGE;
	}
	return 0;
}

static int cmd_generate(int argc, char **argv)
{
	struct kvctl_opts o = { .socket = global_socket, .max_tokens = 128 };
	int rc = generate_args(argc, argv, &o);
	if (rc)
		return rc == 1 ? 0 : rc;
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

	uint32_t session;
	uint16_t flags;
	struct kvc_conn *c = open_text_session(&o, &session, &rc);
	if (!c)
		goto out_free;
	rc = TOOL_EXIT_RUNTIME;
	if (text_flags(c, &o, o.chat, &flags))
		goto out_close;
	if (o.poll_us)
		kvc_set_spin(c, o.poll_us);

	struct turn t;
	catch_sigint();
	int err = run_turn(c, session, 1, prompt, len, o.system, flags, &o, &t);
	if (err) {
		fprintf(stderr, "\nkvctl: %s\n", tool_conn_error(err));
		goto out_close;
	}
	if (turn_shutdown(&t)) {
		if (t.n && !o.json && o.max_tokens)
			putchar('\n');
		fprintf(stderr, "kvctl: kvd is shutting down (%u tokens were generated)\n", t.n);
		rc = TOOL_EXIT_SHUTDOWN;
		goto out_close;
	}
	if (t.res < 0) {
		report_error(c, &t, &o);
		goto out_close;
	}
	if (generate_report(c, &t, &o))
		goto out_close;
	rc = fflush(stdout) ? TOOL_EXIT_RUNTIME : 0;
out_close:
	kvc_close(c);
out_free:
	free(stdin_text);
	return rc;
}

/* ---------------------------------------------------------------------- */
/* chat (tools/chat.c)                                                    */

/* How long chat waits for a daemon that went to come back: $KVD_RECONNECT_MS (0: not), else 30 s. */
static int chat_reconnect_ms(void)
{
	const char *s = getenv("KVD_RECONNECT_MS");
	uint64_t v;
	return s && *s && !tool_parse_u64(NULL, NULL, s, 0, INT32_MAX, &v) ? (int)v : CHAT_RECONNECT_MS;
}

static int cmd_chat(int argc, char **argv)
{
	struct kvctl_opts o = { .socket = global_socket, .max_tokens = 256 };
	int rc = parse_opts(argc, argv, &o, 1, usage_chat, 1);
	if (rc)
		return rc == 1 ? 0 : rc;
	if (optind != argc) {
		usage_chat(stderr);
		return TOOL_EXIT_USAGE;
	}
	struct chat ch = { .tty = isatty(STDIN_FILENO) };
	ch.c = open_text_session(&o, &ch.session, &rc);
	if (!ch.c)
		return rc;
	if (text_flags(ch.c, &o, 1, &ch.flags)) {
		kvc_close(ch.c);
		return TOOL_EXIT_RUNTIME;
	}
	if (o.poll_us)
		kvc_set_spin(ch.c, o.poll_us);
	kvc_set_reconnect(ch.c, chat_reconnect_ms());
	catch_sigint();
	int err = chat_loop(&ch, &o);
	if (err == 1) {
		fprintf(stderr, "kvctl: kvd is shutting down\n");
		rc = TOOL_EXIT_SHUTDOWN;
	} else if (err) {
		fprintf(stderr, "\nkvctl: %s\n", tool_conn_error(err));
		rc = TOOL_EXIT_RUNTIME;
	} else {
		rc = 0;
	}
	chat_free(&ch);
	kvc_close(ch.c);
	return rc;
}

/* ---------------------------------------------------------------------- */
/* stats, info                                                            */

static const struct { const char *name; size_t off; int u32; } stats_fields[] = {
#define F(x) { #x, offsetof(struct kvd_stats_rep, x), sizeof(((struct kvd_stats_rep *)0)->x) == 4 }
	F(requests), F(tokens_prefilled), F(tokens_generated), F(kv_blocks_total),
	F(kv_blocks_used), F(kv_blocks_cached), F(prefix_hit_tokens), F(prefix_miss_tokens),
	F(evictions), F(preemptions), F(connections), F(sessions), F(steps),
	F(restored_sessions), F(restored_blocks), F(restored_prefixes), F(resumed_sessions),
#undef F
};

static int cmd_stats(int argc, char **argv)
{
	struct kvctl_opts o = { .socket = global_socket };
	int rc = parse_opts(argc, argv, &o, 0, usage_stats, 0);
	if (rc)
		return rc == 1 ? 0 : rc;
	if (optind != argc) {
		usage_stats(stderr);
		return TOOL_EXIT_USAGE;
	}
	struct kvc_conn *c = connect_or_complain(o.socket, &rc);
	if (!c)
		return rc;
	struct kvd_stats_rep st;
	int err = kvc_stats(c, &st);
	kvc_close(c);
	if (err) {
		fprintf(stderr, "kvctl: stats: %s\n", kvc_strerror(err));
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
	"plain_text", "system", "progress", "messages", "logprobs", "penalties", "cached_count",
	"resume",
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
	struct kvctl_opts o = { .socket = global_socket };
	int rc = parse_opts(argc, argv, &o, 0, usage_info, 0);
	if (rc)
		return rc == 1 ? 0 : rc;
	if (optind != argc) {
		usage_info(stderr);
		return TOOL_EXIT_USAGE;
	}
	struct kvc_conn *c = connect_or_complain(o.socket, &rc);
	if (!c)
		return rc;
	const struct kvd_hello_rep *h = kvc_info(c);
	const int js = o.json;
	const struct { const char *name; uint64_t v; } nums[] = {
		{ "pid", h->daemon_pid }, { "abi_version", h->abi_version }, { "vocab_size", h->vocab_size },
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
