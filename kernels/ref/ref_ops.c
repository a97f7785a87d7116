/* ref_ops.c — the reference backend's norms, RoPE, activations and attention: plain loops in double. */
#include <errno.h>
#include <math.h>
#include <string.h>
#include "kernels/backend.h"
#include "kernels/ref/deq.h"
#include "kernels/ref/ref.h"

/* out (dim,) = x / sqrt(mean(x^2) + eps) * g; the sum in position order. */
static void rmsnorm_row(float *out, const float *x, const float *g, uint32_t dim, float eps)
{
	double ss = 0.0;
	for (uint32_t i = 0; i < dim; i++)
		ss += (double)x[i] * x[i];
	double scale = 1.0 / sqrt(ss / dim + (double)eps);
	for (uint32_t i = 0; i < dim; i++)
		out[i] = (float)((double)x[i] * scale * g[i]);
}

int ref_rmsnorm(struct backend *b, float *out, const float *x, const float *g, uint32_t n,
		uint32_t dim, float eps)
{
	(void)b;
	if (dim == 0)
		return -EINVAL;
	for (uint32_t r = 0; r < n; r++)
		rmsnorm_row(out + (size_t)r * dim, x + (size_t)r * dim, g, dim, eps);
	return 0;
}

int ref_add(struct backend *b, float *x, const float *y, uint32_t n, uint32_t dim)
{
	(void)b;
	for (size_t i = 0; i < (size_t)n * dim; i++)
		x[i] = (float)((double)x[i] + y[i]);
	return 0;
}

int ref_add_rmsnorm(struct backend *b, float *out, float *x, const float *y, const float *g,
		    uint32_t n, uint32_t dim, float eps)
{
	int rc = ref_add(b, x, y, n, dim);
	return rc ? rc : ref_rmsnorm(b, out, x, g, n, dim, eps);
}

int ref_swiglu(struct backend *b, float *out, const float *gate, const float *up, uint32_t n,
	       uint32_t dim)
{
	(void)b;
	for (size_t i = 0; i < (size_t)n * dim; i++) {
		double g = gate[i];
		out[i] = (float)(g / (1.0 + exp(-g)) * up[i]);
	}
	return 0;
}

int ref_add_bias(struct backend *b, float *x, const float *bias, uint32_t n, uint32_t dim)
{
	(void)b;
	for (size_t r = 0; r < n; r++)
		for (uint32_t i = 0; i < dim; i++)
			x[r * dim + i] = (float)((double)x[r * dim + i] + bias[i]);
	return 0;
}

int ref_scale(struct backend *b, float *x, float s, uint32_t n, uint32_t dim)
{
	(void)b;
	for (size_t i = 0; i < (size_t)n * dim; i++)
		x[i] = (float)((double)x[i] * s);
	return 0;
}

int ref_softcap(struct backend *b, float *x, float cap, uint32_t n, uint32_t dim)
{
	(void)b;
	if (!(cap > 0.0f))
		return -EINVAL;
	for (size_t i = 0; i < (size_t)n * dim; i++)
		x[i] = (float)(cap * tanh(x[i] / (double)cap));
	return 0;
}

/* The formula itself, in double: no f16 table, unlike ggml's CPU (and this project's). */
int ref_geglu(struct backend *b, float *out, const float *gate, const float *up, uint32_t n,
	      uint32_t dim)
{
	(void)b;
	const double c = sqrt(2.0 / M_PI);
	for (size_t i = 0; i < (size_t)n * dim; i++) {
		double g = gate[i];
		out[i] = (float)(0.5 * g * (1.0 + tanh(c * g * (1.0 + 0.044715 * g * g))) * up[i]);
	}
	return 0;
}

/* YaRN's ramp over pair index i: 1 below lo, 0 above hi, linear between. */
static double rope_ramp(double lo, double hi, uint32_t i)
{
	double y = (i - lo) / fmax(0.001, hi - lo);
	return 1.0 - fmin(1.0, fmax(0.0, y));
}

/*
 * (cos, sin) of pair i at pos, in double and from scratch (nothing carries
 * from one pair or position to the next): the angle pos * theta^(-2i /
 * rot_dim) over the pair's factor, interpolated by freq_scale, mixed back
 * by YaRN's ramp, both scaled by the magnitude.
 */
static void rope_cs(double *c, double *s, uint32_t pos, uint32_t i, const struct kb_rope *rope,
		    const float *ff)
{
	double extrap = (double)pos * pow(rope->theta, -2.0 * i / rope->rot_dim);
	if (ff)
		extrap /= ff[i];
	double a = rope->freq_scale * extrap, m = rope->attn_factor;
	if (rope->ext_factor != 0.0f) {
		double mix = rope_ramp(rope->corr_lo, rope->corr_hi, i) * rope->ext_factor;
		a = a * (1.0 - mix) + extrap * mix;
		m *= 1.0 + 0.1 * log(1.0 / rope->freq_scale);
	}
	*c = cos(a) * m;
	*s = sin(a) * m;
}

int ref_rope(struct backend *b, float *x, const uint32_t *pos, uint32_t n, uint32_t n_heads,
	     uint32_t head_dim, const struct kb_rope *rope)
{
	(void)b;
	uint32_t rot_dim = rope->rot_dim;
	int neox = rope->neox;
	if (rot_dim > head_dim || rot_dim % 2)
		return -EINVAL;
	if (!(rope->theta > 0.0f) || !(rope->freq_scale > 0.0f))
		return -EINVAL;
	const float *ff = rope->h_freq_factors ? rope->h_freq_factors : rope->freq_factors;
	uint32_t half = rot_dim / 2;
	for (uint32_t r = 0; r < n; r++) {
		for (uint32_t i = 0; i < half; i++) {
			double c, s;
			rope_cs(&c, &s, pos[r], i, rope, ff);
			uint32_t i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
			for (uint32_t h = 0; h < n_heads; h++) {
				float *v = x + ((size_t)r * n_heads + h) * head_dim;
				double x0 = v[i0], x1 = v[i1];
				v[i0] = (float)(x0 * c - x1 * s);
				v[i1] = (float)(x0 * s + x1 * c);
			}
		}
	}
	return 0;
}

int ref_argmax(struct backend *b, uint32_t *ids, const float *x, uint32_t n, uint32_t dim)
{
	(void)b;
	if (dim == 0)
		return -EINVAL;
	for (uint32_t r = 0; r < n; r++) {
		const float *row = x + (size_t)r * dim;
		uint32_t best = 0;
		for (uint32_t i = 1; i < dim; i++)
			if (row[i] > row[best])
				best = i;
		ids[r] = best;
	}
	return 0;
}

/* ---- the K/V cache ---- */

static int kv_ok(const struct kb_kv_view *kv, uint32_t kv_dim)
{
	if (kv->type != KB_F32 && kv->type != KB_F16 && kv->type != KB_Q8_0)
		return -ENOTSUP;
	if (kv->block_tokens == 0 || (kv->block_tokens & (kv->block_tokens - 1)))
		return -EINVAL;
	if (kv->type == KB_Q8_0 && kv_dim % 32)
		return -EINVAL;
	return 0;
}

/* Row r's view: the pool's geometry with its own sequence's block table. */
static struct kb_kv_view row_view(const struct kb_kv_rows *kv, uint32_t r)
{
	struct kb_kv_view v = kv->geo;
	v.blocks = kv->tables + kv->tab_off[r];
	v.n_blocks = kv->tab_len[r];
	return v;
}

/* x (n,) into a cache row of type: f32 as is; f16 or q8_0 only when the user chose them. */
static void store_row(uint8_t *dst, uint32_t type, const float *x, uint32_t n)
{
	if (type == KB_F32) {
		memcpy(dst, x, n * sizeof(float));
	} else if (type == KB_Q8_0) {
		ref_quantize_q8_0(dst, x, n);
	} else {
		for (uint32_t i = 0; i < n; i++) {
			uint16_t h = ref_f32_to_f16(x[i]);
			dst[2 * i] = (uint8_t)(h & 0xff);
			dst[2 * i + 1] = (uint8_t)(h >> 8);
		}
	}
}

int ref_write_kv_rows(struct backend *b, const struct kb_kv_rows *kv, const uint32_t *pos,
		      uint32_t n, uint32_t kv_dim, const float *k, const float *v)
{
	(void)b;
	int rc = kv_ok(&kv->geo, kv_dim);
	if (rc)
		return rc;
	for (uint32_t r = 0; r < n; r++) {
		struct kb_kv_view rv = row_view(kv, r);
		if (pos[r] >= rv.n_blocks * rv.block_tokens)
			return -ERANGE;
		store_row(kb_kv_row(&rv, 0, pos[r]), rv.type, k + (size_t)r * kv_dim, kv_dim);
		store_row(kb_kv_row(&rv, 1, pos[r]), rv.type, v + (size_t)r * kv_dim, kv_dim);
	}
	return 0;
}

/* out (n,) = elements [first, first + n) of position p's K (which 0) or V (1) row, exactly. */
static void kv_elems(double *out, const struct kb_kv_view *kv, int which, uint32_t p,
		     uint32_t first, uint32_t n)
{
	const uint8_t *row = kb_kv_row(kv, which, p);
	for (uint32_t i = 0; i < n; i++) {
		uint32_t e = first + i;
		if (kv->type == KB_F32) {
			float f;
			memcpy(&f, row + 4 * (size_t)e, 4);
			out[i] = f;
		} else if (kv->type == KB_F16) {
			out[i] = ref_f16_to_f64((uint16_t)(row[2 * e] | row[2 * e + 1] << 8));
		} else {
			const uint8_t *blk = row + 34 * (size_t)(e / 32);
			out[i] = ref_f16_to_f64((uint16_t)(blk[0] | blk[1] << 8)) *
				 (int8_t)blk[2 + e % 32];
		}
	}
}

/*
 * One query head of one row over positions p0..p0+np-1: scores q.k *
 * scale (the raw q.k soft-capped first, cap * tanh(q.k / cap), when
 * there is a cap: llama.cpp's order), softmax and the weighted sum of V,
 * all in double and in position order. s is scratch of np + 2 * head_dim
 * doubles.
 */
static void attend_head(float *out, const float *q, const struct kb_kv_view *kv, uint32_t p0,
			uint32_t np, uint32_t kvh, const struct kb_attn_shape *sh, double *s)
{
	const double cap = sh->softcap;
	const uint32_t hd = sh->head_dim;
	double *row = s + np, *acc = row + hd;
	double max = -INFINITY, sum = 0.0;
	for (uint32_t p = 0; p < np; p++) {
		kv_elems(row, kv, 0, p0 + p, kvh * hd, hd);
		double dot = 0.0;
		for (uint32_t i = 0; i < hd; i++)
			dot += (double)q[i] * row[i];
		if (cap != 0.0)
			dot = cap * tanh(dot / cap);
		s[p] = dot * sh->scale;
		max = s[p] > max ? s[p] : max;
	}
	for (uint32_t p = 0; p < np; p++) {
		s[p] = exp(s[p] - max);
		sum += s[p];
	}
	memset(acc, 0, hd * sizeof(double));
	for (uint32_t p = 0; p < np; p++) {
		kv_elems(row, kv, 1, p0 + p, kvh * hd, hd);
		for (uint32_t i = 0; i < hd; i++)
			acc[i] += s[p] * row[i];
	}
	for (uint32_t i = 0; i < hd; i++)
		out[i] = (float)(acc[i] / sum);
}

int ref_attention_rows(struct backend *b, float *out, const float *q,
		       const struct kb_kv_rows *kv, const uint32_t *pos, uint32_t n,
		       const struct kb_attn_shape *sh)
{
	struct ref_backend *rb = REF(b);
	if (sh->n_kv_heads == 0 || sh->n_heads % sh->n_kv_heads || sh->head_dim == 0)
		return -EINVAL;
	if (!(sh->softcap >= 0.0f) || isinf(sh->softcap))
		return -EINVAL;
	int rc = kv_ok(&kv->geo, sh->n_kv_heads * sh->head_dim);
	if (rc)
		return rc;
	uint32_t maxp = 0;
	for (uint32_t r = 0; r < n; r++) {
		if (pos[r] >= kv->tab_len[r] * kv->geo.block_tokens)
			return -ERANGE;
		maxp = pos[r] > maxp ? pos[r] : maxp;
	}
	rc = ref_grow((void **)&rb->scores, &rb->scores_cap, (size_t)maxp + 1 + 2 * sh->head_dim,
		      sizeof(double));
	if (rc)
		return rc;
	const uint32_t group = sh->n_heads / sh->n_kv_heads;
	for (uint32_t r = 0; r < n; r++) {
		struct kb_kv_view rv = row_view(kv, r);
		for (uint32_t h = 0; h < sh->n_heads; h++) {
			size_t off = ((size_t)r * sh->n_heads + h) * sh->head_dim;
			uint32_t p0 = sh->window && pos[r] >= sh->window ? pos[r] + 1 - sh->window : 0;
			attend_head(out + off, q + off, &rv, p0, pos[r] + 1 - p0, h / group, sh,
				    rb->scores);
		}
	}
	return 0;
}
