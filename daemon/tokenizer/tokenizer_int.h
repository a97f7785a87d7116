/* tokenizer_int.h — state shared by tokenizer.c, bpe.c, spm.c and chat.c; not an API. */
#ifndef KVD_TOKENIZER_INT_H
#define KVD_TOKENIZER_INT_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/tokenizer/tokenizer.h"

struct gguf_file;

enum tok_model { TOK_MODEL_BPE, TOK_MODEL_SPM };

/* tokenizer.ggml.token_type values (numbering fixed by GGUF). */
enum tok_type {
	TOKT_NORMAL = 1, TOKT_UNKNOWN = 2, TOKT_CONTROL = 3,
	TOKT_USER = 4, TOKT_UNUSED = 5, TOKT_BYTE = 6, TOKT_LAST
};

/*
 * Pre-tokenizer stages, each one a regex of llama.cpp's pre-tokenizer lists
 * done by hand. A stage splits each range the previous stage produced.
 */
enum tok_pre_stage {
	PRE_GPT2,		/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
	PRE_LLAMA3,		/* llama 3's pattern (case-insensitive contractions, \p{N}{1,3}, newlines) */
	PRE_QWEN2,		/* llama 3's with \p{N} (each number code point alone) */
	PRE_QWEN35,		/* qwen2's with [\p{L}\p{M}] for letters (combining marks join words) */
	PRE_EACH_NUMBER,	/* \p{N}: every number code point alone */
	PRE_RUN_NUMBER,		/* \p{N}+ */
	PRE_RUN_PUNCT,		/* [\p{P}\$\+<=>\^~\|]+ */
	PRE_RUN_PUNCT_BT,	/* [\p{P}\$\+<=>\^~\|`]+ (falcon) */
	PRE_DIGITS3,		/* [0-9][0-9][0-9] */
	PRE_LAST
};
#define TOK_PRE_MAX 4

struct tok_entry {
	const char *text;	/* in the GGUF mapping, not NUL-terminated */
	uint32_t len;
	uint8_t type;		/* enum tok_type */
	uint8_t rstrip;		/* a match as a special token eats the ASCII spaces after it */
	float score;		/* SentencePiece merge priority, 0 for BPE */
};

/* One merge rule of byte-level BPE: (left id, right id) -> merged id. */
struct tok_merge {
	uint64_t key;		/* left << 32 | right; UINT64_MAX = empty slot */
	uint32_t rank;		/* position in tokenizer.ggml.merges: lower merges first */
	uint32_t id;
};

struct jinja_tmpl;

struct tokenizer {
	enum tok_model model;
	uint32_t n_vocab;
	struct tok_entry *vocab;	/* (n_vocab,) */
	uint32_t *vmap;			/* (vmap_mask + 1,) open-addressed text -> id, TOK_NONE empty */
	uint32_t vmap_mask;
	struct tok_merge *merges;	/* (merge_mask + 1,) open-addressed, BPE only */
	uint32_t merge_mask;
	uint32_t byte_tok[256];		/* BPE: token of each byte's mapped char; SPM: <0xXX> */
	uint32_t *special;		/* (n_special,) control/user/unknown ids, longest text first */
	uint32_t n_special;
	uint8_t pre[TOK_PRE_MAX];	/* enum tok_pre_stage, applied in order */
	uint32_t n_pre;
	int ignore_merges;		/* llama 3: a piece that is a whole token skips BPE */
	int add_bos;
	int add_space_prefix;		/* SPM: a space before text that starts or follows a special token */
	uint32_t bos, eos, eot, unk;
	uint32_t eog[8];		/* (n_eog,) */
	uint32_t n_eog;
	struct jinja_tmpl *chat;	/* the chat template in use, NULL if none */
	char *chat_refused;		/* why the GGUF's template cannot run, NULL if it can */
};

/* Ids written so far; nothing is stored past cap but n keeps counting. */
struct tok_out {
	uint32_t *ids;
	size_t cap;
	size_t n;
};

static inline void tok_out_push(struct tok_out *o, uint32_t id)
{
	if (o->n < o->cap)
		o->ids[o->n] = id;
	o->n++;
}

/* A byte range of a text to encode. */
struct tok_span {
	size_t off, len;
};

/*
 * tokenizer_encode() with the plain spans of text (n_plain of them) read as
 * plain text whatever parse_special says: a control token's spelling that
 * overlaps one stays text. The rest of the text splits at special tokens as
 * it would alone, so text without such spellings encodes exactly as
 * tokenizer_encode() encodes it.
 */
int tok_encode_masked(const struct tokenizer *t, const char *text, size_t len, int add_bos,
		      int parse_special, const struct tok_span *plain, size_t n_plain,
		      uint32_t *out, size_t cap);

/* Exact text -> id, or TOK_NONE. With duplicate texts the highest id wins (as llama.cpp). */
uint32_t tok_lookup(const struct tokenizer *t, const char *s, size_t len);

/* bpe.c: merges, pre-tokenizer and byte table from f; 0 or -errno with err set. */
int tok_bpe_init(struct tokenizer *t, const struct gguf_file *f, char *err, size_t errlen);
/* Encode raw text (no special tokens in it); 0 or -ENOMEM. */
int tok_bpe_encode(const struct tokenizer *t, const char *text, size_t len, struct tok_out *o);
/* Byte-level token text back to bytes; returns the count (may exceed cap). */
size_t tok_bpe_unmap(const char *text, size_t len, char *buf, size_t cap);

/* spm.c */
int tok_spm_init(struct tokenizer *t, char *err, size_t errlen);
/* space_prefix: prepend the U+2581 marker (text starts or follows a special token). */
int tok_spm_encode(const struct tokenizer *t, const char *text, size_t len, int space_prefix,
		   struct tok_out *o);
/* Normal SPM token text with U+2581 turned back into spaces; count (may exceed cap). */
size_t tok_spm_unmap(const char *text, size_t len, char *buf, size_t cap);

/*
 * chat.c: parse tokenizer.chat_template and try it on a conversation; one
 * it cannot run is kept out (chat_refused says why, for
 * tokenizer_chat_select()). 0 or -ENOMEM.
 */
int tok_chat_init(struct tokenizer *t, const struct gguf_file *f);
void tok_chat_free(struct tokenizer *t);

/* chat_builtin.c: the templates --chat-template names, ending with a NULL name. */
struct tok_chat_builtin {
	const char *name;
	const char *origin;	/* the model it comes from, tests/golden/chat/<origin>.jinja */
	const char *text;
};
extern const struct tok_chat_builtin tok_chat_builtins[];

/*
 * A candidate merge of two adjacent symbols. Both BPE kinds keep them in a
 * min-heap: lower key first, the leftmost on ties.
 */
struct tok_pair {
	double key;		/* a BPE merge rank, or minus a SentencePiece score */
	uint32_t left, right;	/* symbol indices */
	uint32_t a, b, c;	/* the caller's: what the pair was when queued, what it makes */
};

/* heap (cap,) holds *n pairs; the caller sizes it. */
void tok_pair_push(struct tok_pair *heap, uint32_t *n, struct tok_pair p);
struct tok_pair tok_pair_pop(struct tok_pair *heap, uint32_t *n);

#endif
