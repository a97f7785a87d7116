/* test_chat.c — the Jinja interpreter against jinja2's renderings (tests/golden/chat/), its limits and refusals, and chat templates in the tokenizer. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/model/gguf.h"
#include "daemon/tokenizer/jinja.h"
#include "daemon/tokenizer/tokenizer.h"
#include "daemon/tokenizer/tokenizer_int.h"
#include "tests/lib/fixture.h"
#include "tests/lib/gguf_patch.h"
#include "tests/lib/proc.h"

#define GOLDEN "tests/golden/chat/"
#define NOW 1768478400	/* gen_chat.py's NOW: 2026-01-15 12:00:00 UTC */

/* Every template gen_chat.py renders (its TOKENS). */
static const char *const templates[] = {
	"SmolLM2-135M-Instruct", "Qwen-Qwen2.5-7B-Instruct", "meta-llama-Llama-3.1-8B-Instruct",
	"meta-llama-Llama-3.2-3B-Instruct", "meta-llama-Llama-3.3-70B-Instruct",
	"microsoft-Phi-3.5-mini-instruct", "google-gemma-2-2b-it",
	"mistralai-Mistral-Nemo-Instruct-2407", "HuggingFaceH4-zephyr-7b-beta",
	"teknium-OpenHermes-2.5-Mistral-7B", "meta-llama-Meta-Llama-3-8B-Instruct",
	"meta-llama-Llama-2-7b-chat-hf",
};

static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *p = NULL;
	long n;

	if (!f)
		fail_msg("cannot open %s", path);
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
	    (p = malloc((size_t)n + 1)) && fread(p, 1, (size_t)n, f) == (size_t)n) {
		p[n] = 0;
		*len = (size_t)n;
	} else {
		free(p);
		p = NULL;
	}
	fclose(f);
	if (!p)
		fail_msg("cannot read %s", path);
	return p;
}

/* A reader of gen_chat.py's records: "<word> <bytes>\n<bytes>\n" or a plain line. */
struct rd {
	const char *p, *end;
};

static int rd_line(struct rd *r, char *word, size_t cap, long *n)
{
	const char *nl = memchr(r->p, '\n', (size_t)(r->end - r->p));

	if (!nl || (size_t)(nl - r->p) >= cap)
		return 0;
	memcpy(word, r->p, (size_t)(nl - r->p));
	word[nl - r->p] = 0;
	r->p = nl + 1;
	*n = -1;
	char *sp = strrchr(word, ' ');
	if (sp && n) {
		*n = strtol(sp + 1, NULL, 10);
		*sp = 0;
	}
	return 1;
}

static char *rd_bytes(struct rd *r, long n)
{
	char *s;

	assert_true(n >= 0 && r->end - r->p >= n + 1);
	s = malloc((size_t)n + 1);
	assert_non_null(s);
	memcpy(s, r->p, (size_t)n);
	s[n] = 0;
	r->p += n + 1;
	return s;
}

struct conv {
	char name[64];
	int gen;
	size_t n;
	struct jinja_msg m[8];
	char *text[8];
	char *role[8];
};

static size_t load_cases(struct conv *c, size_t cap, char **buf)
{
	size_t len, k = 0;
	struct rd r;
	char line[256];
	long n;

	*buf = slurp(GOLDEN "cases.txt", &len);
	r = (struct rd){ *buf, *buf + len };
	while (k < cap && rd_line(&r, line, sizeof(line), &n)) {
		int gen;

		assert_int_equal(sscanf(line, "case %63s %d", c[k].name, &gen), 2);
		c[k].gen = gen;
		c[k].n = (size_t)n;
		assert_true(c[k].n <= 8);
		for (size_t i = 0; i < c[k].n; i++) {
			assert_true(rd_line(&r, line, sizeof(line), &n));
			c[k].role[i] = strdup(line);
			c[k].text[i] = rd_bytes(&r, n);
			c[k].m[i] = (struct jinja_msg){ c[k].role[i], c[k].text[i] };
		}
		k++;
	}
	return k;
}

static void free_cases(struct conv *c, size_t n, char *buf)
{
	for (size_t k = 0; k < n; k++)
		for (size_t i = 0; i < c[k].n; i++) {
			free(c[k].role[i]);
			free(c[k].text[i]);
		}
	free(buf);
}

static struct jinja_tmpl *parse_file(const char *name)
{
	char path[256], err[256];
	size_t len;
	struct jinja_tmpl *t;

	snprintf(path, sizeof(path), GOLDEN "%s.jinja", name);
	char *src = slurp(path, &len);
	int rc = jinja_parse(&t, src, len, err, sizeof(err));

	free(src);
	if (rc)
		fail_msg("%s: %s (%d)", name, err, rc);
	return t;
}

/* Want: "ok" and text, or "raise" and the template's message. */
static void check_render(const char *what, const struct jinja_tmpl *t, const struct jinja_ctx *c,
			 const char *kind, const char *want)
{
	struct jinja_out o;
	char err[256];
	int rc = jinja_render(t, c, &o, err, sizeof(err));

	if (!strcmp(kind, "ok")) {
		if (rc)
			fail_msg("%s: %s (%d)", what, err, rc);
		if (o.len != strlen(want) || memcmp(o.text, want, o.len))
			fail_msg("%s:\n--- jinja2\n%s\n--- kvd\n%s\n---", what, want, o.text);
	} else {
		char full[300];

		snprintf(full, sizeof(full), "template error: %s", want);
		if (rc != JINJA_RAISED || strcmp(err, full))
			fail_msg("%s: wanted the exception '%s', got %d '%s'", what, want, rc, err);
	}
	free(o.text);
	free(o.spans);
}

/* Each template, each conversation: kvd's rendering is jinja2's, byte for byte. */
static void test_golden_templates(void **state)
{
	struct conv cases[32];
	char *cbuf;
	size_t nc = load_cases(cases, 32, &cbuf);

	(void)state;
	assert_true(nc >= 8);
	for (size_t i = 0; i < sizeof(templates) / sizeof(templates[0]); i++) {
		char path[256], line[256], what[256];
		struct jinja_tmpl *t = parse_file(templates[i]);
		size_t len;
		long n;

		snprintf(path, sizeof(path), GOLDEN "%s.expected", templates[i]);
		char *exp = slurp(path, &len);
		struct rd r = { exp, exp + len };

		assert_true(rd_line(&r, line, sizeof(line), &n) && !strcmp(line, "bos"));
		char *bos = rd_bytes(&r, n);
		assert_true(rd_line(&r, line, sizeof(line), &n) && !strcmp(line, "eos"));
		char *eos = rd_bytes(&r, n);

		for (size_t k = 0; k < nc; k++) {
			assert_true(rd_line(&r, line, sizeof(line), &n));
			assert_true(rd_line(&r, line, sizeof(line), &n));
			char *want = rd_bytes(&r, n);
			struct jinja_ctx c = { cases[k].m, cases[k].n, bos, eos, cases[k].gen, NOW, 0 };

			snprintf(what, sizeof(what), "%s, %s", templates[i], cases[k].name);
			check_render(what, t, &c, line, want);
			free(want);
		}
		free(bos);
		free(eos);
		free(exp);
		jinja_free(t);
	}
	free_cases(cases, nc, cbuf);
}

/* The constructs one at a time (snippets.txt): rendering, exceptions, syntax errors. */
static void test_golden_snippets(void **state)
{
	static const struct jinja_msg m[] = { { "system", " Sys " }, { "user", "Hi there" },
					      { "assistant", "Ok." } };
	struct jinja_ctx c = { m, 3, "<s>", "</s>", 1, NOW, 0 };
	size_t len;
	char *buf = slurp(GOLDEN "snippets.txt", &len), line[64], err[256];
	struct rd r = { buf, buf + len };
	long n;
	int count = 0;

	(void)state;
	while (rd_line(&r, line, sizeof(line), &n)) {
		char *src = rd_bytes(&r, n), *want;
		struct jinja_tmpl *t;

		assert_true(rd_line(&r, line, sizeof(line), &n));
		want = rd_bytes(&r, n);
		int rc = jinja_parse(&t, src, strlen(src), err, sizeof(err));

		if (!strcmp(line, "error")) {
			if (rc != -EINVAL)
				fail_msg("%s: wanted a syntax error (%s), got %d", src, want, rc);
		} else {
			if (rc)
				fail_msg("%s: %s (%d)", src, err, rc);
			check_render(src, t, &c, line, want);
			jinja_free(t);
		}
		free(src);
		free(want);
		count++;
	}
	assert_true(count >= 30);
	free(buf);
}

/* --chat-template NAME is the real text of the model it names. */
static void test_builtin_texts(void **state)
{
	int n = 0;

	(void)state;
	for (const struct tok_chat_builtin *b = tok_chat_builtins; b->name; b++, n++) {
		char path[256];
		size_t len;

		snprintf(path, sizeof(path), GOLDEN "%s.jinja", b->origin);
		char *text = slurp(path, &len);

		if (strlen(b->text) != len || memcmp(b->text, text, len))
			fail_msg("built-in %s differs from %s (run tests/golden/gen_chat.py)", b->name, path);
		free(text);
		jinja_free(parse_file(b->origin));
	}
	assert_int_equal(n, 7);
}

static int render_str(const char *src, const struct jinja_ctx *c, struct jinja_out *o, char *err,
		      size_t errlen)
{
	struct jinja_tmpl *t;
	int rc = jinja_parse(&t, src, strlen(src), err, errlen);

	*o = (struct jinja_out){ 0 };
	if (rc)
		return rc;
	rc = jinja_render(t, c, o, err, errlen);
	jinja_free(t);
	return rc;
}

/* What kvd does not implement is refused by name, at parse time where it can be. */
static void test_unsupported(void **state)
{
	static const struct { const char *src, *name; } cases[] = {
		{ "{% include 'x.j2' %}", "'include'" },
		{ "{% extends 'base' %}", "'extends'" },
		{ "{% raw %}x{% endraw %}", "'raw'" },
		{ "{% for m in messages recursive %}{% endfor %}", "recursive" },
		{ "{{ messages | wordwrap }}", "filter 'wordwrap'" },
		{ "{{ messages is escaped }}", "test 'escaped'" },
		{ "{{ 'x'.zfill(3) }}", "method 'zfill()'" },
		{ "{{ lipsum(2) }}", "function 'lipsum()'" },
		{ "{% set a, b = 1, 2 %}", "set a, b" },
	};
	struct jinja_tmpl *t;
	char err[256];

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int rc = jinja_parse(&t, cases[i].src, strlen(cases[i].src), err, sizeof(err));

		if (rc != -ENOTSUP || !strstr(err, cases[i].name))
			fail_msg("%s: %d '%s', wanted -ENOTSUP naming %s", cases[i].src, rc, err,
				 cases[i].name);
	}
}

/* Hostile templates end with an error, never a crash, a hang or unbounded memory. */
static void test_limits(void **state)
{
	static const struct jinja_msg m[] = { { "user", "hi" } };
	struct jinja_ctx c = { m, 1, "<s>", "</s>", 1, NOW, 0 };
	static const struct { const char *src; int rc; } cases[] = {
		{ "{% for i in range(1000000) %}{% endfor %}", -E2BIG },
		{ "{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", -E2BIG },
		{ "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", -E2BIG },
		{ "{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(40) %}"
		  "{% set ns.s = ns.s + ns.s %}{% endfor %}", -E2BIG },
		{ "{% for i in range(100000) %}{{ 'abcdefghijklmnopqrstuvwxyz' * 10 }}{% endfor %}", -E2BIG },
		/* Work inside loops: a lookup in a big list, a scan of a big string, each time. */
		{ "{% set l = range(100000) | list %}{% for i in range(100000) %}{% if -1 in l %}"
		  "{% endif %}{% endfor %}", -E2BIG },
		{ "{% set s = 'ab' * 1000000 %}{% for i in range(100000) %}{{ s | length > 0 }}"
		  "{% endfor %}", -E2BIG },
		{ "{{ 1 / 0 }}", -EINVAL },
		{ "{{ 9223372036854775807 + 1 }}", -ENOTSUP },
		{ "{{ none.x.y }}", -EINVAL },
		{ "{{ 'a' + 1 }}", -EINVAL },
		{ "{{ messages[0].content + undefined_thing }}", -EINVAL },
		{ "{% for a, b in messages %}{% endfor %}", -EINVAL },
		{ "{% set x = 1 %}{% set x.y = 2 %}", -EINVAL },
		{ "{{ range(1, 2, 0) }}", -EINVAL },
		/* Values nested by a loop: printing stops at the bound, comparing is false. */
		{ "{% set ns = namespace(x=1) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}"
		  "{% endfor %}{{ ns.x == ns.x }}{{ ns.x }}", -E2BIG },
		{ "{% set ns = namespace(x=1) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}"
		  "{% endfor %}{{ ns.x | tojson }}", -E2BIG },
	};
	struct jinja_out o;
	char err[256], deep[4096];

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int rc = render_str(cases[i].src, &c, &o, err, sizeof(err));

		if (rc != cases[i].rc)
			fail_msg("%s: %d '%s', wanted %d", cases[i].src, rc, err, cases[i].rc);
		assert_null(o.text);
	}
	/* Nesting: parentheses, lists, not, unary minus, filters on them, blocks. */
	const char *const open[][3] = { { "{{ ", "(", ")" }, { "{{ ", "[", "]" }, { "{{ ", "not ", "" },
					{ "{{ ", "-", "" }, { "{{ ", "(", ") | trim" },
					{ "", "{% if 1 %}", "{% endif %}" } };
	for (size_t k = 0; k < sizeof(open) / sizeof(open[0]); k++) {
		size_t w = (size_t)snprintf(deep, sizeof(deep), "%s", open[k][0]);

		for (int i = 0; i < 100; i++)
			w += (size_t)snprintf(deep + w, sizeof(deep) - w, "%s", open[k][1]);
		w += (size_t)snprintf(deep + w, sizeof(deep) - w, "1");
		for (int i = 0; i < 100; i++)
			w += (size_t)snprintf(deep + w, sizeof(deep) - w, "%s", open[k][2]);
		snprintf(deep + w, sizeof(deep) - w, "%s", open[k][0][0] ? " }}" : "");
		int rc = render_str(deep, &c, &o, err, sizeof(err));
		if (rc != -E2BIG)
			fail_msg("nesting %zu: %d %s", k, rc, err);
	}
	/* Chains nest the tree without nesting the parser: bounded too. */
	for (size_t k = 0; k < 4; k++) {
		static const char *const link[] = { ".a", " + 1", " | trim", "[0]" };
		char *chain = malloc(200000);
		size_t w = (size_t)snprintf(chain, 200000, "{{ x");

		assert_non_null(chain);
		while (w + 16 < 200000)
			w += (size_t)snprintf(chain + w, 200000 - w, "%s", link[k]);
		snprintf(chain + w, 200000 - w, " }}");
		int rc = render_str(chain, &c, &o, err, sizeof(err));
		free(chain);
		if (rc != -E2BIG)
			fail_msg("chain %zu: %d %s", k, rc, err);
	}
	/* A small max_out is the output's bound. */
	c.max_out = 8;
	assert_int_equal(render_str("{{ 'abcdefghij' }}", &c, &o, err, sizeof(err)), -E2BIG);
	assert_int_equal(render_str("{{ 'abcdef' }}{{ '' * 1000000000000 }}", &c, &o, err, sizeof(err)), 0);
	free(o.text);
	free(o.spans);
}

/* Syntax errors: -EINVAL with the line, whatever the bytes. */
static void test_syntax(void **state)
{
	static const char *const bad[] = {
		"{{", "{%", "{#", "{{ 'x }}", "{{ ) }}", "{% if x %}", "{% for %}", "{% endif %}",
		"{% if x %}{% else %}{% else %}{% endif %}", "{{ x[ }}", "{{ x. }}", "{{ f(a=) }}",
		"{{ [1, 2 }}", "{{ {'a' 1} }}", "{% set %}", "{% macro m( %}{% endmacro %}",
		"line\n\n{{ x + }}", "{{ x | }}", "{{ x is }}", "{{ \x01 }}",
	};
	struct jinja_tmpl *t;
	char err[256];

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int rc = jinja_parse(&t, bad[i], strlen(bad[i]), err, sizeof(err));

		if (rc != -EINVAL || !strstr(err, "line"))
			fail_msg("'%s': %d '%s'", bad[i], rc, err);
	}
	assert_int_equal(jinja_parse(&t, bad[16], strlen(bad[16]), err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "line 3"));
}

/* Message text lands in spans (through +, ~, trim, slices, macros); the template's own does not. */
static void test_spans(void **state)
{
	static const struct jinja_msg m[] = { { "user", "  a<b>  " }, { "assistant", "xyz" } };
	struct jinja_ctx c = { m, 2, "<s>", "</s>", 1, NOW, 0 };
	struct jinja_out o;
	char err[256];

	(void)state;
	assert_int_equal(render_str("{% macro w(t) %}[{{ t }}]{% endmacro %}"
				    "{% for x in messages %}<{{ x.role }}>{{ w(x.content | trim) ~ '|' + "
				    "x.content[1:] }}{% endfor %}", &c, &o, err, sizeof(err)), 0);
	assert_string_equal(o.text, "<user>[a<b>]| a<b>  <assistant>[xyz]|yz");
	assert_int_equal(o.n_spans, 4);
	const char *want[] = { "a<b>", " a<b>  ", "xyz", "yz" };
	for (size_t i = 0; i < 4; i++) {
		assert_int_equal(o.spans[i].len, strlen(want[i]));
		assert_memory_equal(o.text + o.spans[i].off, want[i], o.spans[i].len);
	}
	free(o.text);
	free(o.spans);
	/* strftime_now reads the injected time. */
	assert_int_equal(render_str("{{ strftime_now('%d %b %Y') }}", &c, &o, err, sizeof(err)), 0);
	assert_string_equal(o.text, "15 Jan 2026");
	free(o.text);
	free(o.spans);
}

/* The default model: its template runs, and --chat-template chooses a built-in one instead. */
static void test_select(void **state)
{
	const char *path = fixture_model_path();
	struct gguf_file *f;
	struct tokenizer *t;
	char err[256], buf[512];
	const struct chat_msg hi[] = { { "user", "Hi" } };

	(void)state;
	assert_int_equal(gguf_open(&f, path, err, sizeof(err)), 0);
	assert_int_equal(tokenizer_create(&t, f, err, sizeof(err)), 0);
	assert_int_equal(tokenizer_chat_select(t, NULL, err, sizeof(err)), 0);
	assert_int_equal(tokenizer_chat_select(t, "", err, sizeof(err)), 0);
	assert_int_equal(tokenizer_chat_select(t, "nope", err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "chatml, llama3, llama2, phi3, gemma, mistral, zephyr"));
	assert_true(tokenizer_chat_format(t, hi, 1, 1, buf, sizeof(buf)) > 0);
	assert_non_null(strstr(buf, "SmolLM"));
	assert_int_equal(tokenizer_chat_select(t, "chatml", err, sizeof(err)), 0);
	assert_int_equal(tokenizer_chat_format(t, hi, 1, 1, buf, sizeof(buf)),
			 strlen("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"));
	assert_string_equal(buf, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
	assert_int_equal(tokenizer_chat_next_turn(t, "Bye", buf, sizeof(buf)),
			 strlen("\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"));
	/* Gemma's refuses a system message: the messages are what is wrong. */
	assert_int_equal(tokenizer_chat_select(t, "gemma", err, sizeof(err)), 0);
	const struct chat_msg sys[] = { { "system", "S" }, { "user", "Hi" } };
	assert_int_equal(tokenizer_chat_format(t, sys, 2, 1, buf, sizeof(buf)), -EINVAL);
	assert_true(tokenizer_chat_format(t, hi, 1, 1, buf, sizeof(buf)) > 0);
	assert_non_null(strstr(buf, "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"));
	tokenizer_destroy(t);
	gguf_close(f);
}

/* A SentencePiece vocabulary of four tokens with chat_template tmpl, in memory (*buf: free it). */
static struct gguf_file *spm_with_template(const char *tmpl, struct wbuf *w)
{
	static const char *const toks[] = { "<unk>", "<s>", "</s>", "a" };
	const float scores[] = { 0, 0, 0, -1 };
	const int32_t types[] = { 2, 3, 3, 1 };
	struct gguf_file *f;
	char err[256];

	*w = (struct wbuf){ 0 };
	w_bytes(w, "GGUF", 4);
	w_u32(w, 3);
	w_u64(w, 0);
	w_u64(w, 7);
	w_key(w, "tokenizer.ggml.model", GGUF_VT_STRING);
	w_str(w, "llama");
	w_key(w, "tokenizer.ggml.tokens", GGUF_VT_ARRAY);
	w_u32(w, GGUF_VT_STRING);
	w_u64(w, 4);
	for (int i = 0; i < 4; i++)
		w_str(w, toks[i]);
	w_key(w, "tokenizer.ggml.scores", GGUF_VT_ARRAY);
	w_u32(w, GGUF_VT_F32);
	w_u64(w, 4);
	w_bytes(w, scores, sizeof(scores));
	w_key(w, "tokenizer.ggml.token_type", GGUF_VT_ARRAY);
	w_u32(w, GGUF_VT_I32);
	w_u64(w, 4);
	w_bytes(w, types, sizeof(types));
	w_key(w, "tokenizer.ggml.bos_token_id", GGUF_VT_U32);
	w_u32(w, 1);
	w_key(w, "tokenizer.ggml.eos_token_id", GGUF_VT_U32);
	w_u32(w, 2);
	w_key(w, "tokenizer.chat_template", GGUF_VT_STRING);
	w_str(w, tmpl);
	w_pad(w, 32);
	if (gguf_open_mem(&f, w->p, w->len, err, sizeof(err)))
		fail_msg("gguf_open_mem: %s", err);
	return f;
}

/* A GGUF template kvd cannot run is refused when the model loads, with why and what to do. */
static void test_refused(void **state)
{
	static const struct { const char *tmpl, *why; int ok; } cases[] = {
		{ "{% for m in messages %}{{ m.content | wordwrap }}{% endfor %}", "filter 'wordwrap'", 0 },
		{ "{{ bos_token + '[INST] ' + content + ' [/INST]' }}", "undefined", 0 },
		{ "{% for m in messages %}{% include 'x' %}{% endfor %}", "'include'", 0 },
		/* A template that raises on the probe's conversation is within its rights. */
		{ "{{ raise_exception('no system') if messages[0].role == 'system' }}{{ messages[0].content }}",
		  NULL, 1 },
	};
	const struct chat_msg hi[] = { { "user", "a" } };
	char err[512], buf[256];

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct wbuf w;
		struct gguf_file *f = spm_with_template(cases[i].tmpl, &w);
		struct tokenizer *t;

		assert_int_equal(tokenizer_create(&t, f, err, sizeof(err)), 0);
		int rc = tokenizer_chat_select(t, NULL, err, sizeof(err));
		if (cases[i].ok) {
			assert_int_equal(rc, 0);
		} else {
			if (rc != -ENOTSUP || !strstr(err, cases[i].why) || !strstr(err, "--chat-template"))
				fail_msg("%s: %d '%s'", cases[i].tmpl, rc, err);
			assert_int_equal(tokenizer_chat_format(t, hi, 1, 1, buf, sizeof(buf)), -ENOTSUP);
			/* --chat-template: a built-in one instead. */
			assert_int_equal(tokenizer_chat_select(t, "llama2", err, sizeof(err)), 0);
			assert_int_equal(tokenizer_chat_select(t, NULL, err, sizeof(err)), 0);
			assert_int_equal(tokenizer_chat_format(t, hi, 1, 1, buf, sizeof(buf)),
					 strlen("[INST] a [/INST]"));
			assert_string_equal(buf, "[INST] a [/INST]");
			/* The next turn: what follows the answer's </s>, BOS and all. */
			assert_int_equal(tokenizer_chat_next_turn(t, "b", buf, sizeof(buf)),
					 strlen("<s>[INST] b [/INST]"));
			assert_string_equal(buf, "<s>[INST] b [/INST]");
			/* Zephyr's ends each turn with </s> too; the newline after it is the next turn's. */
			assert_int_equal(tokenizer_chat_select(t, "zephyr", err, sizeof(err)), 0);
			assert_int_equal(tokenizer_chat_next_turn(t, "b", buf, sizeof(buf)),
					 strlen("\n<|user|>\nb</s>\n<|assistant|>\n"));
			assert_string_equal(buf, "\n<|user|>\nb</s>\n<|assistant|>\n");
			/* Mistral Nemo's writes bos_token itself: one BOS, the tokenizer's. */
			assert_int_equal(tokenizer_chat_select(t, "mistral", err, sizeof(err)), 0);
			const uint32_t want[] = { 1 };
			uint32_t ids[64];
			assert_true(tokenizer_chat_encode(t, hi, 1, 0, ids, 64) > 0);
			assert_memory_equal(ids, want, sizeof(want));
		}
		tokenizer_destroy(t);
		gguf_close(f);
		free(w.p);
	}
}

/* kvd --chat-template NAME: the option reaches the tokenizer; an unknown name stops kvd. */
static void test_option(void **state)
{
	static const struct { const char *name, *want; int code; } cases[] = {
		{ "nope", "unknown chat template 'nope'", 1 },
		{ "llama3", "prefill", 0 },
	};

	(void)state;
	if (access(kp_bin(), X_OK))
		skip();
	for (size_t i = 0; i < 2; i++) {
		char cmd[1024], out[8192];
		size_t n;

		snprintf(cmd, sizeof(cmd), "'%s' --model '%s' --backend cpu --chat --prompt Hi -n 0 "
			 "--chat-template %s 2>&1", kp_bin(), fixture_model_path(), cases[i].name);
		FILE *p = popen(cmd, "r");
		assert_non_null(p);
		n = fread(out, 1, sizeof(out) - 1, p);
		out[n] = 0;
		int st = pclose(p);
		if (!WIFEXITED(st) || (WEXITSTATUS(st) != 0) != cases[i].code || !strstr(out, cases[i].want))
			fail_msg("--chat-template %s: status %d, output:\n%s", cases[i].name, st, out);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_golden_templates),
		cmocka_unit_test(test_golden_snippets),
		cmocka_unit_test(test_builtin_texts),
		cmocka_unit_test(test_unsupported),
		cmocka_unit_test(test_limits),
		cmocka_unit_test(test_syntax),
		cmocka_unit_test(test_spans),
		cmocka_unit_test(test_select),
		cmocka_unit_test(test_refused),
		cmocka_unit_test(test_option),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
