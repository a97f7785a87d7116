/* main.c — kvd's entry point: the daemon, the in-process run (--prompt) and model inspection (--info). */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <grp.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "daemon/engine.h"
#include "daemon/gguf.h"
#include "daemon/kvpool.h"
#include "daemon/log.h"
#include "daemon/server.h"
#include "daemon/model.h"
#include "daemon/sampler.h"
#include "daemon/tokenizer.h"
#include "kernels/backend.h"

#define DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define PREFILL_ROWS 512

struct options {
	const char *model;
	const char *prompt;
	const char *system;
	int n_predict;
	int chat;
	int info;
	uint32_t threads;
	uint32_t ctx;
	uint64_t kv_mem;
	uint32_t kv_blocks;
	uint32_t kv_block_tokens;
	uint32_t kv_type;
	int prefix_global;
	struct sampler_params sp;
	struct server_config srv;
	const char *socket_group;
	enum kb_kind backend;
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvd [--model PATH] [daemon options]      serve clients on a socket\n"
		"       kvd [--model PATH] --prompt TEXT [options]  generate in-process and exit\n"
		"       kvd [--model PATH] --info\n"
		"\n"
		"daemon:\n"
		"      --socket PATH       endpoint (default /run/kvd/kvd.sock as root, else\n"
		"                          $XDG_RUNTIME_DIR/kvd.sock)\n"
		"      --socket-group NAME group that may connect (the socket is mode 0660)\n"
		"      --max-sessions N    sessions per connection (default 16)\n"
		"      --max-slots N       sequence slots per session (default 8)\n"
		"      --max-tokens N      prompt plus generated tokens per request (default 8192)\n"
		"      --max-inflight N    requests in flight per connection (default 256)\n"
		"      --max-uid-sessions N, --max-uid-inflight N, --max-uid-arena BYTES\n"
		"                          the same limits for all connections of one uid\n"
		"                          (defaults 64, 1024, 1G)\n"
		"      --max-batch-tokens N rows per engine step (default 32: every decoder\n"
		"                          waits for a step's prefill rows, ~2 ms each on a\n"
		"                          2-core CPU, so short steps keep token gaps even)\n"
		"      --kv-quota BLOCKS   KV blocks one uid may hold (default: no quota)\n"
		"      --no-prefix-cache   never reuse cached prompt prefixes\n"
		"      --drain-timeout MS  on SIGTERM, finish in-flight work for at most MS (default 5000)\n"
		"      --log-level L       err, warning, notice (default), info, debug\n"
		"\n"
		"generation and model:\n"
		"  -m, --model PATH        GGUF model (default $KVD_MODEL or " DEFAULT_MODEL ")\n"
		"  -p, --prompt TEXT       generate a continuation of TEXT and exit\n"
		"  -n, --n-predict N       tokens to generate (default 128)\n"
		"      --chat              wrap the prompt in the model's chat template\n"
		"      --system TEXT       system message for --chat\n"
		"      --temp T            temperature (default 0: greedy)\n"
		"      --top-k K           keep the K most likely tokens (0: off)\n"
		"      --top-p P           nucleus sampling mass (1: off)\n"
		"      --min-p P           drop tokens below P x the top probability (0: off)\n"
		"      --repeat-penalty R  penalise the last 64 tokens (1: off)\n"
		"      --seed S            sampler seed (default 0)\n"
		"  -t, --threads N         compute threads (default: all cores)\n"
		"      --backend B         auto (default: cuda when a device is present), cpu, cuda\n"
		"      --ctx N             context length (default: the model's)\n"
		"      --kv-mem BYTES      KV-cache pool size (suffix K, M, G; default: 64k tokens)\n"
		"      --kv-blocks N       KV-cache pool size in blocks (instead of --kv-mem)\n"
		"      --kv-block-tokens N tokens per KV block, a power of two (default 16)\n"
		"      --kv-type T         K/V element type: f16 (default), f32, q8_0\n"
		"      --prefix-global     share cached prompt prefixes across users (default: per uid)\n"
		"      --info              print the model's metadata and exit\n"
		"  -h, --help\n");
}

static int parse_num(const char *s, double lo, double hi, double *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end || v < lo || v > hi)
		return -EINVAL;
	*out = v;
	return 0;
}

/* BYTES with an optional K, M or G (binary) suffix. */
static int parse_size(const char *s, uint64_t *out)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	uint64_t mul = 1;
	if (*end == 'K' || *end == 'k')
		mul = 1ull << 10;
	else if (*end == 'M' || *end == 'm')
		mul = 1ull << 20;
	else if (*end == 'G' || *end == 'g')
		mul = 1ull << 30;
	if (mul != 1)
		end++;
	if (errno || end == s || *end || v == 0 || v > UINT64_MAX / mul)
		return -EINVAL;
	*out = v * mul;
	return 0;
}

static int parse_args(int argc, char **argv, struct options *o)
{
	enum { O_CHAT = 256, O_SYSTEM, O_TEMP, O_TOPK, O_TOPP, O_MINP, O_REP, O_SEED, O_CTX, O_INFO,
	       O_KVMEM, O_KVBLOCKS, O_KVBT, O_KVTYPE, O_PGLOBAL, O_SOCKET, O_SGROUP, O_MAXSESS,
	       O_MAXSLOTS, O_MAXTOK, O_MAXINF, O_MAXBATCH, O_DRAIN, O_LOGLEVEL, O_UIDSESS,
	       O_UIDINF, O_UIDARENA, O_NOPREFIX, O_KVQUOTA, O_BACKEND };
	static const struct option longopts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "prompt", required_argument, NULL, 'p' },
		{ "n-predict", required_argument, NULL, 'n' },
		{ "threads", required_argument, NULL, 't' },
		{ "chat", no_argument, NULL, O_CHAT },
		{ "system", required_argument, NULL, O_SYSTEM },
		{ "temp", required_argument, NULL, O_TEMP },
		{ "top-k", required_argument, NULL, O_TOPK },
		{ "top-p", required_argument, NULL, O_TOPP },
		{ "min-p", required_argument, NULL, O_MINP },
		{ "repeat-penalty", required_argument, NULL, O_REP },
		{ "seed", required_argument, NULL, O_SEED },
		{ "ctx", required_argument, NULL, O_CTX },
		{ "info", no_argument, NULL, O_INFO },
		{ "kv-mem", required_argument, NULL, O_KVMEM },
		{ "kv-blocks", required_argument, NULL, O_KVBLOCKS },
		{ "kv-block-tokens", required_argument, NULL, O_KVBT },
		{ "kv-type", required_argument, NULL, O_KVTYPE },
		{ "prefix-global", no_argument, NULL, O_PGLOBAL },
		{ "socket", required_argument, NULL, O_SOCKET },
		{ "socket-group", required_argument, NULL, O_SGROUP },
		{ "max-sessions", required_argument, NULL, O_MAXSESS },
		{ "max-slots", required_argument, NULL, O_MAXSLOTS },
		{ "max-tokens", required_argument, NULL, O_MAXTOK },
		{ "max-inflight", required_argument, NULL, O_MAXINF },
		{ "max-batch-tokens", required_argument, NULL, O_MAXBATCH },
		{ "drain-timeout", required_argument, NULL, O_DRAIN },
		{ "log-level", required_argument, NULL, O_LOGLEVEL },
		{ "max-uid-sessions", required_argument, NULL, O_UIDSESS },
		{ "max-uid-inflight", required_argument, NULL, O_UIDINF },
		{ "max-uid-arena", required_argument, NULL, O_UIDARENA },
		{ "no-prefix-cache", no_argument, NULL, O_NOPREFIX },
		{ "kv-quota", required_argument, NULL, O_KVQUOTA },
		{ "backend", required_argument, NULL, O_BACKEND },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	const char *env = getenv("KVD_MODEL");
	o->model = env && *env ? env : DEFAULT_MODEL;
	o->n_predict = 128;
	o->kv_block_tokens = 16;
	o->kv_type = KB_F16;
	o->srv = (struct server_config){
		.socket_gid = (gid_t)-1, .max_sessions = 16, .max_slots = 8, .max_tokens = 8192,
		.max_inflight = 256, .max_uid_sessions = 64, .max_uid_inflight = 1024,
		.max_uid_arena = 1ull << 30, .sq_entries = 64, .cq_entries = 256, .arena_bytes = 1 << 20,
		.max_arena_bytes = 64 << 20, .max_batch_rows = 32, .drain_timeout_ms = 5000,
	};
	sampler_params_default(&o->sp);
	int c, li = -1;
	double v;
	while ((c = getopt_long(argc, argv, "m:p:n:t:h", longopts, &li)) != -1) {
		int rc = 0;
		switch (c) {
		case 'm': o->model = optarg; break;
		case 'p': o->prompt = optarg; break;
		case 'n': rc = parse_num(optarg, 0, 1 << 20, &v); o->n_predict = (int)v; break;
		case 't': rc = parse_num(optarg, 1, 1024, &v); o->threads = (uint32_t)v; break;
		case O_CHAT: o->chat = 1; break;
		case O_SYSTEM: o->system = optarg; break;
		case O_TEMP: rc = parse_num(optarg, 0, 100, &v); o->sp.temperature = (float)v; break;
		case O_TOPK: rc = parse_num(optarg, 0, 1 << 24, &v); o->sp.top_k = (uint32_t)v; break;
		case O_TOPP: rc = parse_num(optarg, 0, 1, &v); o->sp.top_p = (float)v; break;
		case O_MINP: rc = parse_num(optarg, 0, 1, &v); o->sp.min_p = (float)v; break;
		case O_REP: rc = parse_num(optarg, 0, 100, &v); o->sp.repeat_penalty = (float)v; break;
		case O_SEED: rc = parse_num(optarg, 0, 18446744073709551615.0, &v); o->sp.seed = (uint64_t)v; break;
		case O_CTX: rc = parse_num(optarg, 1, 1 << 24, &v); o->ctx = (uint32_t)v; break;
		case O_INFO: o->info = 1; break;
		case O_PGLOBAL: o->prefix_global = 1; break;
		case O_SOCKET: o->srv.socket_path = optarg; break;
		case O_SGROUP: o->socket_group = optarg; break;
		case O_MAXSESS: rc = parse_num(optarg, 1, SRV_MAX_SESSIONS, &v); o->srv.max_sessions = (uint32_t)v; break;
		case O_MAXSLOTS: rc = parse_num(optarg, 1, SRV_MAX_SLOTS, &v); o->srv.max_slots = (uint32_t)v; break;
		case O_MAXTOK: rc = parse_num(optarg, 1, 1 << 24, &v); o->srv.max_tokens = (uint32_t)v; break;
		case O_MAXINF: rc = parse_num(optarg, 1, 1 << 20, &v); o->srv.max_inflight = (uint32_t)v; break;
		case O_MAXBATCH: rc = parse_num(optarg, 1, 1 << 16, &v); o->srv.max_batch_rows = (uint32_t)v; break;
		case O_DRAIN: rc = parse_num(optarg, 0, 3600000, &v); o->srv.drain_timeout_ms = (uint32_t)v; break;
		case O_UIDSESS: rc = parse_num(optarg, 1, 1 << 20, &v); o->srv.max_uid_sessions = (uint32_t)v; break;
		case O_UIDINF: rc = parse_num(optarg, 1, 1 << 24, &v); o->srv.max_uid_inflight = (uint32_t)v; break;
		case O_UIDARENA: rc = parse_size(optarg, &o->srv.max_uid_arena); break;
		case O_NOPREFIX: o->srv.no_prefix_cache = 1; break;
		case O_BACKEND: rc = backend_parse(optarg, &o->backend); break;
		case O_KVQUOTA: rc = parse_num(optarg, 1, 1u << 30, &v); o->srv.kv_quota = (uint32_t)v; break;
		case O_LOGLEVEL:
			rc = log_level_parse(optarg) < 0 ? -EINVAL : 0;
			if (!rc)
				log_set_level(log_level_parse(optarg));
			break;
		case O_KVMEM: rc = parse_size(optarg, &o->kv_mem); break;
		case O_KVBLOCKS: rc = parse_num(optarg, 1, 1u << 30, &v); o->kv_blocks = (uint32_t)v; break;
		case O_KVBT:
			rc = parse_num(optarg, 1, 1024, &v);
			o->kv_block_tokens = (uint32_t)v;
			if (!rc && (o->kv_block_tokens & (o->kv_block_tokens - 1)))
				rc = -EINVAL;
			break;
		case O_KVTYPE:
			if (!strcmp(optarg, "f16"))
				o->kv_type = KB_F16;
			else if (!strcmp(optarg, "f32"))
				o->kv_type = KB_F32;
			else if (!strcmp(optarg, "q8_0"))
				o->kv_type = KB_Q8_0;
			else
				rc = -EINVAL;
			break;
		case 'h': usage(stdout); exit(0);
		default: return -EINVAL;
		}
		if (rc) {
			if (li >= 0)
				fprintf(stderr, "kvd: bad value '%s' for --%s\n", optarg, longopts[li].name);
			else
				fprintf(stderr, "kvd: bad value '%s' for -%c\n", optarg, c);
			return rc;
		}
		li = -1;
	}
	if (optind < argc) {
		fprintf(stderr, "kvd: unexpected argument '%s'\n", argv[optind]);
		return -EINVAL;
	}
	if (o->socket_group) {
		struct group *g = getgrnam(o->socket_group);
		if (!g) {
			fprintf(stderr, "kvd: unknown group '%s'\n", o->socket_group);
			return -EINVAL;
		}
		o->srv.socket_gid = g->gr_gid;
	}
	o->srv.prefix_global = o->prefix_global;
	return 0;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void print_info(const struct model *m)
{
	const struct model_hparams *hp = &m->hp;
	const struct gguf_file *f = m->gguf;
	printf("model        %s\n", hp->name);
	printf("architecture %s (GGUF v%u, %llu tensors, %llu metadata keys)\n", hp->arch,
	       f->version, (unsigned long long)f->n_tensors, (unsigned long long)f->n_kv);
	printf("layers       %u\n", hp->n_layers);
	printf("dim          %u (heads %u, kv heads %u, head dim %u)\n", hp->dim, hp->n_heads,
	       hp->n_kv_heads, hp->head_dim);
	printf("ffn          %u\n", hp->ffn_dim);
	printf("vocab        %u\n", hp->vocab);
	printf("context      %u\n", hp->ctx_len);
	printf("rope         theta %g, %u dims\n", (double)hp->rope_theta, hp->rot_dim);
	printf("norm eps     %g\n", (double)hp->norm_eps);
	printf("output       %s\n", hp->tied_output ? "tied to token_embd" : "separate");
	printf("kv per token %zu bytes at f16\n", model_kv_bytes_per_token(m, 2));
	uint64_t counts[GGUF_T_LAST] = {0};
	for (uint64_t i = 0; i < f->n_tensors; i++)
		if (f->tensors[i].type < GGUF_T_LAST)
			counts[f->tensors[i].type]++;
	printf("tensor types");
	for (uint32_t t = 0; t < GGUF_T_LAST; t++)
		if (counts[t])
			printf(" %s:%llu", gguf_type_name(t), (unsigned long long)counts[t]);
	printf("\n");
}

/* Write a token's text through the streaming decoder. */
static void emit(const struct tokenizer *tok, struct tok_decoder *dec, uint32_t id)
{
	char buf[512];
	int n = tok_decoder_feed(tok, dec, id, buf, sizeof(buf));
	if (n > 0)
		fwrite(buf, 1, (size_t)n, stdout);
	fflush(stdout);
}

static int generate(const struct options *o, struct model *m, struct backend *be,
		    struct kvpool *pool)
{
	char err[256];
	struct tokenizer *tok = NULL;
	struct engine *eng = NULL;
	struct sampler *smp = NULL;
	struct engine_seq seq;
	int have_seq = 0;
	struct engine_row *rows = NULL;
	uint32_t *ids = NULL;
	float *logits = NULL;
	char *text = NULL;
	int rc = tokenizer_create(&tok, m->gguf, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "kvd: tokenizer: %s\n", err);
		return rc;
	}
	const char *input = o->prompt;
	if (o->chat) {
		struct chat_msg msgs[2];
		size_t n = 0;
		if (o->system)
			msgs[n++] = (struct chat_msg){ "system", o->system };
		msgs[n++] = (struct chat_msg){ "user", o->prompt };
		int need = tokenizer_chat_format(tok, msgs, n, 1, NULL, 0);
		if (need < 0) {
			fprintf(stderr, "kvd: this model has no chat template kvd understands\n");
			rc = need;
			goto out;
		}
		text = malloc((size_t)need + 1);
		if (!text) {
			rc = -ENOMEM;
			goto out;
		}
		tokenizer_chat_format(tok, msgs, n, 1, text, (size_t)need + 1);
		input = text;
	}
	uint32_t ctx = o->ctx && o->ctx < m->hp.ctx_len ? o->ctx : m->hp.ctx_len;
	int n_prompt = tokenizer_encode(tok, input, strlen(input), tokenizer_add_bos(tok), o->chat,
					NULL, 0);
	if (n_prompt <= 0) {
		fprintf(stderr, "kvd: the prompt encodes to no tokens\n");
		rc = n_prompt < 0 ? n_prompt : -EINVAL;
		goto out;
	}
	if ((uint32_t)n_prompt + (uint32_t)o->n_predict > ctx) {
		fprintf(stderr, "kvd: prompt (%d tokens) plus %d to generate exceed the context (%u)\n",
			n_prompt, o->n_predict, ctx);
		rc = -E2BIG;
		goto out;
	}
	ids = malloc(((size_t)n_prompt + (size_t)o->n_predict) * sizeof(uint32_t));
	rows = calloc(PREFILL_ROWS, sizeof(*rows));
	logits = malloc((size_t)m->hp.vocab * sizeof(float));
	if (!ids || !rows || !logits) {
		rc = -ENOMEM;
		goto out;
	}
	tokenizer_encode(tok, input, strlen(input), tokenizer_add_bos(tok), o->chat, ids,
			 (size_t)n_prompt);
	if ((rc = engine_create(&eng, m, be, pool, PREFILL_ROWS)) ||
	    (rc = sampler_create(&smp, &o->sp, m->hp.vocab))) {
		fprintf(stderr, "kvd: cannot set up generation: %s\n", strerror(-rc));
		goto out;
	}
	/* The prefix-cache namespace: the user, so one user cannot time another's prompts. */
	engine_seq_init(eng, &seq, o->prefix_global ? 0 : (uint32_t)getuid());
	have_seq = 1;

	/* Prefill: the whole prompt, PREFILL_ROWS positions per pass; logits of the last only. */
	double t0 = now_s();
	for (int p = 0; p < n_prompt; p += PREFILL_ROWS) {
		uint32_t c = (uint32_t)(n_prompt - p) < PREFILL_ROWS ? (uint32_t)(n_prompt - p) : PREFILL_ROWS;
		for (uint32_t i = 0; i < c; i++)
			rows[i] = (struct engine_row){ &seq, (uint32_t)p + i, ids[p + i],
						       (uint32_t)p + i == (uint32_t)n_prompt - 1 };
		if ((rc = engine_forward(eng, rows, c, logits)))
			goto out_fwd;
	}
	double t1 = now_s();

	/* Decode: one row per step reading the cache. */
	struct tok_decoder dec = {0};
	int n_gen = 0;
	double t2 = now_s();
	for (; n_gen < o->n_predict; n_gen++) {
		uint32_t id = sampler_sample(smp, logits, ids, (size_t)n_prompt + n_gen);
		ids[n_prompt + n_gen] = id;
		if (tokenizer_is_eog(tok, id)) {
			n_gen++;
			break;
		}
		emit(tok, &dec, id);
		if (n_gen + 1 == o->n_predict) {
			n_gen++;
			break;
		}
		struct engine_row r = { &seq, (uint32_t)(n_prompt + n_gen), id, 1 };
		if ((rc = engine_forward(eng, &r, 1, logits)))
			goto out_fwd;
	}
	double t3 = now_s();
	char tail[16];
	int nt = tok_decoder_flush(&dec, tail, sizeof(tail));
	if (nt > 0)
		fwrite(tail, 1, (size_t)nt, stdout);
	printf("\n");
	fprintf(stderr, "kvd: prefill %d tokens in %.3f s (%.1f tok/s), decode %d tokens in %.3f s (%.1f tok/s), %u threads, %s backend\n",
		n_prompt, t1 - t0, n_prompt / (t1 - t0), n_gen, t3 - t2,
		n_gen > 1 ? (n_gen - 1) / (t3 - t2) : 0.0, be->n_threads, be->ops->name);
	goto out;
out_fwd:
	fprintf(stderr, "kvd: forward pass failed: %s\n", strerror(-rc));
out:
	sampler_destroy(smp);
	if (have_seq)
		engine_seq_release(eng, &seq);
	engine_destroy(eng);
	tokenizer_destroy(tok);
	free(rows);
	free(ids);
	free(logits);
	free(text);
	return rc;
}

/* The default endpoint: /run/kvd/kvd.sock for root, the user's runtime dir otherwise. */
static const char *default_socket(char *buf, size_t len)
{
	if (geteuid() == 0) {
		mkdir("/run/kvd", 0755);
		return "/run/kvd/kvd.sock";
	}
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	if (xdg && *xdg)
		snprintf(buf, len, "%s/kvd.sock", xdg);
	else
		snprintf(buf, len, "/run/user/%u/kvd.sock", (unsigned)getuid());
	return buf;
}

static int serve(struct options *o, struct model *m, struct backend *be, struct kvpool *pool)
{
	char err[256], path[256];
	struct tokenizer *tok;
	struct server *srv;
	int rc = tokenizer_create(&tok, m->gguf, err, sizeof(err));
	if (rc) {
		log_msg(LOG_ERR, "tokenizer: %s", err);
		return rc;
	}
	if (!o->srv.socket_path)
		o->srv.socket_path = default_socket(path, sizeof(path));
	rc = server_create(&srv, &o->srv, m, tok, be, pool);
	if (!rc) {
		log_msg(LOG_NOTICE, "model %s, %s backend (%u threads)", m->hp.name,
			be->ops->name, be->n_threads);
		rc = server_run(srv);
		server_destroy(srv);
	}
	tokenizer_destroy(tok);
	return rc;
}

/* The KV pool, reserved once: --kv-blocks, else --kv-mem, else 64k tokens. */
static int make_pool(const struct options *o, const struct model *m, struct backend *be,
		     struct kvpool **out)
{
	struct kvpool_config pc = {
		.block_tokens = o->kv_block_tokens, .n_layers = m->hp.n_layers,
		.kv_dim = m->hp.kv_dim, .kv_type = o->kv_type,
	};
	size_t tok = kvpool_token_bytes(pc.kv_type, pc.n_layers, pc.kv_dim);
	size_t blk = tok * pc.block_tokens;
	if (o->kv_blocks)
		pc.n_blocks = o->kv_blocks;
	else if (o->kv_mem)
		pc.n_blocks = (uint32_t)(o->kv_mem / blk < UINT32_MAX ? o->kv_mem / blk : UINT32_MAX);
	else
		pc.n_blocks = (65536 + pc.block_tokens - 1) / pc.block_tokens;
	if (pc.n_blocks == 0) {
		fprintf(stderr, "kvd: --kv-mem is smaller than one block (%zu bytes)\n", blk);
		return -EINVAL;
	}
	int rc = kvpool_create_on(out, &pc, be);
	if (rc) {
		fprintf(stderr, "kvd: cannot reserve the KV pool (%u blocks of %zu bytes): %s\n",
			pc.n_blocks, blk, strerror(-rc));
		return rc;
	}
	fprintf(stderr, "kvd: KV cache %s: %zu bytes per token (2 x %u layers x %u kv_dim x %s), pool %u blocks x %u tokens = %llu tokens, %.1f MiB\n",
		o->kv_type == KB_F32 ? "f32" : o->kv_type == KB_Q8_0 ? "q8_0" : "f16", tok,
		pc.n_layers, pc.kv_dim, o->kv_type == KB_F32 ? "4 B" : o->kv_type == KB_Q8_0 ? "34/32 B" : "2 B",
		pc.n_blocks, pc.block_tokens, (unsigned long long)pc.n_blocks * pc.block_tokens,
		(double)blk * pc.n_blocks / (1 << 20));
	return 0;
}

int main(int argc, char **argv)
{
	struct options o = {0};
	if (parse_args(argc, argv, &o)) {
		usage(stderr);
		return 2;
	}
	char err[256];
	struct model *m;
	int rc = model_load(&m, o.model, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "kvd: %s: %s\n", o.model, err);
		return 1;
	}
	if (o.info) {
		print_info(m);
		model_free(m);
		return 0;
	}
	if (!o.prompt) {
		/* The daemon takes SIGTERM/SIGINT through a signalfd: block them before any thread exists. */
		sigset_t set;
		sigemptyset(&set);
		sigaddset(&set, SIGTERM);
		sigaddset(&set, SIGINT);
		pthread_sigmask(SIG_BLOCK, &set, NULL);
	}
	struct backend *be;
	char why[512];
	if ((rc = backend_create(&be, o.backend, o.threads, why, sizeof(why)))) {
		log_msg(LOG_ERR, "%s: %s", why, strerror(-rc));
		model_free(m);
		return 1;
	}
	log_msg(LOG_NOTICE, "%s", why);
	struct kvpool *pool;
	if ((rc = make_pool(&o, m, be, &pool))) {
		be->ops->destroy(be);
		model_free(m);
		return 1;
	}
	if (o.prompt)
		rc = generate(&o, m, be, pool);
	else
		rc = serve(&o, m, be, pool);
	kvpool_destroy(pool);
	be->ops->destroy(be);
	model_free(m);
	return rc ? 1 : 0;
}
