/* ops.c — f32 row kernels; 8 independent lanes and a fixed tree wherever a row is reduced. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/cpu/quant.h"
#include "kernels/cpu/dot.h"
#include "kernels/cpu/ops.h"
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

CLONES void ops_swiglu_row(float *out, const float *gate, const float *up, uint32_t dim)
{
	for (uint32_t i = 0; i < dim; i++) {
		float gv = gate[i];
		out[i] = gv / (1.0f + expf_inline(-gv)) * up[i];
	}
}

void ops_rope_table(float *cs, uint32_t pos, uint32_t rot_dim, float theta)
{
	/* The angle advances by a constant factor per pair, in f32, as llama.cpp computes it. */
	float step = powf(theta, -2.0f / (float)rot_dim);
	float a = (float)pos;
	for (uint32_t i = 0; i < rot_dim / 2; i++) {
		cs[2 * i] = cosf(a);
		cs[2 * i + 1] = sinf(a);
		a *= step;
	}
}

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
			v[a] = x0 * c - x1 * s;
			v[b] = x0 * s + x1 * c;
		}
	}
}

#define ATT_MAX_GROUP 16
#define ATT_MAX_HD 256

/* Per-thread score buffer, grown to the longest context seen; the pool's threads live on. */
static __thread float *att_buf;
static __thread size_t att_cap;

float *ops_att_scores(size_t n)
{
	if (n > att_cap) {
		float *p = realloc(att_buf, n * sizeof(float));
		if (!p)
			return NULL;
		att_buf = p;
		att_cap = n;
	}
	return att_buf;
}

/* Row at element offset off of a cache of type as f32. */
static inline void kv_row(float *out, const void *base, int f32, size_t off, uint32_t n)
{
	if (f32) {
		memcpy(out, (const float *)base + off, n * sizeof(float));
		return;
	}
	const uint16_t *in = (const uint16_t *)base + off;
	for (uint32_t i = 0; i < n; i++)
		out[i] = fp16_to_f32(in[i]);
}

static int attention_group_c(float *out, const float *q, const struct kb_kv_view *kv,
			       uint32_t pos, uint32_t kvh, const struct kb_attn_shape *sh)
{
	const uint32_t hd = sh->head_dim, group = sh->n_heads / sh->n_kv_heads;
	const uint32_t np = pos + 1;
	const size_t stride = (size_t)sh->n_kv_heads * hd;
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
		kv_row(row, kv->k, f32, p * stride + (size_t)kvh * hd, hd);
		for (uint32_t g = 0; g < group; g++)
			s[g * np + p] = dot_lanes(qh[g], row, hd) * sh->scale;
	}
	for (uint32_t g = 0; g < group; g++) {
		float *sg = s + g * np;
		float mx = -INFINITY;
		for (uint32_t p = 0; p < np; p++)
			mx = sg[p] > mx ? sg[p] : mx;
		for (uint32_t p = 0; p < np; p++)
			sg[p] = expf_inline(sg[p] - mx);
		double sum = 0.0;
		for (uint32_t p = 0; p < np; p++)
			sum += sg[p];
		float inv = (float)(1.0 / sum);
		for (uint32_t p = 0; p < np; p++)
			sg[p] = f32 ? sg[p] * inv : fp16_round(sg[p] * inv);
	}
	for (uint32_t g = 0; g < group; g++) {
		float *o = out + g * hd;
		memset(o, 0, hd * sizeof(float));
		for (uint32_t p = 0; p < np; p++) {
			kv_row(row, kv->v, f32, p * stride + (size_t)kvh * hd, hd);
			float w = s[g * np + p];
			for (uint32_t i = 0; i < hd; i++)
				o[i] = fmaf(w, row[i], o[i]);
		}
	}
	return 0;
}

#if defined(__x86_64__)
int ops_attention_group_avx2(float *out, const float *q, const struct kb_kv_view *kv,
			     uint32_t pos, uint32_t kvh, const struct kb_attn_shape *sh);
int ops_attention_have_avx2(void);
#endif

int ops_attention_group(float *out, const float *q, const struct kb_kv_view *kv,
			uint32_t pos, uint32_t kvh, const struct kb_attn_shape *sh)
{
#if defined(__x86_64__)
	if (sh->head_dim % 8 == 0 && ops_attention_have_avx2())
		return ops_attention_group_avx2(out, q, kv, pos, kvh, sh);
#endif
	return attention_group_c(out, q, kv, pos, kvh, sh);
}
