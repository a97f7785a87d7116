/*
 * fuzz_jinja.c — chat template text (a GGUF's tokenizer.chat_template is
 * untrusted) through the Jinja parser and, when it parses, two renderings.
 * The first byte picks the options; the text up to the first NUL is the
 * template, what follows is the user message's content.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/tokenizer/jinja.h"

static void die(const char *why)
{
	fprintf(stderr, "fuzz_jinja: %s\n", why);
	abort();
}

/* What every render must give: text of len bytes, spans inside it, in order. */
static void check(int rc, const struct jinja_out *o, const char *err, size_t max_out)
{
	if (rc) {
		if (o->text || o->spans || o->len)
			die("output left after an error");
		if (!err[0])
			die("an error without a message");
		if (rc != JINJA_RAISED && rc != -EINVAL && rc != -ENOTSUP && rc != -E2BIG && rc != -ENOMEM)
			die("an unexpected error code");
		return;
	}
	if (!o->text || strlen(o->text) > o->len || o->text[o->len] || o->len > max_out)
		die("output not its length, or past max_out");
	size_t end = 0;
	for (size_t i = 0; i < o->n_spans; i++) {
		if (o->spans[i].off < end || o->spans[i].off + o->spans[i].len > o->len || !o->spans[i].len)
			die("a span out of order or outside the text");
		end = o->spans[i].off + o->spans[i].len;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct jinja_tmpl *t;
	char err[256];

	if (!size)
		return 0;
	const uint8_t opt = data[0];
	const char *src = (const char *)data + 1;
	size_t n = size - 1;
	const char *nul = memchr(src, 0, n);
	size_t tlen = nul ? (size_t)(nul - src) : n;
	char *content = strndup(nul ? nul + 1 : "hello", nul ? n - tlen - 1 : 5);
	if (!content)
		return 0;
	int rc = jinja_parse(&t, src, tlen, err, sizeof(err));
	if (rc) {
		if (!err[0] || (rc != -EINVAL && rc != -ENOTSUP && rc != -E2BIG && rc != -ENOMEM))
			die("a refused template without a message or with an odd code");
		free(content);
		return 0;
	}
	const struct jinja_msg msgs[] = { { "system", " Be brief. " }, { "user", content },
					  { "assistant", "Hi\n" }, { "user", content } };
	for (int k = 0; k < 2; k++) {
		struct jinja_ctx c = { (opt & 1) ? msgs : msgs + 1, (opt & 1) ? 4 : 3 - (size_t)k,
				       "<s>", "</s>", (opt >> 1) & 1, (opt & 4) ? -1 : 1768478400,
				       (opt & 8) ? 64 : 1u << 20 };
		struct jinja_out o;

		rc = jinja_render(t, &c, &o, err, sizeof(err));
		check(rc, &o, err, c.max_out);
		free(o.text);
		free(o.spans);
	}
	jinja_free(t);
	free(content);
	return 0;
}
