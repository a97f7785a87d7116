/* model_rope.c — RoPE scaling from GGUF metadata: none, linear, YaRN and Llama 3's frequency factors. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/log.h"
#include "daemon/model/gguf.h"
#include "daemon/model/model_int.h"

void model_llama3_factors(float *out, uint32_t rot_dim, float theta, float factor, float low,
			  float high, float orig_ctx)
{
	/* Float throughout, as the converter's torch float32 tensors are. */
	const float low_wavelen = orig_ctx / low, high_wavelen = orig_ctx / high;
	for (uint32_t i = 0; i < rot_dim / 2; i++) {
		float freq = 1.0f / powf(theta, (float)(2 * i) / (float)rot_dim);
		float wavelen = (float)(2 * M_PI) / freq;
		if (wavelen < high_wavelen) {
			out[i] = 1.0f;
		} else if (wavelen > low_wavelen) {
			out[i] = factor;
		} else {
			float smooth = (orig_ctx / wavelen - low) / (high - low);
			out[i] = 1.0f / ((1.0f - smooth) / factor + smooth);
		}
	}
}

/* ggml's YaRN correction dimension: where the rotation count over orig_ctx positions is n_rot. */
static float yarn_corr_dim(uint32_t rot_dim, uint32_t orig_ctx, float n_rot, float base)
{
	return (float)rot_dim * logf((float)orig_ctx / (n_rot * 2 * (float)M_PI)) / (2 * logf(base));
}

/* An optional float key with a default; -EINVAL (named) when it is not a float. */
static int opt_f32(const struct model *m, const char *suffix, float *v, float dflt, char *err,
		   size_t errlen)
{
	int rc = model_get_f32(m, suffix, v, err, errlen);
	if (rc == -ENOENT)
		*v = dflt;
	return rc == -ENOENT ? 0 : rc;
}

/*
 * YaRN as llama.cpp sets it up: ext_factor 1, the ramp between the dims
 * where beta_fast and beta_slow rotations fit the original context, and
 * attn_factor chosen so that with ggml's own 1 + 0.1 ln(factor) on top the
 * magnitude is the mscale YaRN asks for (times rope.scaling.attn_factor).
 */
static int yarn_load(struct model *m, char *err, size_t errlen)
{
	struct model_hparams *hp = &m->hp;
	float ext, beta_fast, beta_slow, mscale, extra = m->rope.attn_factor;
	int rc;
	if ((rc = opt_f32(m, "rope.scaling.yarn_ext_factor", &ext, 1.0f, err, errlen)) ||
	    (rc = opt_f32(m, "rope.scaling.yarn_beta_fast", &beta_fast, 32.0f, err, errlen)) ||
	    (rc = opt_f32(m, "rope.scaling.yarn_beta_slow", &beta_slow, 1.0f, err, errlen)) ||
	    (rc = opt_f32(m, "rope.scaling.yarn_attn_factor", &mscale, 0.0f, err, errlen)))
		return rc;
	float f = hp->rope_factor;
	if (mscale == 0.0f)
		mscale = f <= 1.0f ? 1.0f : 0.1f * logf(f) + 1.0f;
	m->rope.ext_factor = ext;
	m->rope.attn_factor = ext != 0.0f ? mscale * (1.0f / (1.0f + 0.1f * logf(f))) * extra : extra;
	float lo = floorf(yarn_corr_dim(hp->rot_dim, hp->rope_orig_ctx, beta_fast, hp->rope_theta));
	float hi = ceilf(yarn_corr_dim(hp->rot_dim, hp->rope_orig_ctx, beta_slow, hp->rope_theta));
	m->rope.corr_lo = lo > 0.0f ? lo : 0.0f;
	m->rope.corr_hi = hi < (float)(hp->rot_dim - 1) ? hi : (float)(hp->rot_dim - 1);
	return 0;
}

static int llama3_load(struct model *m, char *err, size_t errlen)
{
	struct model_hparams *hp = &m->hp;
	float low, high, f;
	uint32_t orig;
	/* The converter's defaults where HF's rope_scaling leaves a value out. */
	if (model_get_f32(m, "rope.scaling.factor", &f, NULL, 0) == -ENOENT)
		hp->rope_factor = 8.0f;
	if (model_get_u32(m, "rope.scaling.original_context_length", &orig, NULL, 0) == -ENOENT)
		hp->rope_orig_ctx = 8192;
	int rc;
	if ((rc = opt_f32(m, "rope.scaling.low_freq_factor", &low, 1.0f, err, errlen)) ||
	    (rc = opt_f32(m, "rope.scaling.high_freq_factor", &high, 4.0f, err, errlen)))
		return rc;
	if (!(high > low) || !(low > 0.0f) || !(hp->rope_factor >= 1.0f)) {
		char key[96];
		model_key(m, "rope.scaling.high_freq_factor", key, sizeof(key));
		return log_errf(err, errlen, -EINVAL,
				"metadata '%s' = %g: llama3 scaling needs high > low_freq_factor %g > 0 "
				"and a factor of at least 1 (%g)", key, (double)high, (double)low,
				(double)hp->rope_factor);
	}
	m->rope_factors_own = malloc(hp->rot_dim / 2 * sizeof(float));
	if (!m->rope_factors_own)
		return -ENOMEM;
	model_llama3_factors(m->rope_factors_own, hp->rot_dim, hp->rope_theta, hp->rope_factor, low,
			     high, (float)hp->rope_orig_ctx);
	m->rope.h_freq_factors = m->rope_factors_own;
	return 0;
}

/* The scaling factor: rope.scaling.factor, else the old rope.scale_linear; 0 (none) means 1. */
static int scaling_factor(struct model *m, char *err, size_t errlen)
{
	float f = 0.0f;
	int rc = model_get_f32(m, "rope.scaling.factor", &f, err, errlen);
	if (rc == -ENOENT)
		rc = model_get_f32(m, "rope.scale_linear", &f, err, errlen);
	if (rc && rc != -ENOENT)
		return rc;
	if (!(f >= 0.0f) || f > 1024.0f) {
		char key[96];
		model_key(m, "rope.scaling.factor", key, sizeof(key));
		return log_errf(err, errlen, -EINVAL, "metadata '%s' = %g: not a scaling factor", key,
				(double)f);
	}
	m->hp.rope_factor = f == 0.0f ? 1.0f : f;
	return 0;
}

int model_rope_load(struct model *m, char *err, size_t errlen)
{
	struct model_hparams *hp = &m->hp;
	char key[96];
	struct gguf_str s;
	m->rope = KB_ROPE_PLAIN(hp->rot_dim, hp->rope_theta, hp->rope_neox);
	/* llama.cpp reads a file without a type as linear (by its factor, if any). */
	strcpy(hp->rope_scaling, "linear");
	model_key(m, "rope.scaling.type", key, sizeof(key));
	int rc = gguf_get_str(m->gguf, key, &s);
	if (rc == -EINVAL)
		return log_errf(err, errlen, -EINVAL, "metadata '%s': not a string", key);
	if (!rc) {
		static const char *const known[] = { "none", "linear", "yarn", "llama3", NULL };
		int k = 0;
		while (known[k] && !(strlen(known[k]) == s.len && !memcmp(known[k], s.ptr, s.len)))
			k++;
		if (!known[k])
			return log_errf(err, errlen, -ENOTSUP,
					"metadata '%s' = '%.*s': kvd does not do this RoPE scaling (none, "
					"linear, yarn and llama3 it does), and would rotate every "
					"position by the wrong angle", key, (int)(s.len > 32 ? 32 : s.len),
					s.ptr);
		strcpy(hp->rope_scaling, known[k]);
	}
	if ((rc = scaling_factor(m, err, errlen)))
		return rc;
	/* Linear by 1 (what a file without scaling keys means) is no scaling at all. */
	if (!strcmp(hp->rope_scaling, "linear") && hp->rope_factor == 1.0f)
		strcpy(hp->rope_scaling, "none");
	hp->rope_orig_ctx = hp->train_ctx;
	rc = model_get_u32(m, "rope.scaling.original_context_length", &hp->rope_orig_ctx, err, errlen);
	if (rc && rc != -ENOENT)
		return rc;
	if (hp->rope_orig_ctx == 0)
		hp->rope_orig_ctx = hp->train_ctx;
	float log_mul = 0.0f;
	if ((rc = opt_f32(m, "rope.scaling.yarn_log_multiplier", &log_mul, 0.0f, err, errlen)))
		return rc;
	if (log_mul != 0.0f) {
		model_key(m, "rope.scaling.yarn_log_multiplier", key, sizeof(key));
		return log_errf(err, errlen, -ENOTSUP,
				"metadata '%s' = %g: DeepSeek's YaRN magnitude correction is not supported",
				key, (double)log_mul);
	}
	/* llama.cpp multiplies by rope.scaling.attn_factor whatever the type. */
	if ((rc = opt_f32(m, "rope.scaling.attn_factor", &m->rope.attn_factor, 1.0f, err, errlen)))
		return rc;
	hp->max_ctx = hp->train_ctx;
	if (!strcmp(hp->rope_scaling, "none")) {
		hp->rope_factor = 1.0f;
		return 0;
	}
	if (!strcmp(hp->rope_scaling, "llama3"))
		return llama3_load(m, err, errlen);
	m->rope.freq_scale = 1.0f / hp->rope_factor;
	if (hp->rope_factor > 1.0f) {
		double stretched = (double)hp->rope_orig_ctx * hp->rope_factor;
		if (stretched > hp->max_ctx)
			hp->max_ctx = stretched > (double)(1u << 24) ? 1u << 24 : (uint32_t)stretched;
	}
	return strcmp(hp->rope_scaling, "yarn") ? 0 : yarn_load(m, err, errlen);
}
