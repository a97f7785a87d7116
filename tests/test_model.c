/* test_model.c — tiny synthetic GGUFs of each architecture: what model_load binds or refuses by name, RoPE scaling, and the forward pass over them. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/engine/engine.h"
#include "daemon/engine/kvpool.h"
#include "daemon/model/gguf.h"
#include "daemon/model/model.h"
#include "kernels/backend.h"
#include "tests/lib/gguf_patch.h"
#include "tests/lib/rng.h"

#define MAX_ROWS 64

#define T_DIM 64
#define T_HEADS 4
#define T_KV 2
#define T_FFN 96
#define T_VOCAB 48
#define T_LAYERS 3
#define T_CTX 256

/* What a converter would write for one architecture, in miniature. */
struct tiny_cfg {
	const char *arch;
	uint32_t head_dim;		/* 0: dim / heads, and no key_length */
	int fused_qkv, fused_up, biases, post_norms, output;
	int rope_freqs;			/* 1: rope_freqs.weight of factors 1 + i / 4 */
	const struct gguf_add_kv *kv;	/* more keys */
	int n_kv;
	const char *extra;		/* one more 1-D tensor of 8 elements */
	const char *drop;		/* a tensor to leave out */
};

struct tiny_tensor {
	char name[48];
	uint64_t ne0, ne1;		/* ne1 1: a vector */
	int kind;			/* 0 weight, 1 norm, 2 rope factors */
};

static uint32_t tiny_head(const struct tiny_cfg *c)
{
	return c->head_dim ? c->head_dim : T_DIM / T_HEADS;
}

static void tt_add(struct tiny_tensor *t, int *n, const struct tiny_cfg *c, int kind,
		   uint64_t ne0, uint64_t ne1, const char *fmt, ...)
{
	struct tiny_tensor *x = &t[*n];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(x->name, sizeof(x->name), fmt, ap);
	va_end(ap);
	if (c->drop && !strcmp(c->drop, x->name))
		return;
	x->ne0 = ne0, x->ne1 = ne1, x->kind = kind;
	(*n)++;
}

/* The tensors of c, in the order llama.cpp's converter writes them; returns how many. */
static int tiny_tensors(const struct tiny_cfg *c, struct tiny_tensor *t)
{
	const uint64_t hd = tiny_head(c), qd = T_HEADS * hd, kvd = T_KV * hd;
	int n = 0;
	tt_add(t, &n, c, 0, T_DIM, T_VOCAB, "token_embd.weight");
	if (c->rope_freqs)
		tt_add(t, &n, c, 2, hd / 2, 1, "rope_freqs.weight");
	for (int l = 0; l < T_LAYERS; l++) {
		tt_add(t, &n, c, 1, T_DIM, 1, "blk.%d.attn_norm.weight", l);
		if (c->fused_qkv) {
			tt_add(t, &n, c, 0, T_DIM, qd + 2 * kvd, "blk.%d.attn_qkv.weight", l);
		} else {
			tt_add(t, &n, c, 0, T_DIM, qd, "blk.%d.attn_q.weight", l);
			tt_add(t, &n, c, 0, T_DIM, kvd, "blk.%d.attn_k.weight", l);
			tt_add(t, &n, c, 0, T_DIM, kvd, "blk.%d.attn_v.weight", l);
		}
		if (c->biases) {
			tt_add(t, &n, c, 0, qd, 1, "blk.%d.attn_q.bias", l);
			tt_add(t, &n, c, 0, kvd, 1, "blk.%d.attn_k.bias", l);
			tt_add(t, &n, c, 0, kvd, 1, "blk.%d.attn_v.bias", l);
		}
		tt_add(t, &n, c, 0, qd, T_DIM, "blk.%d.attn_output.weight", l);
		if (c->post_norms)
			tt_add(t, &n, c, 1, T_DIM, 1, "blk.%d.post_attention_norm.weight", l);
		tt_add(t, &n, c, 1, T_DIM, 1, "blk.%d.ffn_norm.weight", l);
		if (c->fused_up) {
			tt_add(t, &n, c, 0, T_DIM, 2 * T_FFN, "blk.%d.ffn_up.weight", l);
		} else {
			tt_add(t, &n, c, 0, T_DIM, T_FFN, "blk.%d.ffn_gate.weight", l);
			tt_add(t, &n, c, 0, T_DIM, T_FFN, "blk.%d.ffn_up.weight", l);
		}
		tt_add(t, &n, c, 0, T_FFN, T_DIM, "blk.%d.ffn_down.weight", l);
		if (c->post_norms)
			tt_add(t, &n, c, 1, T_DIM, 1, "blk.%d.post_ffw_norm.weight", l);
	}
	tt_add(t, &n, c, 1, T_DIM, 1, "output_norm.weight");
	if (c->output)
		tt_add(t, &n, c, 0, T_DIM, T_VOCAB, "output.weight");
	if (c->extra)
		tt_add(t, &n, c, 0, 8, 1, "%s", c->extra);
	return n;
}

static void w_kv_u32(struct wbuf *w, const char *arch, const char *suffix, uint32_t v)
{
	char key[96];
	snprintf(key, sizeof(key), "%s.%s", arch, suffix);
	w_key(w, key, GGUF_VT_U32);
	w_u32(w, v);
}

static void w_kv(struct wbuf *w, const struct gguf_add_kv *kv)
{
	w_key(w, kv->key, kv->type);
	if (kv->type == GGUF_VT_STRING)
		w_str(w, kv->str);
	else if (kv->type == GGUF_VT_F32)
		w_bytes(w, &kv->f32, 4);
	else
		w_u32(w, kv->u32);
}

static uint64_t tiny_header(struct wbuf *w, const struct tiny_cfg *c, int n_t)
{
	uint64_t n_kv = 8 + (c->head_dim ? 2 : 0) + (uint64_t)c->n_kv;
	w_bytes(w, "GGUF", 4);
	w_u32(w, 3);
	w_u64(w, (uint64_t)n_t);
	w_u64(w, n_kv);
	w_key(w, "general.architecture", GGUF_VT_STRING);
	w_str(w, c->arch);
	w_kv_u32(w, c->arch, "block_count", T_LAYERS);
	w_kv_u32(w, c->arch, "embedding_length", T_DIM);
	w_kv_u32(w, c->arch, "attention.head_count", T_HEADS);
	w_kv_u32(w, c->arch, "attention.head_count_kv", T_KV);
	w_kv_u32(w, c->arch, "feed_forward_length", T_FFN);
	w_kv_u32(w, c->arch, "context_length", T_CTX);
	char key[96];
	snprintf(key, sizeof(key), "%s.attention.layer_norm_rms_epsilon", c->arch);
	float eps = 1e-5f;
	w_key(w, key, GGUF_VT_F32);
	w_bytes(w, &eps, 4);
	if (c->head_dim) {
		w_kv_u32(w, c->arch, "attention.key_length", c->head_dim);
		w_kv_u32(w, c->arch, "attention.value_length", c->head_dim);
	}
	for (int i = 0; i < c->n_kv; i++)
		w_kv(w, &c->kv[i]);
	return n_kv;
}

/* Write c as a GGUF at path (a mkstemp template); weights small and fixed by each tensor's index. */
static void tiny_write(char *path, const struct tiny_cfg *c)
{
	static struct tiny_tensor t[128];
	int n_t = tiny_tensors(c, t);
	struct wbuf w = { 0 };
	tiny_header(&w, c, n_t);
	uint64_t off = 0;
	for (int i = 0; i < n_t; i++) {
		w_str(&w, t[i].name);
		w_u32(&w, t[i].ne1 > 1 ? 2 : 1);
		w_u64(&w, t[i].ne0);
		if (t[i].ne1 > 1)
			w_u64(&w, t[i].ne1);
		w_u32(&w, GGUF_T_F32);
		w_u64(&w, off);
		off += (t[i].ne0 * t[i].ne1 * 4 + 31) & ~(uint64_t)31;
	}
	w_pad(&w, 32);
	for (int i = 0; i < n_t; i++) {
		/* Seeded by name, so a tensor added or left out changes no other. */
		uint64_t h = 1469598103934665603ull;
		for (const char *p = t[i].name; *p; p++)
			h = (h ^ (uint8_t)*p) * 1099511628211ull;
		struct rng r = rng_make(h);
		for (uint64_t j = 0; j < t[i].ne0 * t[i].ne1; j++) {
			float v = t[i].kind == 1 ? 1.0f + 0.2f * rng_sym(&r)
				: t[i].kind == 2 ? 1.0f + (float)j / 4.0f
						 : 0.3f * rng_sym(&r);
			w_bytes(&w, &v, 4);
		}
		w_pad(&w, 32);
	}
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	ssize_t wrote = write(fd, w.p, w.len);
	close(fd);
	free(w.p);
	if (wrote != (ssize_t)w.len) {
		unlink(path);
		fail_msg("writing %s failed", path);
	}
}

/* model_load of c; rc, the model in *out (when 0), the refusal in err. */
static int tiny_load(const struct tiny_cfg *c, struct model **out, char *err, size_t errlen)
{
	char path[] = "/tmp/kvd-test-arch-XXXXXX";
	tiny_write(path, c);
	struct model *m = NULL;
	err[0] = 0;
	int rc = model_load(&m, path, err, errlen);
	unlink(path);	/* the mapping outlives the name */
	if (rc)
		assert_null(m);
	*out = m;
	return rc;
}

static struct model *tiny_must(const struct tiny_cfg *c)
{
	struct model *m;
	char err[512];
	if (tiny_load(c, &m, err, sizeof(err)))
		fail_msg("%s: refused: %s", c->arch, err);
	return m;
}

static const uint8_t *tensor_data(const struct model *m, const char *name)
{
	const struct gguf_tensor *t = gguf_find_tensor(m->gguf, name);
	assert_non_null(t);
	return t->data;
}

/* Each architecture binds its own tensors with the shapes its metadata gives. */
static void test_arch_binds(void **state)
{
	(void)state;
	struct tiny_cfg llama = { .arch = "llama", .output = 1 };
	struct model *m = tiny_must(&llama);
	assert_int_equal(m->hp.arch_id, MODEL_ARCH_LLAMA);
	assert_int_equal(m->hp.rope_neox, 0);
	assert_int_equal(m->hp.head_dim, 16);
	assert_int_equal(m->hp.q_dim, T_DIM);
	assert_false(m->hp.tied_output);
	assert_ptr_equal(m->output.data, tensor_data(m, "output.weight"));
	assert_null(m->layers[0].bq);
	assert_null(m->rope.h_freq_factors);
	assert_string_equal(m->hp.rope_scaling, "none");
	assert_int_equal(m->hp.act, MODEL_ACT_SILU);
	assert_true(m->hp.embd_scale == 0.0f && m->hp.final_softcap == 0.0f);
	model_free(m);

	struct tiny_cfg qwen2 = { .arch = "qwen2", .biases = 1 };
	m = tiny_must(&qwen2);
	assert_int_equal(m->hp.rope_neox, 1);
	assert_true(m->hp.qkv_bias);
	assert_true(m->hp.tied_output);
	assert_ptr_equal(m->layers[1].bk, tensor_data(m, "blk.1.attn_k.bias"));
	assert_ptr_equal(m->layers[2].bv, tensor_data(m, "blk.2.attn_v.bias"));
	model_free(m);

	/* Fused weights: views at row offsets of the one tensor, nothing copied. */
	struct tiny_cfg phi3 = { .arch = "phi3", .fused_qkv = 1, .fused_up = 1, .output = 1 };
	m = tiny_must(&phi3);
	const struct model_layer *L = &m->layers[1];
	const uint8_t *qkv = tensor_data(m, "blk.1.attn_qkv.weight");
	const uint8_t *up = tensor_data(m, "blk.1.ffn_up.weight");
	size_t rb = T_DIM * sizeof(float);
	assert_int_equal(m->hp.rope_neox, 1);
	assert_ptr_equal(L->wq.data, qkv);
	assert_ptr_equal(L->wk.data, qkv + (size_t)T_DIM * rb);
	assert_ptr_equal(L->wv.data, qkv + (size_t)(T_DIM + 32) * rb);
	assert_int_equal(L->wq.rows, T_DIM);
	assert_int_equal(L->wk.rows, 32);
	assert_int_equal(L->wv.rows, 32);
	assert_ptr_equal(L->w_gate.data, up);
	assert_ptr_equal(L->w_up.data, up + (size_t)T_FFN * rb);
	assert_int_equal(L->w_gate.rows, T_FFN);
	assert_int_equal(L->w_up.rows, T_FFN);
	model_free(m);

	/* Gemma: output is token_embd even with an LM head absent; embeddings x sqrt(dim). */
	struct tiny_cfg gemma = { .arch = "gemma", .head_dim = 32 };
	m = tiny_must(&gemma);
	assert_true(m->hp.tied_output);
	assert_ptr_equal(m->output.data, m->tok_embd.data);
	assert_true(m->hp.embd_scale == sqrtf((float)T_DIM));
	assert_int_equal(m->hp.act, MODEL_ACT_GELU);
	assert_int_equal(m->hp.head_dim, 32);
	assert_int_equal(m->hp.q_dim, 128);
	assert_int_equal(m->layers[0].wo.cols, 128);
	assert_true(m->hp.attn_scale == 1.0f / sqrtf(32.0f));
	model_free(m);

	/* Gemma 2: post-norms, llama.cpp's default caps, even layers slide. */
	const struct gguf_add_kv g2kv[] = {
		{ "gemma2.attention.sliding_window", GGUF_VT_U32, NULL, 8, 0 },
	};
	struct tiny_cfg gemma2 = { .arch = "gemma2", .post_norms = 1, .kv = g2kv, .n_kv = 1 };
	m = tiny_must(&gemma2);
	assert_ptr_equal(m->layers[2].post_attn_norm,
			 tensor_data(m, "blk.2.post_attention_norm.weight"));
	assert_ptr_equal(m->layers[2].post_ffn_norm, tensor_data(m, "blk.2.post_ffw_norm.weight"));
	assert_true(m->hp.attn_softcap == 50.0f && m->hp.final_softcap == 30.0f);
	assert_int_equal(m->layers[0].window, 8);
	assert_int_equal(m->layers[1].window, 0);
	assert_int_equal(m->layers[2].window, 8);
	model_free(m);

	/* Mistral Nemo: a head size that is not dim / heads. */
	struct tiny_cfg nemo = { .arch = "llama", .head_dim = 24, .output = 1 };
	m = tiny_must(&nemo);
	assert_int_equal(m->hp.q_dim, T_HEADS * 24);
	assert_int_equal(m->hp.kv_dim, T_KV * 24);
	assert_int_equal(m->layers[0].wq.rows, T_HEADS * 24);
	assert_int_equal(m->layers[0].wo.cols, T_HEADS * 24);
	assert_int_equal(m->layers[0].wo.rows, T_DIM);
	assert_int_equal(m->hp.rot_dim, 24);
	assert_int_equal(model_kv_bytes_per_token(m, 2), 2u * T_LAYERS * T_KV * 24 * 2);
	model_free(m);
}

/* What the forward pass would ignore or cannot do is refused, naming the tensor or key. */
static void test_arch_refusals(void **state)
{
	(void)state;
	static const struct gguf_add_kv vlen[] = {
		{ "llama.attention.key_length", GGUF_VT_U32, NULL, 16, 0 },
		{ "llama.attention.value_length", GGUF_VT_U32, NULL, 8, 0 },
	};
	static const struct gguf_add_kv lrope[] = { { "phi3.rope.scaling.type", GGUF_VT_STRING, "longrope", 0, 0 } };
	static const struct gguf_add_kv ascale[] = { { "llama.attention.scale", GGUF_VT_F32, NULL, 0, 0.5f } };
	static const struct gguf_add_kv cap[] = { { "llama.final_logit_softcapping", GGUF_VT_F32, NULL, 0, 30.0f } };
	static const struct gguf_add_kv swab[] = { { "gemma2.rope.freq_base_swa", GGUF_VT_F32, NULL, 0, 500.0f } };
	static const struct gguf_add_kv logmul[] = {
		{ "llama.rope.scaling.type", GGUF_VT_STRING, "yarn", 0, 0 },
		{ "llama.rope.scaling.yarn_log_multiplier", GGUF_VT_F32, NULL, 0, 0.1f },
	};
	static const struct gguf_add_kv both[] = { { "llama.rope.scaling.type", GGUF_VT_STRING, "llama3", 0, 0 } };
	const struct {
		struct tiny_cfg c;
		const char *named;
	} cases[] = {
		{ { .arch = "llama", .kv = vlen, .n_kv = 2 }, "llama.attention.value_length" },
		{ { .arch = "phi3", .fused_qkv = 1, .fused_up = 1, .kv = lrope, .n_kv = 1 }, "phi3.rope.scaling.type" },
		{ { .arch = "phi3", .fused_qkv = 1, .fused_up = 1, .extra = "rope_factors_long.weight" }, "rope_factors_short.weight" },
		{ { .arch = "llama", .kv = ascale, .n_kv = 1 }, "llama.attention.scale" },
		{ { .arch = "llama", .kv = cap, .n_kv = 1 }, "llama.final_logit_softcapping" },
		{ { .arch = "gemma2", .post_norms = 1, .kv = swab, .n_kv = 1 }, "gemma2.rope.freq_base_swa" },
		{ { .arch = "gemma2", .post_norms = 1, .drop = "blk.1.post_ffw_norm.weight" }, "blk.1.post_ffw_norm.weight" },
		{ { .arch = "gemma", .output = 1 }, "output.weight" },
		{ { .arch = "llama", .extra = "blk.0.attn_output.bias" }, "blk.0.attn_output.bias" },
		{ { .arch = "qwen2", .extra = "rope_freqs.weight" }, "rope_freqs.weight" },
		{ { .arch = "llama", .rope_freqs = 1, .kv = both, .n_kv = 1 }, "rope_freqs.weight" },
		{ { .arch = "llama", .kv = logmul, .n_kv = 2 }, "llama.rope.scaling.yarn_log_multiplier" },
		{ { .arch = "phi3", .fused_qkv = 1, .drop = "blk.0.ffn_up.weight" }, "blk.0.ffn_up.weight" },
		{ { .arch = "gpt2" }, "gpt2" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct model *m;
		char err[512];
		int rc = tiny_load(&cases[i].c, &m, err, sizeof(err));
		if (!rc)
			model_free(m);
		if (rc >= 0 || !strstr(err, cases[i].named))
			fail_msg("case %zu (%s): rc %d, '%s' does not name %s", i, cases[i].c.arch, rc,
				 err, cases[i].named);
		printf("refused: %s\n", err);
	}
}

/* Linear, YaRN and llama3 metadata become the rope parameters llama.cpp would pass to ggml. */
static void test_rope_scaling(void **state)
{
	(void)state;
	char err[512];
	static const struct gguf_add_kv lin[] = {
		{ "llama.rope.scaling.type", GGUF_VT_STRING, "linear", 0, 0 },
		{ "llama.rope.scaling.factor", GGUF_VT_F32, NULL, 0, 4.0f },
	};
	struct tiny_cfg c = { .arch = "llama", .kv = lin, .n_kv = 2 };
	struct model *m = tiny_must(&c);
	assert_true(m->rope.freq_scale == 0.25f && m->rope.ext_factor == 0.0f);
	assert_int_equal(m->hp.max_ctx, 4 * T_CTX);
	/* Past the trained context up to what the scaling reaches, by default the trained one. */
	assert_int_equal(model_set_ctx(m, 0, err, sizeof(err)), 0);
	assert_int_equal(m->hp.ctx_len, T_CTX);
	assert_int_equal(model_set_ctx(m, 4 * T_CTX, err, sizeof(err)), 0);
	assert_int_equal(model_set_ctx(m, 4 * T_CTX + 1, err, sizeof(err)), -ERANGE);
	assert_non_null(strstr(err, "linear"));
	model_free(m);

	static const struct gguf_add_kv yarn[] = {
		{ "qwen2.rope.scaling.type", GGUF_VT_STRING, "yarn", 0, 0 },
		{ "qwen2.rope.scaling.factor", GGUF_VT_F32, NULL, 0, 4.0f },
		{ "qwen2.rope.scaling.original_context_length", GGUF_VT_U32, NULL, 64, 0 },
		{ "qwen2.rope.freq_base", GGUF_VT_F32, NULL, 0, 10000.0f },
	};
	c = (struct tiny_cfg){ .arch = "qwen2", .kv = yarn, .n_kv = 4 };
	m = tiny_must(&c);
	/* ggml_rope_yarn_corr_dims for 16 dims, 64 positions, base 1e4, beta 32 and 1. */
	float lo = floorf(16 * logf(64 / (32 * 2 * (float)M_PI)) / (2 * logf(10000.0f)));
	float hi = ceilf(16 * logf(64 / (1 * 2 * (float)M_PI)) / (2 * logf(10000.0f)));
	assert_true(m->rope.freq_scale == 0.25f && m->rope.ext_factor == 1.0f);
	assert_true(m->rope.corr_lo == (lo > 0 ? lo : 0) && m->rope.corr_hi == (hi < 15 ? hi : 15));
	/* mscale 1 + 0.1 ln 4, cancelled by the factor ggml applies on top of it. */
	assert_true(fabsf(m->rope.attn_factor - 1.0f) < 1e-6f);
	assert_int_equal(m->hp.max_ctx, T_CTX);	/* 64 x 4 is the trained 256 */
	model_free(m);

	static const struct gguf_add_kv l3[] = {
		{ "llama.rope.scaling.type", GGUF_VT_STRING, "llama3", 0, 0 },
		{ "llama.rope.scaling.factor", GGUF_VT_F32, NULL, 0, 8.0f },
		{ "llama.rope.scaling.low_freq_factor", GGUF_VT_F32, NULL, 0, 1.0f },
		{ "llama.rope.scaling.high_freq_factor", GGUF_VT_F32, NULL, 0, 4.0f },
		{ "llama.rope.scaling.original_context_length", GGUF_VT_U32, NULL, 64, 0 },
	};
	c = (struct tiny_cfg){ .arch = "llama", .kv = l3, .n_kv = 5 };
	m = tiny_must(&c);
	float want[8];
	model_llama3_factors(want, 16, 10000.0f, 8.0f, 1.0f, 4.0f, 64.0f);
	assert_non_null(m->rope.h_freq_factors);
	assert_memory_equal(m->rope.h_freq_factors, want, sizeof(want));
	/* The highest frequency is kept, the lowest divided by the whole factor. */
	assert_true(want[0] == 1.0f && want[7] == 8.0f);
	assert_true(m->rope.freq_scale == 1.0f);
	model_free(m);

	/* The same formula as the converter's, written independently (tests/golden/gen_arch.py). */
	const char *golden = "tests/golden/arch/llama3-freqs.gguf";
	assert_int_equal(model_load(&m, golden, err, sizeof(err)), 0);
	const float *f = m->rope.h_freq_factors;
	assert_non_null(f);
	model_llama3_factors(want, 16, m->hp.rope_theta, 8.0f, 1.0f, 4.0f, 256.0f);
	int between = 0;
	for (int i = 0; i < 8; i++) {
		between += want[i] > 1.0f && want[i] < 8.0f;
		if (fabsf(f[i] - want[i]) > 1e-6f * want[i])
			fail_msg("llama3 factor %d: %.9g computed, %.9g in %s", i, (double)want[i],
				 (double)f[i], golden);
	}
	model_free(m);
	assert_true(between > 0);	/* the smooth branch was exercised */

	static const struct gguf_add_kv bad[] = { { "llama.rope.scaling.type", GGUF_VT_STRING, "dynamic", 0, 0 } };
	c = (struct tiny_cfg){ .arch = "llama", .kv = bad, .n_kv = 1 };
	assert_int_equal(tiny_load(&c, &m, err, sizeof(err)), -ENOTSUP);
	assert_non_null(strstr(err, "llama.rope.scaling.type"));
	assert_non_null(strstr(err, "dynamic"));
}

static int no_scale(struct backend *b, float *x, float s, uint32_t n, uint32_t dim)
{
	(void)b, (void)x, (void)s, (void)n, (void)dim;
	return -ENOTSUP;
}

/* A backend without an operation the architecture needs is refused, naming all three. */
static void test_backend_lacks(void **state)
{
	(void)state;
	struct backend *cpu;
	assert_int_equal(backend_cpu_create(&cpu, 1), 0);
	struct backend_ops ops = *cpu->ops;
	struct backend fake = *cpu;
	fake.ops = &ops;
	/* Gemma needs scale and geglu: the backend has the one and lacks the other. */
	ops.scale = no_scale;
	ops.geglu = NULL;
	struct tiny_cfg gemma = { .arch = "gemma" };
	struct model *m = tiny_must(&gemma);
	char err[256] = "";
	int rc = engine_supports(m, &fake, err, sizeof(err));
	struct kvpool *pool = NULL;
	struct kvpool_config pc = { .n_blocks = 4, .block_tokens = 16, .n_layers = T_LAYERS,
				    .kv_dim = m->hp.kv_dim, .kv_type = KB_F32 };
	struct engine *e = NULL;
	int rc_create = kvpool_create(&pool, &pc) ? -1 : engine_create(&e, m, &fake, pool, 4);
	engine_destroy(e);
	kvpool_destroy(pool);
	struct tiny_cfg llama = { .arch = "llama" };
	struct model *m2 = tiny_must(&llama);
	int rc_llama = engine_supports(m2, &fake, NULL, 0);
	model_free(m2);
	model_free(m);
	cpu->ops->destroy(cpu);
	assert_int_equal(rc, -ENOTSUP);
	assert_int_equal(rc_create, -ENOTSUP);
	assert_int_equal(rc_llama, 0);
	if (!strstr(err, "'cpu'") || !strstr(err, "geglu") || !strstr(err, "'gemma'"))
		fail_msg("'%s' does not name the backend, the op and the architecture", err);
	printf("refused: %s\n", err);
}

/*
 * The forward pass of tiny model c on the CPU: the last row's logits of a
 * fixed prompt of n tokens, fed chunk rows per call, into lg (T_VOCAB).
 * -ENOTSUP when the backend does not compute one of its operations yet.
 */
static int tiny_forward_chunks(const struct tiny_cfg *c, uint32_t n, uint32_t chunk, float *lg)
{
	struct model *m = tiny_must(c);
	struct backend *cpu;
	struct kvpool *pool = NULL;
	struct engine *e = NULL;
	struct kvpool_config pc = { .n_blocks = 16, .block_tokens = 16, .n_layers = T_LAYERS,
				    .kv_dim = m->hp.kv_dim, .kv_type = KB_F32 };
	int rc = backend_cpu_create(&cpu, 1);
	if (rc) {
		model_free(m);
		return rc;
	}
	if (!(rc = kvpool_create(&pool, &pc)))
		rc = engine_create(&e, m, cpu, pool, MAX_ROWS);
	if (!rc) {
		struct engine_seq s;
		struct engine_row rows[MAX_ROWS];
		engine_seq_init(e, &s, 0);
		for (uint32_t i = 0; i < n; i++)
			rows[i] = (struct engine_row){ &s, i, (i * 7 + 3) % T_VOCAB, i == n - 1 };
		for (uint32_t i = 0; !rc && i < n; i += chunk)
			rc = engine_forward(e, rows + i, n - i < chunk ? n - i : chunk, lg);
		engine_seq_release(e, &s);
	}
	engine_destroy(e);
	kvpool_destroy(pool);
	cpu->ops->destroy(cpu);
	model_free(m);
	return rc;
}

static int tiny_forward(const struct tiny_cfg *c, uint32_t n, float *lg)
{
	return tiny_forward_chunks(c, n, n, lg);
}

/* Llama 3's rope_freqs change the angles: the same weights without them give other logits. */
static void test_rope_freqs_logits(void **state)
{
	(void)state;
	struct tiny_cfg with = { .arch = "llama", .rope_freqs = 1 };
	struct tiny_cfg without = { .arch = "llama" };
	float a[T_VOCAB], b[T_VOCAB];
	int rc = tiny_forward(&with, 20, a);
	if (rc == -ENOTSUP)
		skip();
	assert_int_equal(rc, 0);
	assert_int_equal(tiny_forward(&without, 20, b), 0);
	assert_memory_not_equal(a, b, sizeof(a));
}

/*
 * Every architecture runs end to end where the backend computes all it
 * needs, and a row's logits are bit for bit the same whether its prompt
 * came as one batch or one token per step (past gemma2's window of 4).
 */
static void test_arch_forward(void **state)
{
	(void)state;
	static const struct gguf_add_kv g2kv[] = {
		{ "gemma2.attention.sliding_window", GGUF_VT_U32, NULL, 4, 0 },
	};
	const struct tiny_cfg cases[] = {
		{ .arch = "llama", .output = 1 },
		{ .arch = "llama", .head_dim = 24, .output = 1 },
		{ .arch = "qwen2", .biases = 1 },
		{ .arch = "phi3", .fused_qkv = 1, .fused_up = 1, .output = 1 },
		{ .arch = "gemma", .head_dim = 32 },
		{ .arch = "gemma2", .post_norms = 1, .kv = g2kv, .n_kv = 1 },
	};
	int ran = 0;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		float lg[T_VOCAB];
		int rc = tiny_forward(&cases[i], 12, lg);
		if (rc == -ENOTSUP) {
			printf("%s: not computed by the CPU backend yet\n", cases[i].arch);
			continue;
		}
		if (rc)
			fail_msg("case %zu (%s): forward %d", i, cases[i].arch, rc);
		for (int j = 0; j < T_VOCAB; j++)
			if (!isfinite(lg[j]))
				fail_msg("case %zu (%s): logit %d is %g", i, cases[i].arch, j, lg[j]);
		if (!strcmp(cases[i].arch, "gemma2"))
			for (int j = 0; j < T_VOCAB; j++)
				assert_true(fabsf(lg[j]) <= 30.0f);
		float one[T_VOCAB];
		assert_int_equal(tiny_forward_chunks(&cases[i], 12, 1, one), 0);
		if (memcmp(one, lg, sizeof(lg)))
			fail_msg("case %zu (%s): decoding token by token differs from one prefill",
				 i, cases[i].arch);
		ran++;
	}
	printf("%d of %zu architectures ran\n", ran, sizeof(cases) / sizeof(cases[0]));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_arch_binds),
		cmocka_unit_test(test_arch_refusals),
		cmocka_unit_test(test_rope_scaling),
		cmocka_unit_test(test_backend_lacks),
		cmocka_unit_test(test_rope_freqs_logits),
		cmocka_unit_test(test_arch_forward),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
