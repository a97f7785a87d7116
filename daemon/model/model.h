/* model.h — a Llama-family model: hyperparameters from GGUF metadata, weights viewed in the mapping. */
#ifndef KVD_MODEL_H
#define KVD_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include "kernels/backend.h"

struct gguf_file;

struct model_hparams {
	char arch[32];		/* general.architecture */
	char name[64];		/* general.name, or the file's basename */
	uint32_t n_layers;
	uint32_t dim;		/* embedding width */
	uint32_t n_heads;	/* query heads */
	uint32_t n_kv_heads;	/* key/value heads (GQA when < n_heads) */
	uint32_t head_dim;	/* dim / n_heads */
	uint32_t kv_dim;	/* n_kv_heads * head_dim */
	uint32_t ffn_dim;
	uint32_t vocab;
	uint32_t ctx_len;	/* positions a sequence may use: train_ctx, or less (model_set_ctx) */
	uint32_t train_ctx;	/* the trained context length, from the file */
	uint32_t rot_dim;	/* dimensions RoPE rotates per head */
	float rope_theta;
	int rope_neox;		/* 0: adjacent pairs (Llama GGUF layout) */
	float norm_eps;
	int tied_output;	/* LM head shares token_embd */
};

struct model_layer {
	const float *attn_norm;		/* (dim,) */
	struct kb_weight wq;		/* (n_heads * head_dim, dim) */
	struct kb_weight wk;		/* (kv_dim, dim) */
	struct kb_weight wv;		/* (kv_dim, dim) */
	struct kb_weight wo;		/* (dim, n_heads * head_dim) */
	const float *ffn_norm;		/* (dim,) */
	struct kb_weight w_gate;	/* (ffn_dim, dim) */
	struct kb_weight w_up;		/* (ffn_dim, dim) */
	struct kb_weight w_down;	/* (dim, ffn_dim) */
};

struct model {
	struct gguf_file *gguf;		/* owns the mapping every weight points into */
	struct model_hparams hp;
	struct kb_weight tok_embd;	/* (vocab, dim) */
	const float *output_norm;	/* (dim,) */
	struct kb_weight output;	/* (vocab, dim); token_embd when tied */
	struct model_layer *layers;	/* (n_layers,) */
	uint8_t *used;			/* while loading: (n_tensors,) 1 where bound */
};

/*
 * Load the GGUF at path: validate the architecture (llama family), every
 * hyperparameter and every tensor's type and shape. Returns 0 or -errno
 * with a message naming the key or tensor in err.
 */
int model_load(struct model **out, const char *path, char *err, size_t errlen);
void model_free(struct model *m);

/*
 * Let sequences use ctx positions (0: the trained context) instead of the
 * trained context: everything that bounds a sequence reads hp.ctx_len.
 * -ERANGE with both numbers in err when ctx is above the trained context:
 * there is no RoPE scaling, so positions past it would give garbage.
 */
int model_set_ctx(struct model *m, uint32_t ctx, char *err, size_t errlen);

/* KV-cache bytes one token needs at elem_bytes per element: 2 · layers · kv_dim · bytes. */
size_t model_kv_bytes_per_token(const struct model *m, size_t elem_bytes);

#endif
