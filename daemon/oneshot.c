/* oneshot.c — `kvd --prompt` (generate in-process and exit) and `kvd --info`, on engine/generate. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "daemon/config.h"
#include "daemon/log.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/generate.h"
#include "daemon/engine/kvpool.h"
#include "daemon/engine/sampler.h"
#include "daemon/model/gguf.h"
#include "daemon/model/model.h"
#include "daemon/oneshot.h"
#include "daemon/tokenizer/tokenizer.h"
#include "kernels/backend.h"

#define PREFILL_ROWS 512

/* MemAvailable from /proc/meminfo in bytes; 0 when it cannot be read. */
static uint64_t mem_available(void)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[128];
	unsigned long long kib = 0;
	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1)
			break;
	if (f)
		fclose(f);
	return (uint64_t)kib * 1024;
}

/* What the architecture adds to Llama's pass, in words. */
static void info_arch(const struct model *m)
{
	const struct model_hparams *hp = &m->hp;
	printf("forward      %s:", model_arch_name(hp->arch_id));
	printf(" %s RoPE", hp->rope_neox ? "NeoX" : "adjacent-pair");
	printf(", %s", hp->act == MODEL_ACT_GELU ? "GeGLU" : "SwiGLU");
	if (hp->qkv_bias)
		printf(", Q/K/V biases");
	if (m->layers && m->layers[0].wk.data == (const uint8_t *)m->layers[0].wq.data +
						  (size_t)hp->q_dim * m->layers[0].wq.row_bytes)
		printf(", fused attn_qkv");
	if (hp->embd_scale != 0.0f)
		printf(", embeddings x %g", (double)hp->embd_scale);
	if (hp->post_norms)
		printf(", post-norms");
	if (hp->attn_softcap != 0.0f || hp->final_softcap != 0.0f)
		printf(", soft-caps %g / %g", (double)hp->attn_softcap, (double)hp->final_softcap);
	if (hp->swa_window)
		printf(", sliding window %u on alternate layers", hp->swa_window);
	printf("\n");
}

static void info_memory(const struct model *m, const struct kvd_options *o)
{
	const struct model_hparams *hp = &m->hp;
	size_t row = kvpool_row_bytes((uint32_t)o->kv_type, hp->kv_dim);
	size_t per_token = 2 * (size_t)hp->n_layers * row;
	printf("weights      %llu bytes (%.2f GiB), %s\n", (unsigned long long)m->weight_bytes,
	       (double)m->weight_bytes / (1u << 30),
	       m->gguf->copied ? "read into memory (the file is writable by others)"
			       : "mapped from the file, not copied");
	printf("kv per token %zu bytes at %s\n", per_token, kb_type_name((uint32_t)o->kv_type));
	/* The mapped weights must stay resident too: only what is left over holds KV. */
	uint64_t avail = mem_available();
	uint64_t left = avail > m->weight_bytes ? avail - m->weight_bytes : 0;
	uint64_t fit = per_token ? left / per_token : 0;
	printf("fits         %llu tokens of KV = (MemAvailable %llu - weights) / kv per token",
	       (unsigned long long)fit, (unsigned long long)avail);
	if (fit >= hp->max_ctx)
		printf("; one sequence of the full %u positions\n", hp->max_ctx);
	else
		printf("; one sequence of at most %llu positions\n", (unsigned long long)fit);
	/*
	 * The CPU backend's SIMD kernels read a repacked copy of each quantised
	 * matrix, made at the first matmul: about the weights' bytes once more.
	 */
	left = left > m->weight_bytes ? left - m->weight_bytes : 0;
	printf("             %llu tokens on the CPU backend, which keeps a repacked copy of the "
	       "weights\n", (unsigned long long)(per_token ? left / per_token : 0));
}

void oneshot_info(const struct model *m, const struct kvd_options *o)
{
	const struct model_hparams *hp = &m->hp;
	const struct gguf_file *f = m->gguf;
	printf("model        %s\n", hp->name);
	printf("architecture %s (GGUF v%u, %llu tensors, %llu metadata keys)\n", hp->arch,
	       f->version, (unsigned long long)f->n_tensors, (unsigned long long)f->n_kv);
	info_arch(m);
	printf("layers       %u\n", hp->n_layers);
	printf("dim          %u (heads %u, kv heads %u, head dim %u)\n", hp->dim, hp->n_heads,
	       hp->n_kv_heads, hp->head_dim);
	printf("ffn          %u\n", hp->ffn_dim);
	printf("vocab        %u\n", hp->vocab);
	if (hp->ctx_len < hp->train_ctx)
		printf("context      %u (ctx; trained %u)\n", hp->ctx_len, hp->train_ctx);
	else
		printf("context      %u\n", hp->ctx_len);
	if (hp->max_ctx > hp->train_ctx)
		printf("max context  %u (%s RoPE scaling by %g of %u)\n", hp->max_ctx,
		       hp->rope_scaling, (double)hp->rope_factor, hp->rope_orig_ctx);
	printf("rope         theta %g, %u dims, scaling %s%s\n", (double)hp->rope_theta, hp->rot_dim,
	       hp->rope_scaling, m->rope.h_freq_factors ? ", frequency factors" : "");
	printf("norm eps     %g\n", (double)hp->norm_eps);
	printf("output       %s\n", hp->tied_output ? "tied to token_embd" : "separate");
	info_memory(m, o);
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

/*
 * The prompt's ids into out (cap of them; NULL counts). With --chat the
 * user's and system's text is plain text inside the template, as the
 * daemon reads a CHAT request: "<|im_end|>" typed by a user stays text.
 */
static int encode_prompt(const struct kvd_options *o, const struct tokenizer *tok, uint32_t *out,
			 size_t cap)
{
	if (!o->chat)
		return tokenizer_encode(tok, o->prompt, strlen(o->prompt), tokenizer_add_bos(tok), 0,
					out, cap);
	struct chat_msg msgs[2];
	size_t n = 0;
	if (o->system)
		msgs[n++] = (struct chat_msg){ "system", o->system };
	msgs[n++] = (struct chat_msg){ "user", o->prompt };
	int rc = tokenizer_chat_encode(tok, msgs, n, 0, out, cap);
	if (rc == -ENOTSUP)
		fprintf(stderr, "kvd: this model has no chat template kvd can run (see --chat-template)\n");
	else if (rc == -EINVAL)
		fprintf(stderr, "kvd: the chat template refuses these messages\n");
	return rc;
}

/* The prompt's token ids (*ids, *n; the caller frees), checked against the context. */
static int prompt_tokens(const struct kvd_options *o, const struct tokenizer *tok, uint32_t ctx,
			 uint32_t **ids, uint32_t *n)
{
	int rc = 0, n_prompt = encode_prompt(o, tok, NULL, 0);
	if (n_prompt <= 0) {
		if (n_prompt == 0)
			fprintf(stderr, "kvd: the prompt encodes to no tokens\n");
		rc = n_prompt < 0 ? n_prompt : -EINVAL;
	} else if ((uint32_t)n_prompt + (uint32_t)o->n_predict > ctx) {
		fprintf(stderr, "kvd: prompt (%d tokens) plus %d to generate exceed the context (%u)\n",
			n_prompt, o->n_predict, ctx);
		rc = -E2BIG;
	} else if (!(*ids = malloc((size_t)n_prompt * sizeof(uint32_t)))) {
		rc = -ENOMEM;
	} else if ((rc = encode_prompt(o, tok, *ids, (size_t)n_prompt)) != n_prompt) {
		/* The count was a dry run; the fill allocates too and may fail. */
		free(*ids);
		*ids = NULL;
		rc = rc < 0 ? rc : -EIO;
	} else {
		*n = (uint32_t)n_prompt;
		rc = 0;
	}
	return rc;
}

struct printer {
	const struct tokenizer *tok;
	struct tok_decoder dec;
	int tty;		/* stderr is a terminal: a long prefill shows its progress there */
	uint64_t t0;		/* the prefill's start */
	int shown;		/* a progress line is on the terminal */
};

/* Take the progress line off the terminal, so what follows starts a clean line. */
static void erase_progress(struct printer *pr)
{
	if (pr->shown)
		fputs("\r\033[K", stderr);
	pr->shown = 0;
}

/* After each prefill pass: a line that updates in place once the prefill has taken a second. */
static void print_progress(void *arg, uint32_t done, uint32_t total)
{
	struct printer *pr = arg;
	if (done >= total)
		erase_progress(pr);
	else if (pr->tty && log_now_ns() - pr->t0 >= 1000000000ull) {
		fprintf(stderr, "\rprefill %u/%u positions", done, total);
		pr->shown = 1;
	}
}

/* Each token's text through the streaming decoder, as it comes; an end token prints nothing. */
static int print_token(void *arg, uint32_t id, int eog)
{
	struct printer *pr = arg;
	char buf[512];
	if (eog)
		return 0;
	int n = tok_decoder_feed(pr->tok, &pr->dec, id, buf, sizeof(buf));
	if (n > 0)
		fwrite(buf, 1, (size_t)n, stdout);
	fflush(stdout);
	return 0;
}

static void print_speed(const struct generate_result *r, const struct backend *be)
{
	double pre = (double)r->prefill_ns * 1e-9, dec = (double)r->decode_ns * 1e-9;
	if (!r->n_out) {
		fprintf(stderr, "kvd: prefill %u tokens in %.3f s (%.1f tok/s), %u threads, %s backend\n",
			r->n_prompt, pre, r->n_prompt / pre, be->n_threads, be->ops->name);
		return;
	}
	fprintf(stderr, "kvd: prefill %u tokens in %.3f s (%.1f tok/s), decode %u tokens in %.3f s (%.1f tok/s), %u threads, %s backend\n",
		r->n_prompt, pre, r->n_prompt / pre, r->n_out, dec,
		r->n_out > 1 ? (r->n_out - 1) / dec : 0.0, be->n_threads, be->ops->name);
}

/* Generate from ids (n,) and print it; the engine and sampler live only for this. */
static int run(const struct kvd_options *o, struct model *m, struct backend *be,
	       struct kvpool *pool, const struct tokenizer *tok, const uint32_t *ids, uint32_t n,
	       uint32_t ctx)
{
	struct engine *eng = NULL;
	struct sampler *smp = NULL;
	int rc;
	if ((rc = engine_create(&eng, m, be, pool, PREFILL_ROWS)) ||
	    (rc = sampler_create(&smp, &o->sp, m->hp.vocab))) {
		fprintf(stderr, "kvd: cannot set up generation: %s\n", strerror(-rc));
		goto out;
	}
	struct printer pr = { .tok = tok, .tty = isatty(2), .t0 = log_now_ns() };
	struct generate_params gp = { .max_tokens = (uint32_t)o->n_predict, .ctx = ctx, .tok = tok,
				      .on_token = print_token, .on_prefill = print_progress, .arg = &pr };
	struct generate_result res;
	struct engine_seq seq;
	/* The prefix-cache namespace: the user, so one user cannot time another's prompts. */
	engine_seq_init(eng, &seq, o->srv.prefix_global ? 0 : (uint32_t)getuid());
	rc = generate(eng, smp, &seq, ids, n, &gp, &res);
	uint32_t cached = engine_seq_len(&seq);
	engine_seq_release(eng, &seq);
	erase_progress(&pr);
	if (rc) {
		fprintf(stderr, "kvd: forward pass failed: %s\n", strerror(-rc));
		goto out;
	}
	if (o->n_predict == 0) {
		/* Prefill only is a request of its own (kvctl says the same): no text, not even a newline. */
		fprintf(stderr, "prefill only: %u prompt positions cached, no tokens generated\n", cached);
	} else {
		char tail[16];
		int nt = tok_decoder_flush(&pr.dec, tail, sizeof(tail));
		if (nt > 0)
			fwrite(tail, 1, (size_t)nt, stdout);
		printf("\n");
	}
	print_speed(&res, be);
out:
	sampler_destroy(smp);
	engine_destroy(eng);
	return rc;
}

int oneshot_prompt(const struct kvd_options *o, struct model *m, struct backend *be,
		   oneshot_pool_fn make_pool)
{
	char err[256];
	struct tokenizer *tok;
	struct kvpool *pool = NULL;
	uint32_t *ids = NULL, n = 0;
	int rc = tokenizer_for_model(&tok, m, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "kvd: tokenizer: %s\n", err);
		return rc;
	}
	rc = tokenizer_chat_select(tok, o->chat_template, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "kvd: %s\n", err);
		tokenizer_destroy(tok);
		return rc;
	}
	uint32_t ctx = m->hp.ctx_len;	/* --ctx applied: model_set_ctx */
	rc = prompt_tokens(o, tok, ctx, &ids, &n);
	/* One request's positions: prompt_tokens checked they fit the context. */
	if (!rc)
		rc = make_pool(o, m, be, n + (uint32_t)o->n_predict, &pool);
	if (!rc)
		rc = run(o, m, be, pool, tok, ids, n, ctx);
	if (pool)
		kvpool_destroy(pool);
	free(ids);
	tokenizer_destroy(tok);
	return rc;
}
