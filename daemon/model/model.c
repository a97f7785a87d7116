/* model.c — maps a Llama-family GGUF into struct model, checking every shape against the metadata. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/model/gguf.h"
#include "daemon/model/model.h"
#include "daemon/log.h"

/* Architectures that share Llama's tensor layout and forward pass. */
static const char *const llama_family[] = { "llama", "mistral", NULL };

static int arch_key(const struct model *m, const char *suffix, char *key, size_t len)
{
	int n = snprintf(key, len, "%s.%s", m->hp.arch, suffix);
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

static int get_u32(const struct model *m, const char *suffix, uint32_t *v, int required,
		   char *err, size_t errlen)
{
	char key[96];
	arch_key(m, suffix, key, sizeof(key));
	int rc = gguf_get_u32(m->gguf, key, v);
	if (rc == -ENOENT && !required)
		return 0;
	if (rc)
		return log_errf(err, errlen, -EINVAL, "metadata '%s': %s", key,
			    rc == -ENOENT ? "missing" : "not an unsigned integer");
	return 0;
}

static int get_f32(const struct model *m, const char *suffix, float *v, char *err, size_t errlen)
{
	char key[96];
	arch_key(m, suffix, key, sizeof(key));
	int rc = gguf_get_f32(m->gguf, key, v);
	if (rc && rc != -ENOENT)
		return log_errf(err, errlen, -EINVAL, "metadata '%s': not a float", key);
	return 0;
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
		return log_errf(err, errlen, -EINVAL,
			    "tensor '%s': shape [%llu, %llu, %llu, %llu], expected [%llu, %llu]",
			    name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
			    (unsigned long long)t->ne[2], (unsigned long long)t->ne[3],
			    (unsigned long long)cols, (unsigned long long)want_rows);
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

/* A 1-D f32 norm weight of length dim. */
static int bind_norm(struct model *m, const char *name, const float **out, uint32_t dim,
		     char *err, size_t errlen)
{
	struct kb_weight w;
	int rc = bind(m, name, &w, dim, 0, err, errlen);
	if (rc)
		return rc;
	if (w.type != KB_F32)
		return log_errf(err, errlen, -ENOTSUP, "tensor '%s': norm weights must be F32, not %s",
			    name, kb_type_name(w.type));
	*out = w.data;
	return 0;
}

static int load_hparams(struct model *m, const char *path, char *err, size_t errlen)
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
	int ok = 0;
	for (int i = 0; llama_family[i]; i++)
		ok |= !strcmp(hp->arch, llama_family[i]);
	if (!ok)
		return log_errf(err, errlen, -ENOTSUP,
			    "unsupported architecture '%s' (kvd runs the llama family)", hp->arch);
	if (!gguf_get_str(m->gguf, "general.name", &s) && s.len) {
		size_t n = s.len < sizeof(hp->name) - 1 ? s.len : sizeof(hp->name) - 1;
		memcpy(hp->name, s.ptr, n);
	} else {
		const char *base = strrchr(path, '/');
		snprintf(hp->name, sizeof(hp->name), "%s", base ? base + 1 : path);
	}

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
	    hp->n_heads == 0 || hp->dim % hp->n_heads || hp->n_kv_heads == 0 ||
	    hp->n_heads % hp->n_kv_heads || hp->ffn_dim == 0 || hp->ffn_dim > 1u << 20 ||
	    hp->ctx_len == 0)
		return log_errf(err, errlen, -EINVAL,
			    "inconsistent hyperparameters: layers %u dim %u heads %u kv_heads %u ffn %u ctx %u",
			    hp->n_layers, hp->dim, hp->n_heads, hp->n_kv_heads, hp->ffn_dim,
			    hp->ctx_len);
	hp->train_ctx = hp->ctx_len;
	hp->head_dim = hp->dim / hp->n_heads;
	hp->kv_dim = hp->n_kv_heads * hp->head_dim;
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
	/* GGUF stores Llama's Q/K rows permuted so that RoPE rotates adjacent pairs. */
	hp->rope_neox = 0;
	return 0;
}

static int load_weights(struct model *m, char *err, size_t errlen)
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
	if ((rc = bind_norm(m, "output_norm.weight", &m->output_norm, hp->dim, err, errlen)))
		return rc;
	if (gguf_find_tensor(m->gguf, "output.weight")) {
		if ((rc = bind(m, "output.weight", &m->output, hp->dim, hp->vocab, err, errlen)))
			return rc;
	} else {
		m->output = m->tok_embd;
		hp->tied_output = 1;
	}
	if (gguf_find_tensor(m->gguf, "blk.0.attn_q.bias"))
		return log_errf(err, errlen, -ENOTSUP, "tensor 'blk.0.attn_q.bias': attention biases are not supported");

	m->layers = calloc(hp->n_layers, sizeof(*m->layers));
	if (!m->layers)
		return -ENOMEM;
	uint32_t qd = hp->n_heads * hp->head_dim;
	for (uint32_t l = 0; l < hp->n_layers; l++) {
		struct model_layer *L = &m->layers[l];
		char n[9][64];
		static const char *const names[9] = {
			"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
			"ffn_norm", "ffn_gate", "ffn_up", "ffn_down",
		};
		for (int i = 0; i < 9; i++)
			snprintf(n[i], sizeof(n[i]), "blk.%u.%s.weight", l, names[i]);
		if ((rc = bind_norm(m, n[0], &L->attn_norm, hp->dim, err, errlen)) ||
		    (rc = bind(m, n[1], &L->wq, hp->dim, qd, err, errlen)) ||
		    (rc = bind(m, n[2], &L->wk, hp->dim, hp->kv_dim, err, errlen)) ||
		    (rc = bind(m, n[3], &L->wv, hp->dim, hp->kv_dim, err, errlen)) ||
		    (rc = bind(m, n[4], &L->wo, qd, hp->dim, err, errlen)) ||
		    (rc = bind_norm(m, n[5], &L->ffn_norm, hp->dim, err, errlen)) ||
		    (rc = bind(m, n[6], &L->w_gate, hp->dim, hp->ffn_dim, err, errlen)) ||
		    (rc = bind(m, n[7], &L->w_up, hp->dim, hp->ffn_dim, err, errlen)) ||
		    (rc = bind(m, n[8], &L->w_down, hp->ffn_dim, hp->dim, err, errlen)))
			return rc;
	}
	return 0;
}

/*
 * Metadata that changes the forward pass where kvd has no code for it: a
 * file that sets one is refused by name rather than run without it.
 */
static int check_math_keys(struct model *m, char *err, size_t errlen)
{
	const struct model_hparams *hp = &m->hp;
	char key[96], fkey[96];
	struct gguf_str s;
	float f;
	uint32_t v;
	arch_key(m, "rope.scaling.type", key, sizeof(key));
	if (!gguf_get_str(m->gguf, key, &s) && !(s.len == 4 && !memcmp(s.ptr, "none", 4))) {
		arch_key(m, "rope.scaling.factor", fkey, sizeof(fkey));
		/* "linear" by a factor of 1 is no scaling at all. */
		if (!(s.len == 6 && !memcmp(s.ptr, "linear", 6) &&
		      (gguf_get_f32(m->gguf, fkey, &f) || f == 1.0f)))
			return log_errf(err, errlen, -ENOTSUP,
				    "metadata '%s' = '%.*s': kvd does no RoPE scaling, and would "
				    "rotate every position by the wrong angle",
				    key, (int)(s.len > 32 ? 32 : s.len), s.ptr);
	}
	static const char *const dims[] = { "attention.key_length", "attention.value_length" };
	for (int i = 0; i < 2; i++) {
		arch_key(m, dims[i], key, sizeof(key));
		if (!gguf_get_u32(m->gguf, key, &v) && v != hp->head_dim)
			return log_errf(err, errlen, -ENOTSUP,
				    "metadata '%s' = %u: a head size other than dim / heads (%u) "
				    "is not supported", key, v, hp->head_dim);
	}
	arch_key(m, "expert_count", key, sizeof(key));
	if (!gguf_get_u32(m->gguf, key, &v) && v > 0)
		return log_errf(err, errlen, -ENOTSUP,
			    "metadata '%s' = %u: mixture-of-experts models are not supported", key, v);
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
		if (n->len == 17 && !memcmp(n->ptr, "rope_freqs.weight", 17))
			return log_errf(err, errlen, -ENOTSUP,
				    "tensor 'rope_freqs.weight': Llama 3 RoPE frequency factors "
				    "are not supported, and without them every position is wrong");
		return log_errf(err, errlen, -ENOTSUP,
			    "tensor '%.*s': not part of the %s forward pass kvd runs; refusing "
			    "rather than running the model without it", len, n->ptr, m->hp.arch);
	}
	return 0;
}

int model_load(struct model **out, const char *path, char *err, size_t errlen)
{
	struct model *m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	int rc = gguf_open(&m->gguf, path, err, errlen);
	if (rc)
		goto err_free;
	m->used = calloc(m->gguf->n_tensors ? m->gguf->n_tensors : 1, 1);
	if (!m->used) {
		rc = -ENOMEM;
		goto err_close;
	}
	if ((rc = load_hparams(m, path, err, errlen)) || (rc = check_math_keys(m, err, errlen)) ||
	    (rc = load_weights(m, err, errlen)) || (rc = check_all_used(m, err, errlen)))
		goto err_close;
	free(m->used);
	m->used = NULL;
	*out = m;
	return 0;
err_close:
	free(m->used);
	free(m->layers);
	gguf_close(m->gguf);
err_free:
	free(m);
	return rc;
}

void model_free(struct model *m)
{
	if (!m)
		return;
	free(m->layers);
	gguf_close(m->gguf);
	free(m);
}

int model_set_ctx(struct model *m, uint32_t ctx, char *err, size_t errlen)
{
	if (ctx > m->hp.train_ctx)
		return log_errf(err, errlen, -ERANGE,
				"ctx %u is longer than the model's trained context of %u positions, and kvd "
				"does no RoPE scaling to stretch it: use ctx %u or less (0: the model's)",
				ctx, m->hp.train_ctx, m->hp.train_ctx);
	m->hp.ctx_len = ctx ? ctx : m->hp.train_ctx;
	return 0;
}

size_t model_kv_bytes_per_token(const struct model *m, size_t elem_bytes)
{
	return 2 * (size_t)m->hp.n_layers * m->hp.kv_dim * elem_bytes;
}
