/* ops.c — f32 row kernels; 8 independent lanes and a fixed tree wherever a row is reduced. */
#include <errno.h>
#include <pthread.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/cpu/quant.h"
#include "kernels/cpu/dot.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/ops_avx2.h"
#include "kernels/cpu/vexp.h"

/* Compiled twice (x86-64-v3 and baseline); both clones do the same f32 operations. */
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define CLONES
#endif

float fast_expf(float x)
{
	return expf_inline(x);
}

static inline float dot_lanes(const float *a, const float *b, uint32_t n)
{
	float acc[8] = {0};
	uint32_t i = 0;
	for (; i + 8 <= n; i += 8)
		for (int j = 0; j < 8; j++)
			acc[j] = fmaf(a[i + j], b[i + j], acc[j]);
	for (; i < n; i++)
		acc[i % 8] = fmaf(a[i], b[i], acc[i % 8]);
	return hsum8(acc);
}

/*
 * The sum of squares runs in double: the normed row is quantized to 8 bits
 * next, where one ulp can move a value across a rounding boundary, so this
 * sum is kept as exact as other GGUF runtimes keep it.
 */
CLONES void ops_rmsnorm_row(float *out, const float *x, const float *g, uint32_t dim, float eps)
{
	double ss = 0.0;
	for (uint32_t i = 0; i < dim; i++)
		ss += (double)(x[i] * x[i]);
	float mean = (float)(ss / dim);
	float scale = 1.0f / sqrtf(mean + eps);
	for (uint32_t i = 0; i < dim; i++)
		out[i] = x[i] * scale * g[i];
}

CLONES void ops_swiglu_row_c(float *out, const float *gate, const float *up, uint32_t dim)
{
	for (uint32_t i = 0; i < dim; i++) {
		float gv = gate[i];
		out[i] = gv / (1.0f + expf_inline(-gv)) * up[i];
	}
}

/* The portable loop does not vectorise (expf_inline()'s clamps and rounding); the AVX2 one gives its bits. */
void ops_swiglu_row(float *out, const float *gate, const float *up, uint32_t dim)
{
	uint32_t done = 0;
#if defined(__x86_64__)
	if (ops_have_avx2())
		done = (uint32_t)ops_swiglu_row_avx2(out, gate, up, dim);
#endif
	ops_swiglu_row_c(out + done, gate + done, up + done, dim - done);
}

void ops_f16_row(uint16_t *h, const float *x, uint32_t n)
{
	uint32_t i = 0;
#if defined(__x86_64__)
	if (ops_have_avx2())
		i = (uint32_t)ops_f16_row_avx2(h, x, n);
#endif
	for (; i < n; i++)
		h[i] = f32_to_fp16(x[i]);
}

CLONES void ops_add_bias_row(float *x, const float *bias, uint32_t dim)
{
	for (uint32_t i = 0; i < dim; i++)
		x[i] += bias[i];
}

CLONES void ops_scale_row(float *x, float s, uint32_t dim)
{
	for (uint32_t i = 0; i < dim; i++)
		x[i] *= s;
}

/* tanhf is libm's, one implementation per process: the same bits whatever the batch or thread. */
void ops_softcap_row(float *x, float cap, uint32_t dim)
{
	const float inv = 1.0f / cap;
	for (uint32_t i = 0; i < dim; i++)
		x[i] = tanhf(x[i] * inv) * cap;
}

uint32_t ops_argmax_row(const float *x, uint32_t n)
{
	enum { L = 16 };
	const float m0 = x[0];
	if (m0 != m0)
		return 0;
	float m[L];
	for (int l = 0; l < L; l++)
		m[l] = m0;
	uint32_t i = 0;
	for (; i + L <= n; i += L)
		for (int l = 0; l < L; l++)	/* x > m ? x : m never takes a NaN */
			m[l] = x[i + l] > m[l] ? x[i + l] : m[l];
	float mx = m0;
	for (int l = 0; l < L; l++)
		mx = m[l] > mx ? m[l] : mx;
	for (; i < n; i++)
		mx = x[i] > mx ? x[i] : mx;
	if (!(mx > m0))
		return 0;
	for (i = 1; x[i] != mx; i++)
		;
	return i;
}

/* ggml's constants, as f32. */
#define GELU_A 0.044715f
#define GELU_S 0.79788456080286535587989211986876f

/*
 * ggml's build fuses 1 + (A x) x into one fma (its compiler contracts
 * floating point; this project's does not, so it is written out): the
 * unfused sum moves table entries by an f16 ulp, gates near -2.
 */
float ops_gelu_f32(float x)
{
	return 0.5f * x * (1.0f + tanhf(GELU_S * x * fmaf(GELU_A * x, x, 1.0f)));
}

/*
 * ggml's CPU backend computes an f32 GELU through a table of f16 results
 * indexed by the input's f16 (GGML_GELU_FP16, always defined in its
 * vec.h); llama.cpp's Gemma runs that, so this does too, and its error
 * (about 2^-11 relative from each rounding) is llama.cpp's own.
 */
static uint16_t gelu_tab[1 << 16];
static pthread_once_t gelu_once = PTHREAD_ONCE_INIT;

static void gelu_tab_init(void)
{
	for (uint32_t h = 0; h < (1u << 16); h++)
		gelu_tab[h] = f32_to_fp16(ops_gelu_f32(fp16_to_f32((uint16_t)h)));
}

void ops_geglu_row(float *out, const float *gate, const float *up, uint32_t dim)
{
	pthread_once(&gelu_once, gelu_tab_init);
	for (uint32_t i = 0; i < dim; i++) {
		float g = gate[i];
		if (g <= -10.0f)
			out[i] = 0.0f;
		else if (g >= 10.0f)
			out[i] = g * up[i];
		else
			out[i] = fp16_to_f32(gelu_tab[f32_to_fp16(g)]) * up[i];
	}
}

/* YaRN's ramp over pair index i: 1 below corr_lo, 0 above corr_hi, linear between. */
static float rope_ramp(float lo, float hi, uint32_t i)
{
	float y = ((float)i - lo) / fmaxf(0.001f, hi - lo);
	return 1.0f - fminf(1.0f, fmaxf(0.0f, y));
}

/*
 * The angle advances by a constant factor per pair, in f32, as ggml's rope
 * cache does; each angle is then divided by its factor, scaled and mixed.
 * ggml's build fuses the mix's first product and the YaRN magnitude's
 * multiply-add (its compiler contracts floating point, this one does not),
 * so those two are fmas here: checked bit for bit against libggml-cpu.
 */
void ops_rope_table(float *cs, uint32_t pos, const struct kb_rope *rope, const float *ff)
{
	const float step = powf(rope->theta, -2.0f / (float)rope->rot_dim);
	const float fs = rope->freq_scale, ext = rope->ext_factor;
	float mscale = rope->attn_factor;
	if (ext != 0.0f)
		mscale *= fmaf(0.1f, logf(1.0f / fs), 1.0f);
	float a = (float)pos;
	for (uint32_t i = 0; i < rope->rot_dim / 2; i++) {
		float extrap = ff ? a / ff[i] : a, th = fs * extrap;
		if (ext != 0.0f) {
			float mix = rope_ramp(rope->corr_lo, rope->corr_hi, i) * ext;
			th = fmaf(th, 1.0f - mix, extrap * mix);
		}
		cs[2 * i] = cosf(th) * mscale;
		cs[2 * i + 1] = sinf(th) * mscale;
		a *= step;
	}
}

/*
 * Each rotation fuses its first product, fma(x0, c, -(x1 * s)) and
 * fma(x0, s, x1 * c): that is how llama.cpp's compiled kernel rounds, and
 * spelling it out keeps every build identical (GCC would otherwise fuse the
 * pairs into vfmaddsub in vectorised clones only, -ffp-contract=off or not).
 */
CLONES void ops_rope_row(float *x, const float *cs, uint32_t n_heads, uint32_t head_dim,
			 uint32_t rot_dim, int neox)
{
	uint32_t half = rot_dim / 2;
	for (uint32_t h = 0; h < n_heads; h++) {
		float *v = x + h * head_dim;
		for (uint32_t i = 0; i < half; i++) {
			uint32_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
			float c = cs[2 * i], s = cs[2 * i + 1];
			float x0 = v[a], x1 = v[b];
			v[a] = fmaf(x0, c, -(x1 * s));
			v[b] = fmaf(x0, s, x1 * c);
		}
	}
}

#define ATT_MAX_GROUP 16
#define ATT_MAX_HD 256

/*
 * Per-thread score buffer, grown to the longest context seen. A pthread
 * key frees it when a pool worker exits; ops_thread_scratch_free() frees
 * the calling thread's.
 */
static pthread_key_t att_key;
static pthread_once_t att_once = PTHREAD_ONCE_INIT;

struct att_scratch {
	float *buf;
	size_t cap;
};

static void att_free(void *p)
{
	struct att_scratch *a = p;
	if (a) {
		free(a->buf);
		free(a);
	}
}

static void att_key_init(void)
{
	pthread_key_create(&att_key, att_free);
}

float *ops_att_scores(size_t n)
{
	pthread_once(&att_once, att_key_init);
	struct att_scratch *a = pthread_getspecific(att_key);
	if (!a) {
		a = calloc(1, sizeof(*a));
		if (!a || pthread_setspecific(att_key, a)) {
			free(a);
			return NULL;
		}
	}
	if (n > a->cap) {
		/* doubling: decode asks a little more each step, as contexts grow */
		size_t cap = n > 2 * a->cap ? n : 2 * a->cap;
		float *p = realloc(a->buf, cap * sizeof(float));
		if (!p)
			return NULL;
		a->buf = p;
		a->cap = cap;
	}
	return a->buf;
}

void ops_thread_scratch_free(void)
{
	pthread_once(&att_once, att_key_init);
	att_free(pthread_getspecific(att_key));
	pthread_setspecific(att_key, NULL);
}

/* out (n,) = elements [first, first + n) of position p's K (which 0) or V (1) row, as f32. */
static void ops_kv_head(float *out, const struct kb_kv_view *kv, int which, uint32_t p,
			uint32_t first, uint32_t n)
{
	const uint8_t *row = kb_kv_row(kv, which, p);
	if (kv->type == KB_F32) {
		memcpy(out, (const float *)row + first, n * sizeof(float));
	} else if (kv->type == KB_Q8_0) {
		const struct blk_q8_0 *b = (const struct blk_q8_0 *)row + first / QK;
		for (uint32_t i = 0; i < n; i++) {
			const struct blk_q8_0 *bb = b + i / QK;
			out[i] = fp16_to_f32(bb->d) * (float)bb->qs[i % QK];
		}
	} else {
		const uint16_t *in = (const uint16_t *)row + first;
		for (uint32_t i = 0; i < n; i++)
			out[i] = fp16_to_f32(in[i]);
	}
}

uint32_t ops_att_first(uint32_t pos, uint32_t window)
{
	return window && pos >= window ? pos + 1 - window : 0;
}

/*
 * As llama.cpp's graph caps scores (build_attn_mha): the raw q.k scaled by
 * 1 / cap, tanh, times cap, and only then times the attention scale (which
 * ggml's softmax applies). tanhf is libm's: one implementation per process.
 */
void ops_att_softcap(float *s, uint32_t n, float cap, float scale)
{
	const float inv = 1.0f / cap;
	for (uint32_t i = 0; i < n; i++)
		s[i] = tanhf(s[i] * inv) * cap * scale;
}

int ops_attention_group_c(float *out, const float *q, const struct kb_kv_view *kv,
			  uint32_t pos, uint32_t kvh, const struct kb_attn_shape *sh)
{
	const uint32_t hd = sh->head_dim, group = sh->n_heads / sh->n_kv_heads;
	const uint32_t p0 = ops_att_first(pos, sh->window), np = pos + 1 - p0;
	const float scale = sh->softcap != 0.0f ? 1.0f : sh->scale;	/* a capped score is scaled after */
	const int f32 = kv->type == KB_F32;
	float qh[ATT_MAX_GROUP][ATT_MAX_HD];
	float row[ATT_MAX_HD];
	float *s = ops_att_scores((size_t)group * np);	/* (group, np) */
	if (!s)
		return -ENOMEM;
	for (uint32_t g = 0; g < group; g++)
		for (uint32_t i = 0; i < hd; i++)
			qh[g][i] = f32 ? q[g * hd + i] : fp16_round(q[g * hd + i]);
	/* One read of each K row serves the whole query-head group. */
	for (uint32_t p = 0; p < np; p++) {
		ops_kv_head(row, kv, 0, p0 + p, kvh * hd, hd);
		for (uint32_t g = 0; g < group; g++)
			s[g * np + p] = dot_lanes(qh[g], row, hd) * scale;
	}
	if (sh->softcap != 0.0f)
		ops_att_softcap(s, group * np, sh->softcap, sh->scale);
	for (uint32_t g = 0; g < group; g++)
		softmax_row(s + g * np, np, !f32);
	for (uint32_t g = 0; g < group; g++) {
		float *o = out + g * hd;
		memset(o, 0, hd * sizeof(float));
		for (uint32_t p = 0; p < np; p++) {
			ops_kv_head(row, kv, 1, p0 + p, kvh * hd, hd);
			float w = s[g * np + p];
			for (uint32_t i = 0; i < hd; i++)
				o[i] = fmaf(w, row[i], o[i]);
		}
	}
	return 0;
}

int ops_attention_heads(float *out, const float *q, const struct kb_kv_view *kv,
			uint32_t pos, uint32_t kvh0, uint32_t nkv, const struct kb_attn_shape *sh)
{
#if defined(__x86_64__)
	if (kv->type != KB_Q8_0 && sh->head_dim % 8 == 0) {
		if (ops_have_avx512())
			return ops_attention_heads_avx512(out, q, kv, pos, kvh0, nkv, sh);
		if (ops_have_avx2())
			return ops_attention_heads_avx2(out, q, kv, pos, kvh0, nkv, sh);
	}
#endif
	const size_t per = (size_t)(sh->n_heads / sh->n_kv_heads) * sh->head_dim;
	for (uint32_t h = 0; h < nkv; h++) {
		int rc = ops_attention_group_c(out + h * per, q + h * per, kv, pos, kvh0 + h, sh);
		if (rc)
			return rc;
	}
	return 0;
}
