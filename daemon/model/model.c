/* model.c — maps a GGUF of one of the architectures in arch_table into struct model, checking every shape against the metadata. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
#include "daemon/model/gguf.h"
#include "daemon/model/model_int.h"
#include "daemon/log.h"

/*
 * What each architecture changes in the one forward pass, as llama.cpp's
 * graph builders for them do. Q/K/V biases and a fused attn_qkv are read
 * wherever the file has them (llama.cpp's create_tensor_qkv is the same
 * for all of these).
 */
struct arch_row {
	const char *name;
	enum model_arch id;
	int neox;		/* RoPE rotates (i, i + rot_dim / 2) */
	int fused_up;		/* ffn_up is (2 * ffn_dim, dim): gate rows, then up rows; no ffn_gate */
	int always_tied;	/* the LM head is token_embd, whatever else the file holds */
	int embd_scaled;	/* embeddings times sqrt(dim) */
	enum model_act act;
	int post_norms;		/* post_attention_norm and post_ffw_norm */
	int softcaps;		/* attn_logit_softcapping (50) and final_logit_softcapping (30) */
	uint32_t swa_pattern;	/* 0: no sliding window; n: layer l slides when l % n < n - 1 */
	int rope_freqs;		/* rope_freqs.weight may hold frequency factors */
	int q_prescale;		/* Q times the attention scale after RoPE, then attention at scale 1 */
	int longrope;		/* rope_factors_long/short may hold LongRoPE's factors (Phi-3 128k, 3.5) */
};

static const struct arch_row arch_table[] = {
	{ .name = "llama", .id = MODEL_ARCH_LLAMA, .rope_freqs = 1 },
	{ .name = "mistral", .id = MODEL_ARCH_LLAMA, .rope_freqs = 1 },
	{ .name = "qwen2", .id = MODEL_ARCH_QWEN2, .neox = 1 },
	/* llama.cpp reads phi3.attention.sliding_window and then disables it (its PR 13676): so do we. */
	{ .name = "phi3", .id = MODEL_ARCH_PHI3, .neox = 1, .fused_up = 1, .q_prescale = 1,
	  .longrope = 1 },
	{ .name = "gemma", .id = MODEL_ARCH_GEMMA, .neox = 1, .always_tied = 1, .embd_scaled = 1,
	  .act = MODEL_ACT_GELU, .q_prescale = 1 },
	{ .name = "gemma2", .id = MODEL_ARCH_GEMMA2, .neox = 1, .always_tied = 1, .embd_scaled = 1,
	  .act = MODEL_ACT_GELU, .post_norms = 1, .softcaps = 1, .swa_pattern = 2, .q_prescale = 1 },
};
#define N_ARCH (sizeof(arch_table) / sizeof(arch_table[0]))

const char *model_arch_name(enum model_arch a)
{
	for (size_t i = 0; i < N_ARCH; i++)
		if (arch_table[i].id == a)
			return arch_table[i].name;
	return "unknown";
}

static const struct arch_row *arch_of(const struct model *m)
{
	for (size_t i = 0; i < N_ARCH; i++)
		if (!strcmp(m->hp.arch, arch_table[i].name))
			return &arch_table[i];
	return NULL;
}

int model_key(const struct model *m, const char *suffix, char *key, size_t len)
{
	int n = snprintf(key, len, "%s.%s", m->hp.arch, suffix);
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

int model_get_u32(const struct model *m, const char *suffix, uint32_t *v, char *err, size_t errlen)
{
	char key[96];
	model_key(m, suffix, key, sizeof(key));
	int rc = gguf_get_u32(m->gguf, key, v);
	if (rc && rc != -ENOENT)
		return log_errf(err, errlen, -EINVAL, "metadata '%s': not an unsigned integer", key);
	return rc;
}

int model_get_f32(const struct model *m, const char *suffix, float *v, char *err, size_t errlen)
{
	char key[96];
	model_key(m, suffix, key, sizeof(key));
	int rc = gguf_get_f32(m->gguf, key, v);
	if (rc && rc != -ENOENT)
		return log_errf(err, errlen, -EINVAL, "metadata '%s': not a float", key);
	return rc;
}

static int get_u32(const struct model *m, const char *suffix, uint32_t *v, int required,
		   char *err, size_t errlen)
{
	int rc = model_get_u32(m, suffix, v, err, errlen);
	if (rc == -ENOENT && required) {
		char key[96];
		model_key(m, suffix, key, sizeof(key));
		return log_errf(err, errlen, -EINVAL, "metadata '%s': missing", key);
	}
	return rc == -ENOENT ? 0 : rc;
}

static int get_f32(const struct model *m, const char *suffix, float *v, char *err, size_t errlen)
{
	int rc = model_get_f32(m, suffix, v, err, errlen);
	return rc == -ENOENT ? 0 : rc;
}

static int shape_err(const struct gguf_tensor *t, const char *name, uint64_t cols, uint64_t rows,
		     char *err, size_t errlen)
{
	return log_errf(err, errlen, -EINVAL,
			"tensor '%s': shape [%llu, %llu, %llu, %llu], expected [%llu, %llu]", name,
			(unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
			(unsigned long long)t->ne[2], (unsigned long long)t->ne[3],
			(unsigned long long)cols, (unsigned long long)rows);
}

/* Bind weight name to w, requiring ne = {cols, rows} (rows = 0: 1-D of cols). */
static int bind(struct model *m, const char *name, struct kb_weight *w, uint64_t cols,
		uint64_t rows, char *err, size_t errlen)
{
	const struct gguf_tensor *t = gguf_find_tensor(m->gguf, name);
	if (!t)
		return log_errf(err, errlen, -EINVAL, "tensor '%s': missing", name);
	uint64_t want_rows = rows ? rows : 1;
	if (t->ne[0] != cols || t->ne[1] != want_rows || t->ne[2] != 1 || t->ne[3] != 1)
		return shape_err(t, name, cols, want_rows, err, errlen);
	uint32_t be, bb;
	if (kb_type_block(t->type, &be, &bb))
		return log_errf(err, errlen, -ENOTSUP, "tensor '%s': type %s not supported by the backend",
			    name, kb_type_name(t->type));
	if (m->used)
		m->used[t - m->gguf->tensors] = 1;
	w->data = t->data;
	w->type = t->type;
	w->rows = (uint32_t)want_rows;
	w->cols = (uint32_t)cols;
	w->row_bytes = (size_t)(cols / be) * bb;
	return 0;
}

/* A 1-D f32 vector of length n (norm weights, biases, frequency factors). */
static int bind_vec(struct model *m, const char *name, const float **out, uint32_t n,
		    char *err, size_t errlen)
{
	struct kb_weight w;
	int rc = bind(m, name, &w, n, 0, err, errlen);
	if (rc)
		return rc;
	if (w.type != KB_F32)
		return log_errf(err, errlen, -ENOTSUP, "tensor '%s': must be F32, not %s", name,
			    kb_type_name(w.type));
	*out = w.data;
	return 0;
}

/* Rows [first, first + rows) of w, in place: a part of a fused weight. */
static struct kb_weight view_rows(const struct kb_weight *w, uint32_t first, uint32_t rows)
{
	struct kb_weight v = *w;
	v.data = (const uint8_t *)w->data + (size_t)first * w->row_bytes;
	v.rows = rows;
	return v;
}

static int load_name(struct model *m, const char *path)
{
	struct model_hparams *hp = &m->hp;
	struct gguf_str s;
	if (!gguf_get_str(m->gguf, "general.name", &s) && s.len) {
		size_t n = s.len < sizeof(hp->name) - 1 ? s.len : sizeof(hp->name) - 1;
		memcpy(hp->name, s.ptr, n);
	} else {
		const char *base = strrchr(path, '/');
		snprintf(hp->name, sizeof(hp->name), "%s", base ? base + 1 : path);
	}
	return 0;
}

static int load_arch(struct model *m, char *err, size_t errlen)
{
	struct model_hparams *hp = &m->hp;
	struct gguf_str s;
	if (gguf_get_str(m->gguf, "general.architecture", &s))
		return log_errf(err, errlen, -EINVAL, "metadata 'general.architecture': missing");
	if (s.len >= sizeof(hp->arch))
		return log_errf(err, errlen, -ENOTSUP, "unsupported architecture '%.*s'",
			    (int)(s.len > 64 ? 64 : s.len), s.ptr);
	memcpy(hp->arch, s.ptr, s.len);
	hp->arch[s.len] = 0;
	const struct arch_row *a = arch_of(m);
	if (!a)
		return log_errf(err, errlen, -ENOTSUP,
			    "unsupported architecture '%s' (kvd runs llama, mistral, qwen2, phi3, "
			    "gemma and gemma2)", hp->arch);
	hp->arch_id = a->id;
	hp->rope_neox = a->neox;
	hp->act = a->act;
	hp->post_norms = a->post_norms;
	hp->q_prescale = a->q_prescale;
	return 0;
}

/* Head size: attention.key_length where given (Mistral Nemo, Gemma), else dim / heads. */
static int load_head_dim(struct model *m, char *err, size_t errlen)
{
	struct model_hparams *hp = &m->hp;
	uint32_t k = 0, v = 0;
	char key[96];
	int rc;
	if ((rc = get_u32(m, "attention.key_length", &k, 0, err, errlen)) ||
	    (rc = get_u32(m, "attention.value_length", &v, 0, err, errlen)))
		return rc;
	if (k && v && k != v) {
		model_key(m, "attention.value_length", key, sizeof(key));
		return log_errf(err, errlen, -ENOTSUP,
				"metadata '%s' = %u: a value head size other than the key's (%u) is "
				"not supported", key, v, k);
	}
	if (!k && v)
		k = v;
	if (!k && hp->dim % hp->n_heads)
		return log_errf(err, errlen, -EINVAL, "dim %u is not a multiple of heads %u and "
				"there is no attention.key_length", hp->dim, hp->n_heads);
	hp->head_dim = k ? k : hp->dim / hp->n_heads;
	if (hp->head_dim == 0 || hp->head_dim > 1024 || hp->head_dim % 2)
		return log_errf(err, errlen, -EINVAL, "head size %u out of range", hp->head_dim);
	hp->q_dim = hp->n_heads * hp->head_dim;
	hp->kv_dim = hp->n_kv_heads * hp->head_dim;
	return 0;
}

static int load_hparams(struct model *m, char *err, size_t errlen)
{
	struct model_hparams *hp = &m->hp;
	int rc;
	if ((rc = get_u32(m, "block_count", &hp->n_layers, 1, err, errlen)) ||
	    (rc = get_u32(m, "embedding_length", &hp->dim, 1, err, errlen)) ||
	    (rc = get_u32(m, "attention.head_count", &hp->n_heads, 1, err, errlen)) ||
	    (rc = get_u32(m, "feed_forward_length", &hp->ffn_dim, 1, err, errlen)) ||
	    (rc = get_u32(m, "context_length", &hp->ctx_len, 1, err, errlen)))
		return rc;
	hp->n_kv_heads = hp->n_heads;
	if ((rc = get_u32(m, "attention.head_count_kv", &hp->n_kv_heads, 0, err, errlen)))
		return rc;
	if (hp->n_layers == 0 || hp->n_layers > 1024 || hp->dim == 0 || hp->dim > 65536 ||
	    hp->n_heads == 0 || hp->n_heads > 1024 || hp->n_kv_heads == 0 ||
	    hp->n_heads % hp->n_kv_heads || hp->ffn_dim == 0 || hp->ffn_dim > 1u << 20 ||
	    hp->ctx_len == 0)
		return log_errf(err, errlen, -EINVAL,
			    "inconsistent hyperparameters: layers %u dim %u heads %u kv_heads %u ffn %u ctx %u",
			    hp->n_layers, hp->dim, hp->n_heads, hp->n_kv_heads, hp->ffn_dim,
			    hp->ctx_len);
	hp->train_ctx = hp->ctx_len;
	if ((rc = load_head_dim(m, err, errlen)))
		return rc;
	hp->rot_dim = hp->head_dim;
	if ((rc = get_u32(m, "rope.dimension_count", &hp->rot_dim, 0, err, errlen)))
		return rc;
	if (hp->rot_dim == 0 || hp->rot_dim > hp->head_dim || hp->rot_dim % 2)
		return log_errf(err, errlen, -EINVAL, "metadata '%s.rope.dimension_count': %u does not fit head_dim %u",
			    hp->arch, hp->rot_dim, hp->head_dim);
	hp->rope_theta = 10000.0f;
	hp->norm_eps = 1e-5f;
	if ((rc = get_f32(m, "rope.freq_base", &hp->rope_theta, err, errlen)) ||
	    (rc = get_f32(m, "attention.layer_norm_rms_epsilon", &hp->norm_eps, err, errlen)))
		return rc;
	if (!(hp->rope_theta > 1.0f) || !(hp->norm_eps > 0.0f))
		return log_errf(err, errlen, -EINVAL, "bad rope theta %g or norm epsilon %g",
			    (double)hp->rope_theta, (double)hp->norm_eps);
	hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
	return model_rope_load(m, err, errlen);
}

/* Refuse key when the file has it: its math has no code here. */
static int refuse_key(const struct model *m, const char *suffix, const char *why, char *err,
		      size_t errlen)
{
	char key[96];
	model_key(m, suffix, key, sizeof(key));
	if (gguf_find_kv(m->gguf, key))
		return log_errf(err, errlen, -ENOTSUP, "metadata '%s': %s", key, why);
	return 0;
}

/* Gemma 2: soft-capping and which layers slide, with llama.cpp's defaults. */
static int load_gemma2(struct model *m, char *err, size_t errlen)
{
	struct model_hparams *hp = &m->hp;
	uint32_t pattern = 2;
	float base_swa = hp->rope_theta;
	int rc;
	hp->attn_softcap = 50.0f;
	hp->final_softcap = 30.0f;
	hp->swa_window = 4096;
	if ((rc = get_f32(m, "attn_logit_softcapping", &hp->attn_softcap, err, errlen)) ||
	    (rc = get_f32(m, "final_logit_softcapping", &hp->final_softcap, err, errlen)) ||
	    (rc = get_u32(m, "attention.sliding_window", &hp->swa_window, 0, err, errlen)) ||
	    (rc = get_u32(m, "attention.sliding_window_pattern", &pattern, 0, err, errlen)) ||
	    (rc = get_f32(m, "rope.freq_base_swa", &base_swa, err, errlen)))
		return rc;
	if (base_swa != hp->rope_theta)
		return refuse_key(m, "rope.freq_base_swa", "another RoPE base on the sliding-window "
				  "layers is not supported", err, errlen);
	if (pattern == 0 || hp->attn_softcap < 0.0f || hp->final_softcap < 0.0f)
		return log_errf(err, errlen, -EINVAL, "gemma2: bad sliding-window pattern %u or "
				"soft-caps %g, %g", pattern, (double)hp->attn_softcap,
				(double)hp->final_softcap);
	/* llama.cpp (after gemma_pytorch): the 27B (46 layers) scales by dim / heads, not head_dim. */
	if (hp->n_layers == 46)
		hp->attn_scale = 1.0f / sqrtf((float)(hp->dim / hp->n_heads));
	for (uint32_t l = 0; l < hp->n_layers; l++)
		m->layers[l].window = l % pattern < pattern - 1 ? hp->swa_window : 0;
	return 0;
}

/*
 * Metadata that changes the forward pass where kvd has no code for it: a
 * file that sets one is refused by name rather than run without it.
 */
static int check_math_keys(struct model *m, const struct arch_row *a, char *err, size_t errlen)
{
	uint32_t v;
	int rc;
	if (!a->longrope && (gguf_find_tensor(m->gguf, "rope_factors_long.weight") ||
			     gguf_find_tensor(m->gguf, "rope_factors_short.weight")))
		return log_errf(err, errlen, -ENOTSUP,
				"tensor '%s': LongRoPE factors are not part of this architecture's "
				"forward pass",
				gguf_find_tensor(m->gguf, "rope_factors_long.weight")
					? "rope_factors_long.weight" : "rope_factors_short.weight");
	if (!model_get_u32(m, "expert_count", &v, NULL, 0) && v > 0) {
		char key[96];
		model_key(m, "expert_count", key, sizeof(key));
		return log_errf(err, errlen, -ENOTSUP,
			    "metadata '%s' = %u: mixture-of-experts models are not supported", key, v);
	}
	if ((rc = refuse_key(m, "attention.scale", "an attention scale other than 1 / sqrt(head "
			     "size) is not supported", err, errlen)))
		return rc;
	if (a->softcaps)
		return 0;
	if ((rc = refuse_key(m, "attn_logit_softcapping", "soft-capping is not part of this "
			     "architecture's forward pass", err, errlen)) ||
	    (rc = refuse_key(m, "final_logit_softcapping", "soft-capping is not part of this "
			     "architecture's forward pass", err, errlen)))
		return rc;
	return refuse_key(m, "attention.sliding_window_pattern", "alternating sliding-window "
			  "layers are not part of this architecture's forward pass", err, errlen);
}

/*
 * LongRoPE's two sets of frequency factors: llama.cpp uses the long ones when
 * the context a sequence may reach is above the original one, the short
 * ones otherwise, for every position (model_set_ctx picks).
 */
static int bind_longrope(struct model *m, char *err, size_t errlen)
{
	const struct model_hparams *hp = &m->hp;
	int have_long = gguf_find_tensor(m->gguf, "rope_factors_long.weight") != NULL;
	int have_short = gguf_find_tensor(m->gguf, "rope_factors_short.weight") != NULL;
	if (!have_long && !have_short)
		return 0;
	if (have_long != have_short)
		return log_errf(err, errlen, -EINVAL, "tensor 'rope_factors_%s.weight': missing, "
				"LongRoPE needs both the long and the short factors",
				have_long ? "short" : "long");
	if (m->rope_factors_own || gguf_find_tensor(m->gguf, "rope_freqs.weight"))
		return log_errf(err, errlen, -ENOTSUP, "tensor 'rope_factors_long.weight': the file "
				"gives frequency factors twice (also rope_freqs or llama3 metadata)");
	int rc = bind_vec(m, "rope_factors_long.weight", &m->rope_long, hp->rot_dim / 2, err, errlen);
	if (!rc)
		rc = bind_vec(m, "rope_factors_short.weight", &m->rope_short, hp->rot_dim / 2, err,
			      errlen);
	return rc;
}

/* The LM head, and frequency factors of rope_freqs.weight (Llama 3) or LongRoPE. */
static int load_globals(struct model *m, const struct arch_row *a, char *err, size_t errlen)
{
	struct model_hparams *hp = &m->hp;
	const struct gguf_tensor *te = gguf_find_tensor(m->gguf, "token_embd.weight");
	if (!te)
		return log_errf(err, errlen, -EINVAL, "tensor 'token_embd.weight': missing");
	hp->vocab = (uint32_t)te->ne[1];
	if (te->ne[1] == 0 || te->ne[1] > 1u << 24)
		return log_errf(err, errlen, -EINVAL, "tensor 'token_embd.weight': vocabulary of %llu",
			    (unsigned long long)te->ne[1]);
	int rc = bind(m, "token_embd.weight", &m->tok_embd, hp->dim, hp->vocab, err, errlen);
	if (rc)
		return rc;
	if ((rc = bind_vec(m, "output_norm.weight", &m->output_norm, hp->dim, err, errlen)))
		return rc;
	if (!a->always_tied && gguf_find_tensor(m->gguf, "output.weight")) {
		if ((rc = bind(m, "output.weight", &m->output, hp->dim, hp->vocab, err, errlen)))
			return rc;
	} else {
		m->output = m->tok_embd;
		hp->tied_output = 1;
	}
	if (a->embd_scaled)
		hp->embd_scale = sqrtf((float)hp->dim);
	if (a->longrope && (rc = bind_longrope(m, err, errlen)))
		return rc;
	if (!a->rope_freqs || !gguf_find_tensor(m->gguf, "rope_freqs.weight"))
		return 0;
	if (m->rope_factors_own)
		return log_errf(err, errlen, -ENOTSUP, "tensor 'rope_freqs.weight': the file gives "
				"frequency factors twice (also as llama3 rope.scaling metadata)");
	return bind_vec(m, "rope_freqs.weight", &m->rope.h_freq_factors, hp->rot_dim / 2, err,
			errlen);
}

/* Optional F32 vector: bound when the file has it, else *out stays NULL. */
static int bind_opt(struct model *m, const char *name, const float **out, uint32_t n, char *err,
		    size_t errlen)
{
	if (!gguf_find_tensor(m->gguf, name))
		return 0;
	return bind_vec(m, name, out, n, err, errlen);
}

/* Q, K, V of layer l: separate, or views of one fused attn_qkv; their biases where present. */
static int load_qkv(struct model *m, uint32_t l, struct model_layer *L, char *err, size_t errlen)
{
	const struct model_hparams *hp = &m->hp;
	char n[3][64];
	int rc;
	snprintf(n[0], sizeof(n[0]), "blk.%u.attn_qkv.weight", l);
	if (gguf_find_tensor(m->gguf, n[0])) {
		struct kb_weight qkv;
		const float *b = NULL;
		snprintf(n[1], sizeof(n[1]), "blk.%u.attn_qkv.bias", l);
		if ((rc = bind(m, n[0], &qkv, hp->dim, hp->q_dim + 2 * hp->kv_dim, err, errlen)) ||
		    (rc = bind_opt(m, n[1], &b, hp->q_dim + 2 * hp->kv_dim, err, errlen)))
			return rc;
		L->wq = view_rows(&qkv, 0, hp->q_dim);
		L->wk = view_rows(&qkv, hp->q_dim, hp->kv_dim);
		L->wv = view_rows(&qkv, hp->q_dim + hp->kv_dim, hp->kv_dim);
		if (b) {
			L->bq = b;
			L->bk = b + hp->q_dim;
			L->bv = b + hp->q_dim + hp->kv_dim;
		}
		return 0;
	}
	static const char *const names[3] = { "attn_q", "attn_k", "attn_v" };
	struct kb_weight *w[3] = { &L->wq, &L->wk, &L->wv };
	const float **bias[3] = { &L->bq, &L->bk, &L->bv };
	for (int i = 0; i < 3; i++) {
		uint32_t rows = i ? hp->kv_dim : hp->q_dim;
		snprintf(n[0], sizeof(n[0]), "blk.%u.%s.weight", l, names[i]);
		snprintf(n[1], sizeof(n[1]), "blk.%u.%s.bias", l, names[i]);
		if ((rc = bind(m, n[0], w[i], hp->dim, rows, err, errlen)) ||
		    (rc = bind_opt(m, n[1], bias[i], rows, err, errlen)))
			return rc;
	}
	return 0;
}

/* Gate and up of layer l: separate, or the two halves of a fused ffn_up (gate first, as ggml's swiglu splits it). */
static int load_ffn(struct model *m, const struct arch_row *a, uint32_t l, struct model_layer *L,
		    char *err, size_t errlen)
{
	const struct model_hparams *hp = &m->hp;
	char g[64], u[64], d[64];
	snprintf(g, sizeof(g), "blk.%u.ffn_gate.weight", l);
	snprintf(u, sizeof(u), "blk.%u.ffn_up.weight", l);
	snprintf(d, sizeof(d), "blk.%u.ffn_down.weight", l);
	int rc;
	if (a->fused_up) {
		struct kb_weight up;
		if ((rc = bind(m, u, &up, hp->dim, 2 * (uint64_t)hp->ffn_dim, err, errlen)))
			return rc;
		L->w_gate = view_rows(&up, 0, hp->ffn_dim);
		L->w_up = view_rows(&up, hp->ffn_dim, hp->ffn_dim);
	} else if ((rc = bind(m, g, &L->w_gate, hp->dim, hp->ffn_dim, err, errlen)) ||
		   (rc = bind(m, u, &L->w_up, hp->dim, hp->ffn_dim, err, errlen))) {
		return rc;
	}
	return bind(m, d, &L->w_down, hp->ffn_dim, hp->dim, err, errlen);
}

static int load_layer(struct model *m, const struct arch_row *a, uint32_t l, char *err,
		      size_t errlen)
{
	const struct model_hparams *hp = &m->hp;
	struct model_layer *L = &m->layers[l];
	char n[4][64];
	snprintf(n[0], sizeof(n[0]), "blk.%u.attn_norm.weight", l);
	snprintf(n[1], sizeof(n[1]), "blk.%u.attn_output.weight", l);
	snprintf(n[2], sizeof(n[2]), "blk.%u.ffn_norm.weight", l);
	int rc;
	if ((rc = bind_vec(m, n[0], &L->attn_norm, hp->dim, err, errlen)) ||
	    (rc = load_qkv(m, l, L, err, errlen)) ||
	    (rc = bind(m, n[1], &L->wo, hp->q_dim, hp->dim, err, errlen)) ||
	    (rc = bind_vec(m, n[2], &L->ffn_norm, hp->dim, err, errlen)) ||
	    (rc = load_ffn(m, a, l, L, err, errlen)))
		return rc;
	if (!a->post_norms)
		return 0;
	snprintf(n[0], sizeof(n[0]), "blk.%u.post_attention_norm.weight", l);
	snprintf(n[1], sizeof(n[1]), "blk.%u.post_ffw_norm.weight", l);
	if ((rc = bind_vec(m, n[0], &L->post_attn_norm, hp->dim, err, errlen)))
		return rc;
	return bind_vec(m, n[1], &L->post_ffn_norm, hp->dim, err, errlen);
}

static int load_weights(struct model *m, const struct arch_row *a, char *err, size_t errlen)
{
	struct model_hparams *hp = &m->hp;
	int rc = load_globals(m, a, err, errlen);
	if (rc)
		return rc;
	m->layers = calloc(hp->n_layers, sizeof(*m->layers));
	if (!m->layers)
		return -ENOMEM;
	for (uint32_t l = 0; l < hp->n_layers; l++) {
		if ((rc = load_layer(m, a, l, err, errlen)))
			return rc;
		const struct model_layer *L = &m->layers[l];
		hp->qkv_bias |= L->bq || L->bk || L->bv;
	}
	if (a->softcaps && (rc = load_gemma2(m, err, errlen)))
		return rc;
	for (uint64_t i = 0; i < m->gguf->n_tensors; i++)
		m->weight_bytes += m->gguf->tensors[i].size;
	return 0;
}

/* Every tensor of the file is one the forward pass reads: refuse the first it would ignore. */
static int check_all_used(const struct model *m, char *err, size_t errlen)
{
	for (uint64_t i = 0; i < m->gguf->n_tensors; i++) {
		if (m->used[i])
			continue;
		const struct gguf_str *n = &m->gguf->tensors[i].name;
		int len = (int)(n->len > 64 ? 64 : n->len);
		return log_errf(err, errlen, -ENOTSUP,
			    "tensor '%.*s': not part of the %s forward pass kvd runs; refusing "
			    "rather than running the model without it", len, n->ptr, m->hp.arch);
	}
	return 0;
}

static void model_release(struct model *m)
{
	free(m->used);
	free(m->layers);
	free(m->rope_factors_own);
	gguf_close(m->gguf);
	free(m);
}

int model_load(struct model **out, const char *path, char *err, size_t errlen)
{
	struct model *m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	int rc = gguf_open(&m->gguf, path, err, errlen);
	if (rc) {
		free(m);
		return rc;
	}
	m->used = calloc(m->gguf->n_tensors ? m->gguf->n_tensors : 1, 1);
	if (!m->used) {
		model_release(m);
		return -ENOMEM;
	}
	load_name(m, path);
	const struct arch_row *a = NULL;
	if (!(rc = load_arch(m, err, errlen)))
		a = arch_of(m);
	if (rc || (rc = check_math_keys(m, a, err, errlen)) || (rc = load_hparams(m, err, errlen)) ||
	    (rc = load_weights(m, a, err, errlen)) || (rc = check_all_used(m, err, errlen))) {
		model_release(m);
		return rc;
	}
	free(m->used);
	m->used = NULL;
	model_pick_longrope(m);
	*out = m;
	return 0;
}

uint64_t model_identity(const struct model *m)
{
	const struct gguf_file *f = m->gguf;
	size_t meta = f->size;
	XXH3_state_t st;

	/* The tensor data starts at the lowest offset: everything before it is metadata. */
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		size_t off = (size_t)((const uint8_t *)f->tensors[i].data - f->base);
		if (off < meta)
			meta = off;
	}
	XXH3_64bits_reset(&st);
	XXH3_64bits_update(&st, f->base, meta);
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		const struct gguf_tensor *t = &f->tensors[i];
		XXH3_64bits_update(&st, t->data, t->size < 4096 ? t->size : 4096);
	}
	return XXH3_64bits_digest(&st);
}

void model_free(struct model *m)
{
	if (m)
		model_release(m);
}

void model_pick_longrope(struct model *m)
{
	if (m->rope_long)
		m->rope.h_freq_factors = m->hp.ctx_len > m->hp.rope_orig_ctx ? m->rope_long
									    : m->rope_short;
}

int model_set_ctx(struct model *m, uint32_t ctx, char *err, size_t errlen)
{
	const struct model_hparams *hp = &m->hp;
	if (ctx > hp->max_ctx && hp->max_ctx > hp->train_ctx)
		return log_errf(err, errlen, -ERANGE,
				"ctx %u is longer than the %u positions the model's %s RoPE scaling "
				"(by %g from %u) reaches: use ctx %u or less (0: the trained %u)",
				ctx, hp->max_ctx, hp->rope_scaling, (double)hp->rope_factor,
				hp->rope_orig_ctx, hp->max_ctx, hp->train_ctx);
	if (ctx > hp->max_ctx)
		return log_errf(err, errlen, -ERANGE,
				"ctx %u is longer than the model's trained context of %u positions, and kvd "
				"does no RoPE scaling to stretch it: use ctx %u or less (0: the model's)",
				ctx, hp->train_ctx, hp->train_ctx);
	m->hp.ctx_len = ctx ? ctx : hp->train_ctx;
	model_pick_longrope(m);
	return 0;
}

size_t model_kv_bytes_per_token(const struct model *m, size_t elem_bytes)
{
	return 2 * (size_t)m->hp.n_layers * m->hp.kv_dim * elem_bytes;
}
