/* main.c — kvd's entry point: the daemon, the in-process run (--prompt) and model inspection (--info). */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "daemon/config.h"
#include "daemon/engine/engine.h"
#include "daemon/model/gguf.h"
#include "daemon/engine/kvpool.h"
#include "daemon/log.h"
#include "daemon/serve/server.h"
#include "daemon/serve/service.h"
#include "daemon/model/model.h"
#include "daemon/serve/obs.h"
#include "daemon/engine/sampler.h"
#include "daemon/tokenizer/tokenizer.h"
#include "kernels/backend.h"

#define PREFILL_ROWS 512

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvd [--model PATH] [daemon options]      serve clients on a socket\n"
		"       kvd [--model PATH] --prompt TEXT [options]  generate in-process and exit\n"
		"       kvd [--model PATH] --info\n"
		"       kvd [options] --print-config                 show the effective configuration\n"
		"\n"
		"Every daemon option can also be set in the configuration file as\n"
		"`name = value` (see kvd.conf(5)); the command line wins over the file.\n"
		"      --config PATH       configuration file (default $KVD_CONFIG or " CONFIG_DEFAULT_PATH ")\n"
		"      --print-config      print each option's value and where it came from, and exit\n"
		"\n"
		"daemon:\n"
		"      --socket PATH       endpoint (default $RUNTIME_DIRECTORY/kvd.sock under systemd,\n"
		"                          /run/kvd/kvd.sock as root, else $XDG_RUNTIME_DIR/kvd.sock);\n"
		"                          a socket passed by systemd (kvd.socket) takes precedence\n"
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
		"      --kv-quota BLOCKS   KV blocks one uid may hold (default 0: no quota)\n"
		"      --no-prefix-cache   never reuse cached prompt prefixes\n"
		"      --drain-timeout MS  on SIGTERM, finish in-flight work for at most MS (default 5000)\n"
		"      --log-level L       err, warning, notice (default), info, debug\n"
		"      --bpf MODE          metrics programs on the USDT probes: auto (default: load\n"
		"                          when CAP_BPF is held), on (failure is fatal), off\n"
		"      --backend B         auto (CUDA when a device is present), cpu, cuda\n"
		"  SIGHUP re-reads the file: log-level, the max-* limits, kv-quota, drain-timeout\n"
		"  and no-prefix-cache change live; the rest is logged as needing a restart.\n"
		"\n"
		"generation and model:\n"
		"  -m, --model PATH        GGUF model (default $KVD_MODEL or " CONFIG_DEFAULT_MODEL ",\n"
		"                          under $STATE_DIRECTORY when systemd sets it)\n"
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
		"  -t, --threads N         compute threads (default 0: all cores)\n"
		"      --ctx N             context length (default 0: the model's)\n"
		"      --kv-mem BYTES      KV-cache pool size (suffix K, M, G; default: 64k tokens)\n"
		"      --kv-blocks N       KV-cache pool size in blocks (instead of --kv-mem)\n"
		"      --kv-block-tokens N tokens per KV block, a power of two (default 16)\n"
		"      --kv-type T         K/V element type: f16 (default), f32, q8_0\n"
		"      --prefix-global     share cached prompt prefixes across users (default: per uid)\n"
		"      --info              print the model's metadata and exit\n"
		"  -h, --help\n");
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
			printf(" %s:%llu", kb_type_name(t), (unsigned long long)counts[t]);
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

static int generate(const struct kvd_options *o, struct model *m, struct backend *be,
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
	engine_seq_init(eng, &seq, o->srv.prefix_global ? 0 : (uint32_t)getuid());
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

/* SIGHUP, on the loop thread: the file and command line again; the live values into *live. */
static void reload_config(void *arg, struct server_config *live)
{
	config_reload(arg, live);
}

static int serve(struct kvd_options *o, struct model *m, struct backend *be, struct kvpool *pool)
{
	char err[256], path[256];
	struct tokenizer *tok;
	struct server *srv;
	int rc = tokenizer_create(&tok, m->gguf, err, sizeof(err));
	if (rc) {
		log_msg(LOG_ERR, "tokenizer: %s", err);
		return rc;
	}
	if (!o->srv.socket_path) {
		o->srv.socket_path = config_default_socket(path, sizeof(path));
		if (!strcmp(o->srv.socket_path, "/run/kvd/kvd.sock"))
			mkdir("/run/kvd", 0755);
	}
	o->srv.reload = reload_config;
	o->srv.reload_arg = o;
	static const char *const bpf_mode[] = { [CONFIG_BPF_AUTO] = "auto", [CONFIG_BPF_ON] = "on",
						[CONFIG_BPF_OFF] = "off" };
	struct kvd_bpf *obs;
	rc = obs_start(bpf_mode[o->bpf], &obs);
	if (!rc)
		rc = server_create(&srv, &o->srv, m, tok, be, pool);
	if (!rc) {
		log_msg(LOG_NOTICE, "model %s, %s backend (%u threads)", m->hp.name,
			be->ops->name, be->n_threads);
		rc = server_run(srv);
		server_destroy(srv);
	}
	obs_stop(obs);
	tokenizer_destroy(tok);
	return rc;
}

/* The KV pool, reserved once: --kv-blocks, else --kv-mem, else 64k tokens. */
static int make_pool(const struct kvd_options *o, const struct model *m, struct backend *be,
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
		log_msg(LOG_ERR, "kv-mem is smaller than one block (%zu bytes)", blk);
		return -EINVAL;
	}
	int rc = kvpool_create_on(out, &pc, be);
	if (rc) {
		log_msg(LOG_ERR, "cannot reserve the KV pool (%u blocks of %zu bytes): %s",
			pc.n_blocks, blk, strerror(-rc));
		return rc;
	}
	log_msg(LOG_NOTICE, "KV cache %s: %zu bytes per token (2 x %u layers x %u kv_dim x %s), pool %u blocks x %u tokens = %llu tokens, %.1f MiB\n",
		o->kv_type == KB_F32 ? "f32" : o->kv_type == KB_Q8_0 ? "q8_0" : "f16", tok,
		pc.n_layers, pc.kv_dim, o->kv_type == KB_F32 ? "4 B" : o->kv_type == KB_Q8_0 ? "34/32 B" : "2 B",
		pc.n_blocks, pc.block_tokens, (unsigned long long)pc.n_blocks * pc.block_tokens,
		(double)blk * pc.n_blocks / (1 << 20));
	return 0;
}

/* The compute backend: --backend auto and cpu get the CPU one until a CUDA backend exists. */
int main(int argc, char **argv)
{
	struct kvd_options o;
	char err[512];
	int rc = config_load(&o, argc, argv, err, sizeof(err));
	if (rc || o.help) {
		if (rc)
			log_msg(LOG_ERR, "%s (`kvd --help` lists the options)", err);
		else
			usage(stdout);
		config_free(&o);
		return rc ? 2 : 0;
	}
	if (o.print_config) {
		config_print(&o, stdout);
		config_free(&o);
		return 0;
	}
	log_set_level(o.log_level);
	int daemon = !o.prompt && !o.info;
	if (daemon) {
		/*
		 * The daemon takes SIGTERM/SIGINT/SIGHUP through a signalfd: block
		 * them before any thread exists, so none of them gets one.
		 */
		sigset_t set;
		sigemptyset(&set);
		sigaddset(&set, SIGTERM);
		sigaddset(&set, SIGINT);
		sigaddset(&set, SIGHUP);
		pthread_sigmask(SIG_BLOCK, &set, NULL);
		service_notify("STATUS=loading model %s", o.model);
	}
	struct model *m;
	rc = model_load(&m, o.model, err, sizeof(err));
	if (rc) {
		log_msg(LOG_ERR, "%s: %s", o.model, err);
		config_free(&o);
		return 1;
	}
	if (o.info) {
		print_info(m);
		model_free(m);
		config_free(&o);
		return 0;
	}
	struct backend *be;
	char why[512];
	static const enum kb_kind kinds[] = { [CONFIG_BACKEND_AUTO] = KB_BACKEND_AUTO,
					      [CONFIG_BACKEND_CPU] = KB_BACKEND_CPU,
					      [CONFIG_BACKEND_CUDA] = KB_BACKEND_CUDA };
	if ((rc = backend_create(&be, kinds[o.backend], o.threads, why, sizeof(why)))) {
		log_msg(LOG_ERR, "%s: %s", why, strerror(-rc));
		model_free(m);
		config_free(&o);
		return 1;
	}
	log_msg(LOG_NOTICE, "%s", why);
	struct kvpool *pool;
	if (daemon)
		service_notify("STATUS=reserving the KV pool");
	if ((rc = make_pool(&o, m, be, &pool))) {
		be->ops->destroy(be);
		model_free(m);
		config_free(&o);
		return 1;
	}
	if (o.prompt)
		rc = generate(&o, m, be, pool);
	else
		rc = serve(&o, m, be, pool);
	kvpool_destroy(pool);
	be->ops->destroy(be);
	model_free(m);
	config_free(&o);
	return rc ? 1 : 0;
}
