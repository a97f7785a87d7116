/* model.h — a decoder-only transformer (llama, qwen2, phi3, gemma, gemma2): hyperparameters from GGUF metadata, weights viewed in the mapping. */
#ifndef KVD_MODEL_H
#define KVD_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include "kernels/backend.h"

struct gguf_file;

/* The architectures kvd runs: one forward pass, these are its differences (model.c's table). */
enum model_arch {
	MODEL_ARCH_LLAMA,	/* llama, mistral */
	MODEL_ARCH_QWEN2,	/* + Q/K/V biases, NeoX RoPE */
	MODEL_ARCH_PHI3,	/* + fused attn_qkv and ffn_up (gate | up), NeoX RoPE */
	MODEL_ARCH_GEMMA,	/* + embedding x sqrt(dim), GeGLU, tied output, NeoX RoPE */
	MODEL_ARCH_GEMMA2,	/* + post-norms, soft-capping, alternating sliding window */
};

enum model_act { MODEL_ACT_SILU, MODEL_ACT_GELU };

struct model_hparams {
	char arch[32];		/* general.architecture */
	enum model_arch arch_id;
	char name[64];		/* general.name, or the file's basename */
	uint32_t n_layers;
	uint32_t dim;		/* embedding width */
	uint32_t n_heads;	/* query heads */
	uint32_t n_kv_heads;	/* key/value heads (GQA when < n_heads) */
	uint32_t head_dim;	/* attention.key_length, or dim / n_heads */
	uint32_t q_dim;		/* n_heads * head_dim (may differ from dim: Mistral Nemo, Gemma 7B) */
	uint32_t kv_dim;	/* n_kv_heads * head_dim */
	uint32_t ffn_dim;
	uint32_t vocab;
	uint32_t ctx_len;	/* positions a sequence may use: train_ctx, or less (model_set_ctx) */
	uint32_t train_ctx;	/* the trained context length, from the file */
	uint32_t max_ctx;	/* the most model_set_ctx allows: train_ctx, more with RoPE scaling */
	uint32_t rot_dim;	/* dimensions RoPE rotates per head */
	float rope_theta;
	int rope_neox;		/* 0: adjacent pairs (Llama GGUF layout) */
	char rope_scaling[12];	/* "none", "linear", "yarn" or "llama3" */
	float rope_factor;	/* the scaling factor (1: none) */
	uint32_t rope_orig_ctx;	/* the context the scaling stretches (YaRN's n_ctx_orig) */
	float norm_eps;
	int tied_output;	/* LM head shares token_embd */
	enum model_act act;	/* of the gate: silu(gate) * up or gelu(gate) * up */
	float embd_scale;	/* token embeddings times this (Gemma: sqrt(dim)); 0: not scaled */
	float attn_scale;	/* attention scores times this, usually 1 / sqrt(head_dim) */
	int q_prescale;		/* llama.cpp scales Q by attn_scale before attention (Phi-3, Gemma) */
	float attn_softcap;	/* scores become cap * tanh(s / cap); 0: off */
	float final_softcap;	/* logits likewise; 0: off */
	uint32_t swa_window;	/* window of the sliding-window layers (model_layer.window) */
	int qkv_bias;		/* Q/K/V have biases */
	int post_norms;		/* norms on the attention and FFN outputs before the residual add */
};

/*
 * A fused attn_qkv (Phi-3) gives wq, wk, wv as views of its rows 0.., q_dim..
 * and q_dim + kv_dim..; a fused ffn_up (gate then up) gives w_gate and w_up
 * as views of its two halves: no copy, the mapping is read in place.
 */
struct model_layer {
	const float *attn_norm;		/* (dim,) */
	struct kb_weight wq;		/* (q_dim, dim) */
	struct kb_weight wk;		/* (kv_dim, dim) */
	struct kb_weight wv;		/* (kv_dim, dim) */
	const float *bq, *bk, *bv;	/* (q_dim,) (kv_dim,) (kv_dim,), or NULL */
	struct kb_weight wo;		/* (dim, q_dim) */
	const float *post_attn_norm;	/* (dim,), or NULL */
	const float *ffn_norm;		/* (dim,) */
	struct kb_weight w_gate;	/* (ffn_dim, dim) */
	struct kb_weight w_up;		/* (ffn_dim, dim) */
	struct kb_weight w_down;	/* (dim, ffn_dim) */
	const float *post_ffn_norm;	/* (dim,), or NULL */
	uint32_t window;		/* sliding window of this layer's attention; 0: all positions */
};

struct model {
	struct gguf_file *gguf;		/* owns the mapping every weight points into */
	struct model_hparams hp;
	struct kb_weight tok_embd;	/* (vocab, dim) */
	const float *output_norm;	/* (dim,) */
	struct kb_weight output;	/* (vocab, dim); token_embd when tied */
	struct model_layer *layers;	/* (n_layers,) */
	/*
	 * RoPE of every layer: theta, NeoX or not, linear/YaRN scaling, and
	 * h_freq_factors (rot_dim / 2,) from rope_freqs.weight or computed from
	 * llama3 metadata (NULL: none). freq_factors is left NULL: the engine
	 * sets its backend copy.
	 */
	struct kb_rope rope;
	float *rope_factors_own;	/* h_freq_factors when computed here */
	const float *rope_long;		/* LongRoPE's factors (rot_dim / 2,), or NULL */
	const float *rope_short;
	uint64_t weight_bytes;		/* of all tensors, in the mapping */
	uint8_t *used;			/* while loading: (n_tensors,) 1 where bound */
};

/*
 * Load the GGUF at path: validate the architecture (enum model_arch), every
 * hyperparameter and every tensor's type and shape. Returns 0 or -errno
 * with a message naming the key or tensor in err.
 */
int model_load(struct model **out, const char *path, char *err, size_t errlen);
void model_free(struct model *m);
/*
 * What the model is, as one 64-bit hash: the GGUF's header, metadata and
 * tensor table (names, shapes, types, data offsets) and the first 4 KiB of
 * every tensor's data, so the same file gives the same value and a
 * re-quantized or fine-tuned file with the same layout does not. Saved KV
 * is trusted only under the identity it was computed with.
 */
uint64_t model_identity(const struct model *m);

/*
 * Let sequences use ctx positions (0: the trained context) instead of the
 * trained context: everything that bounds a sequence reads hp.ctx_len.
 * Up to hp.max_ctx: the trained context, or with linear or YaRN scaling
 * by factor f the original context times f (what vLLM allows; llama.cpp
 * only warns past the trained one). -ERANGE with the numbers in err above
 * it: positions past it would give garbage.
 */
int model_set_ctx(struct model *m, uint32_t ctx, char *err, size_t errlen);

/* KV-cache bytes one token needs at elem_bytes per element: 2 · layers · kv_dim · bytes. */
/*
 * LongRoPE (Phi-3 128k, Phi-3.5): the long factors when hp.ctx_len is above
 * the original context, else the short ones, as llama.cpp chooses by its
 * context size. model_load and model_set_ctx call it; an engine takes the
 * factors it finds at its creation.
 */
void model_pick_longrope(struct model *m);

size_t model_kv_bytes_per_token(const struct model *m, size_t elem_bytes);

/* "llama", "qwen2", ...: the canonical name of the architecture's row in model.c's table. */
const char *model_arch_name(enum model_arch a);

/*
 * Llama 3's frequency factors (rot_dim / 2,) into out from its rope_scaling
 * (factor, low/high_freq_factor, original context), as the HF converter
 * computes rope_freqs.weight (model_rope.c).
 */
void model_llama3_factors(float *out, uint32_t rot_dim, float theta, float factor, float low,
			  float high, float orig_ctx);

#endif
