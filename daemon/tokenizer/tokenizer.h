/* tokenizer.h — BPE tokenizers (GPT-2 byte-level, SentencePiece) read from GGUF metadata. */
#ifndef KVD_TOKENIZER_H
#define KVD_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

struct gguf_file;
struct tokenizer;

#define TOK_NONE UINT32_MAX

/*
 * Build a tokenizer from the tokenizer.ggml.* keys of f (which must outlive
 * it: token texts are read in place). Returns 0 or -errno with a message in
 * err: -ENOTSUP for a tokenizer model other than "gpt2"/"llama" or an
 * unknown tokenizer.ggml.pre (the message names it), -EINVAL for malformed
 * vocabulary or merges, -ENOMEM. A "gpt2" model without a pre key gets
 * llama.cpp's "default" pre-tokenizer. The tokenizer is immutable: any
 * number of threads may use it at once. Free with tokenizer_destroy().
 */
int tokenizer_create(struct tokenizer **out, const struct gguf_file *f,
		     char *err, size_t errlen);
void tokenizer_destroy(struct tokenizer *t);

struct model;
/*
 * The tokenizer of model m, refused (-EINVAL, err says which) when it can
 * produce an id the model's embedding has no row for: a vocabulary larger
 * than the embedding, or a special token outside it.
 */
int tokenizer_for_model(struct tokenizer **out, const struct model *m, char *err, size_t errlen);

uint32_t tokenizer_vocab_size(const struct tokenizer *t);
uint32_t tokenizer_bos(const struct tokenizer *t);	/* TOK_NONE if none */
uint32_t tokenizer_eos(const struct tokenizer *t);	/* TOK_NONE if none */
uint32_t tokenizer_eot(const struct tokenizer *t);	/* end of turn (<|im_end|>, <|eot_id|>), TOK_NONE if none */
int tokenizer_add_bos(const struct tokenizer *t);	/* the model wants BOS prepended */
/* True for every token that ends generation (EOS, EOT and the like). */
int tokenizer_is_eog(const struct tokenizer *t, uint32_t id);

/*
 * Encode len bytes of text, ids identical to llama.cpp's llama_tokenize().
 * add_bos: prepend the BOS token if the vocabulary has one (pass
 * tokenizer_add_bos(t) for the model's own choice). parse_special: text
 * spelling a control token (e.g. <|im_start|>) becomes that token;
 * otherwise it is encoded as plain text. User-defined tokens are matched
 * either way. Ill-formed UTF-8 is read as U+FFFD per bad byte by the BPE
 * pre-tokenizer (llama.cpp aborts on it); SentencePiece keeps the bytes.
 * Writes at most cap ids to out (NULL with cap 0 to count); returns the
 * number of ids the text needs (which may be more than cap: nothing past
 * cap is written), or -errno (-ENOMEM, -E2BIG past 4 GiB).
 */
int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len,
		     int add_bos, int parse_special, uint32_t *out, size_t cap);

/*
 * The bytes one token stands for (byte-level/SentencePiece markers undone;
 * control tokens give their text only if render_special). Returns the byte
 * count (may exceed cap; nothing past cap is written) or -ERANGE for an id
 * outside the vocabulary.
 */
int tokenizer_token_bytes(const struct tokenizer *t, uint32_t id, int render_special,
			  char *buf, size_t cap);

/*
 * Streaming detokenizer: holds back an incomplete UTF-8 sequence. Start it
 * zeroed, one per stream; control tokens render nothing.
 */
struct tok_decoder {
	uint8_t pending[8];	/* at most 3 used: an unfinished well-formed prefix */
	uint32_t n_pending;
	uint32_t n_emitted;	/* tokens that gave bytes; SentencePiece drops the first one's leading space */
};

/*
 * Feed one token; writes only complete UTF-8 characters to out and returns
 * their byte count, or -errno (-ERANGE bad id, -ENOSPC when cap cannot hold
 * what this call would write: the decoder is then unchanged, -ENOMEM). A
 * byte sequence that can never become valid UTF-8 (maximal ill-formed
 * subpart) is emitted as one U+FFFD, so cap >= 3 * (token bytes + 3) always
 * suffices.
 */
int tok_decoder_feed(const struct tokenizer *t, struct tok_decoder *d, uint32_t id,
		     char *out, size_t cap);
/* Flush what is pending at end of stream (as U+FFFD if incomplete); bytes written or -ENOSPC. */
int tok_decoder_flush(struct tok_decoder *d, char *out, size_t cap);

/*
 * Whole-sequence decode: the tokens' exact bytes (no U+FFFD substitution),
 * control tokens omitted, SentencePiece's leading space dropped. Returns
 * bytes needed (may exceed cap; nothing past cap is written, no NUL) or
 * -errno (-ERANGE for an id outside the vocabulary).
 */
int tokenizer_decode(const struct tokenizer *t, const uint32_t *ids, size_t n,
		     char *out, size_t cap);

struct chat_msg {
	const char *role;	/* "system", "user", "assistant" */
	const char *content;
};

/*
 * Render messages with the chat template: the model's
 * (tokenizer.chat_template) run by kvd's Jinja interpreter as Hugging
 * Face's apply_chat_template runs it (messages, add_generation_prompt =
 * add_assistant, bos_token, eos_token, tools = none), or the built-in one
 * tokenizer_chat_select() chose. A BOS the tokenizer adds (add_bos) is not
 * repeated at the start of the text: encode with add_bos. Returns bytes
 * needed (excluding NUL; may exceed cap, output always NUL-terminated when
 * cap > 0), -EINVAL for a NULL role or content or messages the template
 * refuses (its raise_exception(), e.g. roles that do not alternate), or
 * -ENOTSUP if the model has no template kvd can run.
 */
int tokenizer_chat_format(const struct tokenizer *t, const struct chat_msg *msgs,
			  size_t n, int add_assistant, char *out, size_t cap);

/*
 * The text of the next user turn of a conversation whose last assistant
 * turn ended with its end-of-turn token (already in the context): the
 * turn itself and the opening of the assistant's answer, no system prompt
 * (what the template renders after that token). -ENOTSUP also for a
 * template whose earlier turns depend on later ones (no such text).
 * Same return convention as tokenizer_chat_format().
 */
int tokenizer_chat_next_turn(const struct tokenizer *t, const char *content, char *out,
			     size_t cap);

/*
 * Which chat template to use: NULL or "" the model's, refused here
 * (-ENOTSUP, err gives the reason and the built-in names) when the model
 * has one kvd cannot run; otherwise a built-in one by name (chatml,
 * llama3, llama2, phi3, gemma, mistral, zephyr: -EINVAL for another name).
 * Call it before the tokenizer is shared between threads.
 */
int tokenizer_chat_select(struct tokenizer *t, const char *name, char *err, size_t errlen);

/* How tokenizer_chat_encode() renders and reads its messages. */
#define TOK_CHAT_NEXT_TURN	(1U << 0) /* the next turns of a conversation, as in
					   * tokenizer_chat_next_turn(): no default system
					   * prompt, no BOS */
#define TOK_CHAT_SPECIAL	(1U << 1) /* special-token spellings in the messages' text are
					   * control tokens too (trusted text only) */
#define TOK_CHAT_NO_GEN_PROMPT	(1U << 2) /* no assistant opening after the last message
					   * (add_generation_prompt false); not with NEXT_TURN
					   * (-EINVAL) */

/*
 * A prompt to generate from: msgs (a whole conversation: system, user and
 * assistant messages in order) rendered with the model's template (and the
 * assistant turn's opening unless TOK_CHAT_NO_GEN_PROMPT) and encoded, BOS first where the model
 * wants one and this is not a next turn. The template's own markers are
 * control tokens; the messages' text is plain text unless
 * TOK_CHAT_SPECIAL, so a user who writes "<|im_end|><|im_start|>system"
 * only writes those characters. Messages without such spellings encode
 * exactly as tokenizer_encode() with parse_special encodes the text
 * tokenizer_chat_format() (or the next-turn text) renders. With
 * TOK_CHAT_NEXT_TURN the messages may include a system one: a system turn
 * in the middle of the conversation. Same return convention as
 * tokenizer_encode(), or -EINVAL / -ENOTSUP as tokenizer_chat_format().
 */
int tokenizer_chat_encode(const struct tokenizer *t, const struct chat_msg *msgs, size_t n,
			  unsigned flags, uint32_t *out, size_t cap);

#endif
