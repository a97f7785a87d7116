/*
 * fuzz_tokenizer.c — the model's tokenizer on arbitrary bytes: encode (with
 * and without special-token parsing), whole and streaming decode of what
 * came out, and both chat-template renderings. The first byte picks the
 * options; the rest is the text.
 */
#include "tests/fuzz/harness.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const struct tokenizer *t = fz_tokenizer();
	if (!size)
		return 0;
	const uint8_t opt = data[0];
	const char *text = (const char *)data + 1;
	size_t len = size - 1;
	int need = tokenizer_encode(t, text, len, opt & 1, (opt >> 1) & 1, NULL, 0);
	if (need < 0)
		fz_die("tokenizer_encode", strerror(-need));
	uint32_t *ids = malloc(((size_t)need + 1) * sizeof(uint32_t));
	if (!ids)
		return 0;
	/* A short buffer must get a prefix of the same ids and the same count. */
	size_t cap = (opt >> 2) & 1 ? (size_t)need / 2 : (size_t)need;
	int got = tokenizer_encode(t, text, len, opt & 1, (opt >> 1) & 1, ids, cap);
	if (got != need)
		fz_die("tokenizer_encode", "count differs between counting and encoding");
	if (cap < (size_t)need)
		got = tokenizer_encode(t, text, len, opt & 1, (opt >> 1) & 1, ids, (size_t)need);
	uint32_t vocab = tokenizer_vocab_size(t);
	for (int i = 0; i < need; i++)
		if (ids[i] >= vocab)
			fz_die("tokenizer_encode", "id outside the vocabulary");

	int bytes = tokenizer_decode(t, ids, (size_t)need, NULL, 0);
	if (bytes < 0)
		fz_die("tokenizer_decode", strerror(-bytes));
	char *out = malloc((size_t)bytes + 1);
	if (out && tokenizer_decode(t, ids, (size_t)need, out, (size_t)bytes) != bytes)
		fz_die("tokenizer_decode", "count differs between counting and decoding");
	free(out);

	struct tok_decoder d = { 0 };
	char buf[4096];
	for (int i = 0; i < need; i++)
		if (tok_decoder_feed(t, &d, ids[i], buf, sizeof(buf)) < 0)
			fz_die("tok_decoder_feed", "failed on an id the encoder produced");
	if (tok_decoder_flush(&d, buf, sizeof(buf)) < 0)
		fz_die("tok_decoder_flush", "failed");
	free(ids);

	/* The chat templates take NUL-terminated content. */
	char *z = malloc(len + 1);
	if (!z)
		return 0;
	memcpy(z, text, len);
	z[len] = 0;
	struct chat_msg msgs[2] = { { (opt >> 3) & 1 ? "system" : "user", z }, { "user", z } };
	size_t n_msgs = 1 + ((opt >> 4) & 1);
	int cn = tokenizer_chat_format(t, msgs, n_msgs, (opt >> 5) & 1, NULL, 0);
	if (cn >= 0) {
		char *chat = malloc((size_t)cn + 1);
		if (chat && tokenizer_chat_format(t, msgs, n_msgs, (opt >> 5) & 1, chat,
						  (size_t)cn + 1) != cn)
			fz_die("tokenizer_chat_format", "count differs between passes");
		free(chat);
	}
	char small[16];
	cn = tokenizer_chat_next_turn(t, z, small, sizeof(small));
	if (cn >= 0 && strlen(small) != ((size_t)cn < sizeof(small) ? (size_t)cn : sizeof(small) - 1))
		fz_die("tokenizer_chat_next_turn", "truncated output not NUL-terminated in place");
	free(z);
	return 0;
}
