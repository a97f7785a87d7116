/* test_gguf.c — GGUF reader: the real model, corrupted copies of it, a synthetic file. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/model/gguf.h"
#include "kernels/backend.h"
#include "tests/lib/gguf_patch.h"

#define DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

/* The real model read into memory once; tests patch it and put it back. */
static struct {
	const char *path;
	uint8_t *buf;		/* (size,) */
	size_t size;
	size_t data_start;	/* end of the header region */
	size_t tinfo_start;	/* first tensor info */
} M;

static char err[512];

static void need_model(void)
{
	if (!M.buf)
		fail_msg("model '%s' not found or unreadable: run `make model` (or set KVD_MODEL)",
			 M.path);
}

static bool str_eq(struct gguf_str s, const char *c)
{
	return s.ptr && s.len == strlen(c) && !memcmp(s.ptr, c, s.len);
}

static int group_setup(void **state)
{
	struct gguf_file *f;
	FILE *fp;
	long n;
	uint64_t i;

	(void)state;
	M.path = getenv("KVD_MODEL");
	if (!M.path || !*M.path)
		M.path = DEFAULT_MODEL;
	fp = fopen(M.path, "rb");
	if (!fp)
		return 0;	/* each test that needs it fails with a message */
	if (fseek(fp, 0, SEEK_END) || (n = ftell(fp)) <= 0 || fseek(fp, 0, SEEK_SET))
		goto out;
	M.buf = malloc((size_t)n);
	if (!M.buf)
		goto out;
	if (fread(M.buf, 1, (size_t)n, fp) != (size_t)n) {
		free(M.buf);
		M.buf = NULL;
		goto out;
	}
	M.size = (size_t)n;
	if (gguf_open_mem(&f, M.buf, M.size, err, sizeof(err)) == 0) {
		M.data_start = M.size;
		for (i = 0; i < f->n_tensors; i++) {
			size_t off = (size_t)((const uint8_t *)f->tensors[i].data - f->base);

			if (off < M.data_start)
				M.data_start = off;
		}
		M.tinfo_start = (size_t)((const uint8_t *)f->tensors[0].name.ptr - f->base) - 8;
		gguf_close(f);
	}
out:
	fclose(fp);
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	free(M.buf);
	return 0;
}

/* ---- helpers over the real model ---- */


/* Opens M.buf with n bytes at off replaced, then restores them (before any assert). */
static int open_patched(size_t off, const void *bytes, size_t n)
{
	struct gguf_file *f = NULL;
	uint8_t save[64];
	int ret;

	assert_true(n <= sizeof(save) && off + n <= M.size);
	memcpy(save, M.buf + off, n);
	memcpy(M.buf + off, bytes, n);
	err[0] = '\0';
	ret = gguf_open_mem(&f, M.buf, M.size, err, sizeof(err));
	memcpy(M.buf + off, save, n);
	if (ret == 0)
		gguf_close(f);
	else
		assert_null(f);
	return ret;
}

static int open_patched_u32(size_t off, uint32_t v) { return open_patched(off, &v, 4); }
static int open_patched_u64(size_t off, uint64_t v) { return open_patched(off, &v, 8); }

static void assert_err_has(const char *what)
{
	if (!strstr(err, what))
		fail_msg("error message \"%s\" does not mention \"%s\"", err, what);
}

/* Byte offsets of fields in the real file, found through a clean parse. */
static struct gguf_file *model_parse(void)
{
	struct gguf_file *f;

	need_model();
	assert_int_equal(gguf_open_mem(&f, M.buf, M.size, err, sizeof(err)), 0);
	return f;
}

static size_t at(const struct gguf_file *f, const void *p)
{
	return (size_t)((const uint8_t *)p - f->base);
}

/* key length prefix; value type follows the key bytes */
static size_t kv_off(const struct gguf_file *f, const char *key)
{
	const struct gguf_kv *kv = gguf_find_kv(f, key);

	assert_non_null(kv);
	return at(f, kv->key.ptr) - 8;
}

static size_t kv_type_off(const struct gguf_file *f, const char *key)
{
	const struct gguf_kv *kv = gguf_find_kv(f, key);

	assert_non_null(kv);
	return at(f, kv->key.ptr) + kv->key.len;
}

enum tfield { TF_NDIMS, TF_NE0, TF_TYPE, TF_OFFSET };

static size_t tensor_off(const struct gguf_file *f, const char *name, enum tfield which)
{
	const struct gguf_tensor *t = gguf_find_tensor(f, name);
	size_t p;

	assert_non_null(t);
	p = at(f, t->name.ptr) + t->name.len;
	switch (which) {
	case TF_NDIMS:	return p;
	case TF_NE0:	return p + 4;
	case TF_TYPE:	return p + 4 + 8 * t->n_dims;
	case TF_OFFSET:	return p + 4 + 8 * t->n_dims + 4;
	}
	return 0;
}

/* ---- the real model ---- */

static void check_model(const struct gguf_file *f)
{
	const struct gguf_tensor *t;
	const struct gguf_kv *kv;
	struct gguf_str s;
	const void *data;
	uint64_t n, i;
	uint32_t u;
	float x;
	int b;

	assert_int_equal(f->version, 3);
	assert_memory_equal(f->base, "GGUF", 4);
	assert_int_equal(f->n_kv, 33);
	assert_int_equal(f->n_tensors, 272);
	assert_int_equal(f->alignment, 32);

	assert_int_equal(gguf_get_str(f, "general.architecture", &s), 0);
	assert_true(str_eq(s, "llama"));
	assert_int_equal(gguf_get_str(f, "tokenizer.ggml.model", &s), 0);
	assert_true(str_eq(s, "gpt2"));
	assert_int_equal(gguf_get_str(f, "general.size_label", &s), 0);
	assert_true(str_eq(s, "135M"));
	assert_int_equal(gguf_get_u32(f, "llama.block_count", &u), 0);
	assert_int_equal(u, 30);
	assert_int_equal(gguf_get_u32(f, "llama.embedding_length", &u), 0);
	assert_int_equal(u, 576);
	assert_int_equal(gguf_get_u32(f, "llama.attention.head_count_kv", &u), 0);
	assert_int_equal(u, 3);
	assert_int_equal(gguf_get_f32(f, "llama.rope.freq_base", &x), 0);
	assert_true(x == 100000.0f);
	assert_int_equal(gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &b), 0);
	assert_int_equal(b, 0);

	assert_int_equal(gguf_get_u32(f, "general.architecture", &u), -EINVAL);
	assert_int_equal(gguf_get_u32(f, "no.such.key", &u), -ENOENT);
	assert_null(gguf_find_kv(f, "general.architectur"));

	kv = gguf_find_kv(f, "tokenizer.ggml.tokens");
	assert_non_null(kv);
	assert_int_equal(kv->type, GGUF_VT_ARRAY);
	assert_int_equal(kv->arr_type, GGUF_VT_STRING);
	assert_int_equal(kv->arr_len, 49152);
	assert_true(str_eq(gguf_arr_str(kv, 0), "<|endoftext|>"));
	assert_true(str_eq(gguf_arr_str(kv, 1), "<|im_start|>"));
	assert_true(str_eq(gguf_arr_str(kv, 2), "<|im_end|>"));
	assert_null(gguf_arr_str(kv, 49152).ptr);
	for (i = 0; i < kv->arr_len; i++) {
		s = gguf_arr_str(kv, i);
		assert_true(s.ptr >= (const char *)f->base &&
			    s.ptr + s.len <= (const char *)f->base + f->size);
	}
	kv = gguf_find_kv(f, "tokenizer.ggml.merges");
	assert_non_null(kv);
	assert_int_equal(kv->arr_len, 48900);
	assert_true(str_eq(gguf_arr_str(kv, 0), "\xc4\xa0 t"));
	assert_int_equal(gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_VT_I32, &data, &n), 0);
	assert_int_equal(n, 49152);
	assert_int_equal(gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_VT_U8, &data, &n), -EINVAL);
	assert_null(gguf_arr_str(gguf_find_kv(f, "tokenizer.ggml.token_type"), 0).ptr);

	t = gguf_find_tensor(f, "token_embd.weight");
	assert_non_null(t);
	assert_int_equal(t->type, GGUF_T_Q8_0);
	assert_int_equal(t->n_dims, 2);
	assert_int_equal(t->ne[0], 576);
	assert_int_equal(t->ne[1], 49152);
	assert_int_equal(t->ne[2], 1);
	assert_int_equal(t->ne[3], 1);
	assert_int_equal(t->n_elems, 576ull * 49152);
	assert_int_equal(t->size, 576ull * 49152 / 32 * 34);
	t = gguf_find_tensor(f, "blk.0.attn_q.weight");
	assert_non_null(t);
	assert_int_equal(t->type, GGUF_T_Q4_1);
	assert_int_equal(t->ne[0], 576);
	assert_int_equal(t->ne[1], 576);
	assert_int_equal(t->size, 576ull * 576 / 32 * 20);
	t = gguf_find_tensor(f, "blk.29.ffn_norm.weight");
	assert_non_null(t);
	assert_int_equal(t->type, GGUF_T_F32);
	assert_null(gguf_find_tensor(f, "blk.30.ffn_norm.weight"));

	for (i = 0; i < f->n_tensors; i++) {
		t = &f->tensors[i];
		assert_int_equal(at(f, t->data) % 32, 0);
		assert_true(at(f, t->data) + t->size <= f->size);
	}
}

static void test_model_open_mmap(void **state)
{
	struct gguf_file *f = NULL;
	int ret;

	(void)state;
	need_model();
	ret = gguf_open(&f, M.path, err, sizeof(err));
	if (ret)
		fail_msg("gguf_open('%s') = %d: %s", M.path, ret, err);
	check_model(f);
	gguf_close(f);
}

static void test_model_open_mem(void **state)
{
	struct gguf_file *f;

	(void)state;
	f = model_parse();
	assert_ptr_equal(f->base, M.buf);
	check_model(f);
	gguf_close(f);
	gguf_close(NULL);
}

static void test_open_errors(void **state)
{
	char path[] = "/tmp/test_gguf.XXXXXX";
	struct gguf_file *f = (void *)1;
	int fd;

	(void)state;
	assert_int_equal(gguf_open(&f, "/nonexistent/x.gguf", err, sizeof(err)), -ENOENT);
	assert_null(f);
	assert_err_has("/nonexistent/x.gguf");
	assert_int_equal(gguf_open(&f, "/", err, sizeof(err)), -EINVAL);
	fd = mkstemp(path);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "GGUF\3\0\0\0", 8), 8);
	close(fd);
	assert_int_equal(gguf_open(&f, path, err, sizeof(err)), -EINVAL);
	assert_err_has("header");
	unlink(path);
	/* a NULL err buffer is allowed */
	assert_int_equal(gguf_open_mem(&f, "GGUF", 4, NULL, 0), -EINVAL);
	assert_int_equal(gguf_open_mem(&f, NULL, 0, err, sizeof(err)), -EINVAL);
}

/* ---- corrupted copies of the real model ---- */

static void expect_trunc_fails(size_t len)
{
	struct gguf_file *f = NULL;
	int ret;

	err[0] = '\0';
	ret = gguf_open_mem(&f, M.buf, len, err, sizeof(err));
	if (ret != -EINVAL)
		fail_msg("truncated at %zu: got %d (%s), want -EINVAL", len, ret, err);
	assert_null(f);
	assert_true(err[0] != '\0');
}

static void test_truncated(void **state)
{
	size_t k, len, data_len;

	(void)state;
	need_model();
	for (k = 0; k <= 64; k++)
		expect_trunc_fails(M.data_start * k / 64);
	for (len = 0; len < 4096; len++)
		expect_trunc_fails(len);
	/* inside the tensor infos, byte by byte for a while */
	for (len = M.tinfo_start; len < M.tinfo_start + 512; len++)
		expect_trunc_fails(len);
	data_len = M.size - M.data_start;
	for (k = 0; k < 16; k++)
		expect_trunc_fails(M.data_start + data_len * k / 16);
	expect_trunc_fails(M.size - 1);
	assert_err_has("extends past end of file");
	assert_err_has("tensor '");
}

static void test_bad_magic(void **state)
{
	(void)state;
	need_model();
	assert_int_equal(open_patched(0, "GGUG", 4), -EINVAL);
	assert_err_has("magic");
	assert_int_equal(open_patched(0, "\0\0\0\0", 4), -EINVAL);
}

static void test_bad_version(void **state)
{
	(void)state;
	need_model();
	assert_int_equal(open_patched_u32(4, 1), -EINVAL);
	assert_err_has("v1");
	assert_int_equal(open_patched_u32(4, 99), -EINVAL);
	assert_err_has("99");
	assert_int_equal(open_patched_u32(4, 0), -EINVAL);
	assert_int_equal(open_patched_u32(4, 0x03000000), -EINVAL);
	assert_err_has("big-endian");
	/* v2 has the same layout as v3 */
	assert_int_equal(open_patched_u32(4, 2), 0);
}

static void test_huge_counts(void **state)
{
	(void)state;
	need_model();
	assert_int_equal(open_patched_u64(8, UINT64_MAX), -EINVAL);
	assert_err_has("tensor count");
	assert_int_equal(open_patched_u64(8, 1ull << 40), -EINVAL);
	assert_int_equal(open_patched_u64(8, M.size / 32), -EINVAL);
	assert_int_equal(open_patched_u64(16, UINT64_MAX), -EINVAL);
	assert_err_has("key count");
	assert_int_equal(open_patched_u64(16, 1ull << 62), -EINVAL);
	/* off by one either way: the parse goes out of step and must say so */
	assert_int_equal(open_patched_u64(16, 34), -EINVAL);
	assert_int_equal(open_patched_u64(8, 273), -EINVAL);
	assert_true(open_patched_u64(16, 32) < 0);
}

static void test_string_past_end(void **state)
{
	struct gguf_file *f = model_parse();
	const struct gguf_kv *kv = gguf_find_kv(f, "tokenizer.ggml.tokens");
	size_t arch = kv_off(f, "general.architecture");
	size_t tok5 = at(f, gguf_arr_str(kv, 5).ptr) - 8;
	size_t val = at(f, gguf_find_kv(f, "general.name")->data);
	size_t tname = at(f, f->tensors[3].name.ptr) - 8;

	(void)state;
	gguf_close(f);
	assert_int_equal(open_patched_u64(arch, M.size), -EINVAL);
	assert_err_has("key #0");
	assert_err_has("extends past end of file");
	assert_int_equal(open_patched_u64(arch, UINT64_MAX), -EINVAL);
	assert_int_equal(open_patched_u64(val, M.size - val - 8 + 1), -EINVAL);
	assert_err_has("'general.name'");
	assert_int_equal(open_patched_u64(tok5, 1ull << 60), -EINVAL);
	assert_err_has("'tokenizer.ggml.tokens'");
	assert_err_has("element 5");
	assert_int_equal(open_patched_u64(tname, M.size), -EINVAL);
	assert_err_has("tensor #3");
	assert_int_equal(open_patched_u64(arch, 0), -EINVAL);
	assert_err_has("empty key");
}

static void test_bad_value_type(void **state)
{
	struct gguf_file *f = model_parse();
	size_t arch = kv_type_off(f, "general.architecture");
	size_t langs = kv_type_off(f, "general.languages");
	size_t ttype = kv_type_off(f, "tokenizer.ggml.token_type");
	size_t bos = kv_type_off(f, "tokenizer.ggml.add_bos_token");

	(void)state;
	gguf_close(f);
	assert_int_equal(open_patched_u32(arch, GGUF_VT_LAST), -EINVAL);
	assert_err_has("'general.architecture'");
	assert_int_equal(open_patched_u32(arch, UINT32_MAX), -EINVAL);
	/* element type of the array */
	assert_int_equal(open_patched_u32(langs + 4, GGUF_VT_ARRAY), -EINVAL);
	assert_err_has("arrays of arrays");
	assert_err_has("'general.languages'");
	assert_int_equal(open_patched_u32(langs + 4, 77), -EINVAL);
	/* length x element size overflows */
	assert_int_equal(open_patched_u64(ttype + 8, UINT64_MAX / 2), -EINVAL);
	assert_err_has("'tokenizer.ggml.token_type'");
	assert_int_equal(open_patched(bos + 4, "\x02", 1), -EINVAL);
	assert_err_has("bool");
}

static void test_unknown_tensor_type(void **state)
{
	struct gguf_file *f = model_parse();
	size_t emb = tensor_off(f, "token_embd.weight", TF_TYPE);
	size_t q = tensor_off(f, "blk.7.attn_k.weight", TF_TYPE);

	(void)state;
	gguf_close(f);
	assert_int_equal(open_patched_u32(emb, 99), -ENOTSUP);
	assert_err_has("'token_embd.weight'");
	assert_err_has("99");
	assert_int_equal(open_patched_u32(q, 9), -ENOTSUP);	/* Q8_1: ggml has it, kvd not */
	assert_err_has("'blk.7.attn_k.weight'");
	assert_int_equal(open_patched_u32(q, GGUF_T_LAST), -ENOTSUP);
	/* a known type with another geometry changes the sizes but stays in the file */
	assert_int_equal(open_patched_u32(q, GGUF_T_Q4_0), 0);
}

static void test_bad_dims(void **state)
{
	struct gguf_file *f = model_parse();
	size_t ne0 = tensor_off(f, "token_embd.weight", TF_NE0);
	size_t nd = tensor_off(f, "blk.0.attn_q.weight", TF_NDIMS);

	(void)state;
	gguf_close(f);
	assert_int_equal(open_patched_u64(ne0, 577), -EINVAL);
	assert_err_has("'token_embd.weight'");
	assert_err_has("multiple");
	assert_int_equal(open_patched_u64(ne0, 0), -EINVAL);
	assert_err_has("'token_embd.weight'");
	assert_int_equal(open_patched_u64(ne0 + 8, 1ull << 63), -EINVAL);
	assert_int_equal(open_patched_u64(ne0 + 8, 1ull << 58), -EINVAL);
	assert_err_has("overflow");
	assert_int_equal(open_patched_u32(nd, 0), -EINVAL);
	assert_err_has("'blk.0.attn_q.weight'");
	assert_int_equal(open_patched_u32(nd, 5), -EINVAL);
	assert_err_has("dimensions");
}

static void test_misaligned_offset(void **state)
{
	struct gguf_file *f = model_parse();
	const struct gguf_tensor *t = gguf_find_tensor(f, "blk.0.attn_norm.weight");
	size_t p = tensor_off(f, "blk.0.attn_norm.weight", TF_OFFSET);
	uint64_t off = 0;

	(void)state;
	memcpy(&off, M.buf + p, 8);
	assert_int_equal(at(f, t->data), M.data_start + off);
	gguf_close(f);
	assert_int_equal(open_patched_u64(p, off + 1), -EINVAL);
	assert_err_has("'blk.0.attn_norm.weight'");
	assert_err_has("alignment");
	assert_int_equal(open_patched_u64(p, off + 16), -EINVAL);
	/* Aligned, but then it shares bytes with the tensor after it. */
	assert_int_equal(open_patched_u64(p, off + 32), -EINVAL);
	assert_err_has("overlap");
}

/* Two tensors at one offset: refused by name at open, never read as each other's bytes. */
static void test_overlapping_tensors(void **state)
{
	struct gguf_file *f = model_parse();
	size_t pa = tensor_off(f, "blk.0.attn_norm.weight", TF_OFFSET);
	size_t pb = tensor_off(f, "blk.0.ffn_norm.weight", TF_OFFSET);
	uint64_t off = 0;

	(void)state;
	gguf_close(f);
	memcpy(&off, M.buf + pa, 8);
	assert_int_equal(open_patched_u64(pb, off), -EINVAL);
	assert_err_has("overlap");
	assert_err_has("norm.weight");
}

static void test_data_past_eof(void **state)
{
	struct gguf_file *f = model_parse();
	size_t p = tensor_off(f, "blk.0.attn_norm.weight", TF_OFFSET);
	size_t room = M.size - M.data_start;

	(void)state;
	gguf_close(f);
	assert_int_equal(open_patched_u64(p, room & ~(uint64_t)31), -EINVAL);
	assert_err_has("'blk.0.attn_norm.weight'");
	assert_err_has("extends past end of file");
	assert_int_equal(open_patched_u64(p, (room + 31) & ~(uint64_t)31), -EINVAL);
	assert_int_equal(open_patched_u64(p, UINT64_MAX & ~(uint64_t)31), -EINVAL);
	assert_err_has("'blk.0.attn_norm.weight'");
}

static void test_duplicates(void **state)
{
	struct gguf_file *f = model_parse();
	const struct gguf_tensor *t = gguf_find_tensor(f, "blk.0.ffn_down.weight");
	const struct gguf_kv *kv = gguf_find_kv(f, "tokenizer.ggml.bos_token_id");
	size_t tp = at(f, t->name.ptr) + strlen("blk.0.ffn_");
	size_t kp = at(f, kv->key.ptr) + strlen("tokenizer.ggml.");

	(void)state;
	gguf_close(f);
	assert_int_equal(open_patched(tp, "gate", 4), -EINVAL);
	assert_err_has("'blk.0.ffn_gate.weight'");
	assert_err_has("more than once");
	assert_int_equal(open_patched(kp, "e", 1), -EINVAL);
	assert_err_has("'tokenizer.ggml.eos_token_id'");
}

/* 2000 random single-byte changes in the header region: open or refuse, never crash. */
static void test_fuzz_header(void **state)
{
	uint64_t x = 0x9e3779b97f4a7c15ull, ok = 0, bad = 0;
	struct gguf_file *f;
	int i, ret;

	(void)state;
	need_model();
	for (i = 0; i < 2000; i++) {
		size_t pos, span;
		uint8_t old, nv;

		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		switch (i % 4) {
		case 0:	/* header, counts and the first keys */
			pos = (size_t)(x % 2048);
			break;
		case 1:	/* tensor infos */
			span = M.data_start - M.tinfo_start;
			pos = M.tinfo_start + (size_t)(x % span);
			break;
		default:
			pos = (size_t)(x % M.data_start);
			break;
		}
		old = M.buf[pos];
		nv = (uint8_t)(old ^ (uint8_t)(1 + (x >> 32) % 255));
		M.buf[pos] = nv;
		f = NULL;
		err[0] = '\0';
		ret = gguf_open_mem(&f, M.buf, M.size, err, sizeof(err));
		M.buf[pos] = old;
		if (ret == 0) {
			uint64_t t;

			ok++;
			for (t = 0; t < f->n_tensors; t++)
				assert_true(at(f, f->tensors[t].data) + f->tensors[t].size <= M.size);
			gguf_close(f);
		} else {
			bad++;
			assert_true(ret == -EINVAL || ret == -ENOTSUP);
			assert_null(f);
			if (!err[0])
				fail_msg("byte %zu = 0x%02x: error %d without a message", pos, nv, ret);
		}
	}
	print_message("fuzz: %llu opened, %llu refused\n",
		      (unsigned long long)ok, (unsigned long long)bad);
}

/* ---- a synthetic file, written with tests/lib/gguf_patch.h ---- */

enum extra {
	X_NONE, X_DUP_KEY, X_NESTED, X_BAD_BOOL, X_ARR_OVF, X_STRARR_HUGE,
	X_EMPTY_KEY, X_ALIGN_STR, X_DUP_TENSOR, X_NO_TENSORS,
};

struct synth {
	uint32_t version;
	uint32_t align;		/* general.alignment written when nonzero */
	enum extra extra;
};

#define SYNTH_NKV 17

/*
 * Tensors: "a" F32 (4, 2) = 0..7 at offset 0, "b" Q8_0 (64,) = 2 blocks of
 * 0x11 at the next aligned offset.
 */
static void synth_build(struct wbuf *w, const struct synth *o)
{
	static const char *const strs[] = { "alpha", "", "gamma" };
	uint64_t n_kv = SYNTH_NKV + (o->align != 0) + (o->extra != X_NONE &&
		o->extra != X_DUP_TENSOR && o->extra != X_NO_TENSORS);
	uint64_t n_t = o->extra == X_NO_TENSORS ? 0 : 2;
	size_t align = o->align ? o->align : 32, i;
	/* a huge alignment is only written, not padded to: the data goes missing */
	size_t pad = align > 4096 ? 0 : align;
	float fv = 1.5f, a[8];
	double dv = 2.25;
	uint8_t q[68];

	memset(w, 0, sizeof(*w));
	w_bytes(w, "GGUF", 4);
	w_u32(w, o->version ? o->version : 3);
	w_u64(w, n_t);
	w_u64(w, n_kv);

	w_key(w, "t.u8", GGUF_VT_U8);		w_u8(w, 200);
	w_key(w, "t.i8", GGUF_VT_I8);		w_u8(w, (uint8_t)-5);
	w_key(w, "t.u16", GGUF_VT_U16);		w_bytes(w, &(uint16_t){60000}, 2);
	w_key(w, "t.i16", GGUF_VT_I16);		w_bytes(w, &(int16_t){-300}, 2);
	w_key(w, "t.u32", GGUF_VT_U32);		w_u32(w, 4000000000u);
	w_key(w, "t.i32", GGUF_VT_I32);		w_u32(w, (uint32_t)-7);
	w_key(w, "t.i32pos", GGUF_VT_I32);	w_u32(w, 123);
	w_key(w, "t.f32", GGUF_VT_F32);		w_bytes(w, &fv, 4);
	w_key(w, "t.bool", GGUF_VT_BOOL);	w_u8(w, 1);
	w_key(w, "t.str", GGUF_VT_STRING);	w_str(w, "hello");
	w_key(w, "t.u64", GGUF_VT_U64);		w_u64(w, 1ull << 40);
	w_key(w, "t.u64small", GGUF_VT_U64);	w_u64(w, 77);
	w_key(w, "t.i64", GGUF_VT_I64);		w_u64(w, (uint64_t)-1);
	w_key(w, "t.f64", GGUF_VT_F64);		w_bytes(w, &dv, 8);
	w_key(w, "t.strs", GGUF_VT_ARRAY);	w_u32(w, GGUF_VT_STRING); w_u64(w, 3);
	for (i = 0; i < 3; i++)
		w_str(w, strs[i]);
	w_key(w, "t.u32s", GGUF_VT_ARRAY);	w_u32(w, GGUF_VT_U32); w_u64(w, 4);
	for (i = 1; i <= 4; i++)
		w_u32(w, (uint32_t)i);
	w_key(w, "t.empty", GGUF_VT_ARRAY);	w_u32(w, GGUF_VT_F32); w_u64(w, 0);
	if (o->align) {
		w_key(w, "general.alignment", GGUF_VT_U32);
		w_u32(w, o->align);
	}
	switch (o->extra) {
	case X_DUP_KEY:
		w_key(w, "t.u16", GGUF_VT_U8); w_u8(w, 1);
		break;
	case X_NESTED:
		w_key(w, "t.nested", GGUF_VT_ARRAY); w_u32(w, GGUF_VT_ARRAY); w_u64(w, 1);
		w_u32(w, GGUF_VT_U8); w_u64(w, 1); w_u8(w, 0);
		break;
	case X_BAD_BOOL:
		w_key(w, "t.bool2", GGUF_VT_BOOL); w_u8(w, 2);
		break;
	case X_ARR_OVF:	/* 2^62 u64s: the byte count overflows */
		w_key(w, "t.ovf", GGUF_VT_ARRAY); w_u32(w, GGUF_VT_U64); w_u64(w, 1ull << 62);
		break;
	case X_STRARR_HUGE:
		w_key(w, "t.strhuge", GGUF_VT_ARRAY); w_u32(w, GGUF_VT_STRING);
		w_u64(w, 1ull << 61);
		break;
	case X_EMPTY_KEY:
		w_key(w, "", GGUF_VT_U8); w_u8(w, 0);
		break;
	case X_ALIGN_STR:
		w_key(w, "general.alignment", GGUF_VT_STRING); w_str(w, "32");
		break;
	default:
		break;
	}

	if (n_t) {
		w_str(w, "a");
		w_u32(w, 2); w_u64(w, 4); w_u64(w, 2);
		w_u32(w, GGUF_T_F32); w_u64(w, 0);
		w_str(w, o->extra == X_DUP_TENSOR ? "a" : "b");
		w_u32(w, 1); w_u64(w, 64);
		w_u32(w, GGUF_T_Q8_0); w_u64(w, pad ? (32 + align - 1) / align * align : 0);
		w_pad(w, pad);
		for (i = 0; i < 8; i++)
			a[i] = (float)i;
		w_bytes(w, a, sizeof(a));
		w_pad(w, pad);
		memset(q, 0x11, sizeof(q));
		w_bytes(w, q, sizeof(q));
	}
}

static int synth_open(const struct synth *o, struct wbuf *w, struct gguf_file **f)
{
	err[0] = '\0';
	synth_build(w, o);
	return gguf_open_mem(f, w->p, w->len, err, sizeof(err));
}

static void test_synthetic_getters(void **state)
{
	struct synth o = { 0 };
	const struct gguf_tensor *t;
	const struct gguf_kv *kv;
	struct gguf_file *f;
	struct gguf_str s;
	struct wbuf w;
	const void *data;
	uint32_t u, v[4];
	uint64_t n;
	float x;
	int b;

	(void)state;
	if (synth_open(&o, &w, &f))
		fail_msg("synthetic file refused: %s", err);
	assert_int_equal(f->version, 3);
	assert_int_equal(f->n_kv, SYNTH_NKV);
	assert_int_equal(f->alignment, 32);

	assert_int_equal(gguf_get_u32(f, "t.u8", &u), 0);
	assert_int_equal(u, 200);
	assert_int_equal(gguf_get_u32(f, "t.i8", &u), -EINVAL);	/* negative */
	assert_int_equal(gguf_get_u32(f, "t.u16", &u), 0);
	assert_int_equal(u, 60000);
	assert_int_equal(gguf_get_u32(f, "t.i16", &u), -EINVAL);
	assert_int_equal(gguf_get_u32(f, "t.u32", &u), 0);
	assert_int_equal(u, 4000000000u);
	assert_int_equal(gguf_get_u32(f, "t.i32", &u), -EINVAL);
	assert_int_equal(gguf_get_u32(f, "t.i32pos", &u), 0);
	assert_int_equal(u, 123);
	assert_int_equal(gguf_get_u32(f, "t.u64", &u), -EINVAL);	/* does not fit */
	assert_int_equal(gguf_get_u32(f, "t.u64small", &u), 0);
	assert_int_equal(u, 77);
	assert_int_equal(gguf_get_u32(f, "t.i64", &u), -EINVAL);
	assert_int_equal(gguf_get_u32(f, "t.f32", &u), -EINVAL);
	assert_int_equal(gguf_get_u32(f, "t.bool", &u), -EINVAL);
	assert_int_equal(gguf_get_u32(f, "t.strs", &u), -EINVAL);
	assert_int_equal(gguf_get_u32(f, "t.nope", &u), -ENOENT);

	assert_int_equal(gguf_get_f32(f, "t.f32", &x), 0);
	assert_true(x == 1.5f);
	assert_int_equal(gguf_get_f32(f, "t.f64", &x), 0);
	assert_true(x == 2.25f);
	assert_int_equal(gguf_get_f32(f, "t.u32", &x), -EINVAL);
	assert_int_equal(gguf_get_f32(f, "t.nope", &x), -ENOENT);

	assert_int_equal(gguf_get_bool(f, "t.bool", &b), 0);
	assert_int_equal(b, 1);
	assert_int_equal(gguf_get_bool(f, "t.u8", &b), -EINVAL);
	assert_int_equal(gguf_get_bool(f, "t.nope", &b), -ENOENT);

	assert_int_equal(gguf_get_str(f, "t.str", &s), 0);
	assert_true(str_eq(s, "hello"));
	assert_int_equal(gguf_get_str(f, "t.strs", &s), -EINVAL);
	assert_int_equal(gguf_get_str(f, "t.u8", &s), -EINVAL);
	assert_int_equal(gguf_get_str(f, "t.nope", &s), -ENOENT);

	assert_int_equal(gguf_get_arr(f, "t.u32s", GGUF_VT_U32, &data, &n), 0);
	assert_int_equal(n, 4);
	memcpy(v, data, sizeof(v));
	assert_int_equal(v[0], 1);
	assert_int_equal(v[3], 4);
	assert_int_equal(gguf_get_arr(f, "t.u32s", GGUF_VT_I32, &data, &n), -EINVAL);
	assert_int_equal(gguf_get_arr(f, "t.u32", GGUF_VT_U32, &data, &n), -EINVAL);
	assert_int_equal(gguf_get_arr(f, "t.nope", GGUF_VT_U32, &data, &n), -ENOENT);
	assert_int_equal(gguf_get_arr(f, "t.empty", GGUF_VT_F32, &data, &n), 0);
	assert_int_equal(n, 0);
	assert_int_equal(gguf_get_arr(f, "t.strs", GGUF_VT_STRING, &data, &n), 0);
	assert_int_equal(n, 3);

	kv = gguf_find_kv(f, "t.strs");
	assert_non_null(kv);
	assert_true(str_eq(gguf_arr_str(kv, 0), "alpha"));
	s = gguf_arr_str(kv, 1);
	assert_non_null(s.ptr);
	assert_int_equal(s.len, 0);
	assert_true(str_eq(gguf_arr_str(kv, 2), "gamma"));
	assert_null(gguf_arr_str(kv, 3).ptr);
	assert_null(gguf_arr_str(gguf_find_kv(f, "t.u32s"), 0).ptr);
	assert_null(gguf_arr_str(NULL, 0).ptr);

	assert_int_equal(f->n_tensors, 2);
	t = gguf_find_tensor(f, "a");
	assert_non_null(t);
	assert_int_equal(t->type, GGUF_T_F32);
	assert_int_equal(t->n_dims, 2);
	assert_int_equal(t->n_elems, 8);
	assert_int_equal(t->size, 32);
	assert_int_equal(at(f, t->data) % 32, 0);
	assert_true(((const float *)t->data)[7] == 7.0f);
	t = gguf_find_tensor(f, "b");
	assert_non_null(t);
	assert_int_equal(t->type, GGUF_T_Q8_0);
	assert_int_equal(t->size, 68);
	assert_int_equal(at(f, t->data) + 68, w.len);
	assert_int_equal(((const uint8_t *)t->data)[67], 0x11);
	assert_null(gguf_find_tensor(f, "c"));
	assert_null(gguf_find_tensor(f, "ab"));
	gguf_close(f);
	free(w.p);
}

static void test_synthetic_variants(void **state)
{
	static const struct {
		struct synth o;
		int want;
		const char *msg;
	} cases[] = {
		{ { 2, 0, X_NONE }, 0, NULL },
		{ { 3, 64, X_NONE }, 0, NULL },
		{ { 3, 1, X_NONE }, 0, NULL },
		{ { 3, 0, X_NO_TENSORS }, 0, NULL },
		{ { 1, 0, X_NONE }, -EINVAL, "v1" },
		{ { 3, 3, X_NONE }, -EINVAL, "'general.alignment'" },
		{ { 3, 48, X_NONE }, -EINVAL, "power of two" },
		{ { 3, 0x80000000u, X_NONE }, -EINVAL, "'a'" },
		{ { 3, 0, X_ALIGN_STR }, -EINVAL, "'general.alignment'" },
		{ { 3, 0, X_DUP_KEY }, -EINVAL, "'t.u16'" },
		{ { 3, 0, X_NESTED }, -EINVAL, "'t.nested'" },
		{ { 3, 0, X_BAD_BOOL }, -EINVAL, "'t.bool2'" },
		{ { 3, 0, X_ARR_OVF }, -EINVAL, "'t.ovf'" },
		{ { 3, 0, X_STRARR_HUGE }, -EINVAL, "'t.strhuge'" },
		{ { 3, 0, X_EMPTY_KEY }, -EINVAL, "empty key" },
		{ { 3, 0, X_DUP_TENSOR }, -EINVAL, "tensor 'a'" },
	};
	struct gguf_file *f;
	struct wbuf w;
	size_t i, len;
	int ret;

	(void)state;
	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		f = NULL;
		ret = synth_open(&cases[i].o, &w, &f);
		if (ret != cases[i].want)
			fail_msg("case %zu: got %d (%s), want %d", i, ret, err, cases[i].want);
		if (cases[i].msg)
			assert_err_has(cases[i].msg);
		if (ret == 0) {
			if (cases[i].o.align)
				assert_int_equal(f->alignment, cases[i].o.align);
			gguf_close(f);
		} else {
			assert_null(f);
		}
		/* every prefix of a good file is refused, and none crashes */
		if (cases[i].want == 0 && cases[i].o.extra != X_NO_TENSORS) {
			for (len = 0; len < w.len; len++) {
				ret = gguf_open_mem(&f, w.p, len, err, sizeof(err));
				if (ret != -EINVAL)
					fail_msg("case %zu cut at %zu: got %d", i, len, ret);
			}
		}
		free(w.p);
	}
}

/* Every byte of the synthetic file set to a few values: open or refuse, never crash. */
static void test_fuzz_synthetic(void **state)
{
	static const uint8_t vals[] = { 0x00, 0x01, 0x02, 0x07, 0x08, 0x09, 0x0d, 0x1f,
					0x20, 0x63, 0x7f, 0x80, 0xfe, 0xff };
	struct synth o = { 3, 0, X_NONE };
	struct gguf_file *f;
	struct wbuf w;
	size_t pos, v;
	uint64_t t, k;
	int ret;

	(void)state;
	synth_build(&w, &o);
	for (pos = 0; pos < w.len; pos++) {
		uint8_t old = w.p[pos];

		for (v = 0; v < sizeof(vals); v++) {
			w.p[pos] = vals[v];
			f = NULL;
			err[0] = '\0';
			ret = gguf_open_mem(&f, w.p, w.len, err, sizeof(err));
			if (ret) {
				assert_true(ret == -EINVAL || ret == -ENOTSUP);
				assert_null(f);
				assert_true(err[0] != '\0');
				continue;
			}
			for (t = 0; t < f->n_tensors; t++)
				assert_true(at(f, f->tensors[t].data) + f->tensors[t].size <= w.len);
			for (k = 0; k < f->n_kv; k++) {
				const struct gguf_kv *kv = &f->kv[k];
				uint64_t i;

				for (i = 0; kv->strs && i < kv->arr_len; i++) {
					struct gguf_str s = gguf_arr_str(kv, i);

					assert_true(at(f, s.ptr) + s.len <= w.len);
				}
			}
			gguf_close(f);
		}
		w.p[pos] = old;
	}
	free(w.p);
}

static void test_type_geometry(void **state)
{
	static const struct { uint32_t t, e, b; const char *name; } g[] = {
		{ GGUF_T_F32, 1, 4, "F32" },	{ GGUF_T_F16, 1, 2, "F16" },
		{ GGUF_T_BF16, 1, 2, "BF16" },	{ GGUF_T_Q4_0, 32, 18, "Q4_0" },
		{ GGUF_T_Q4_1, 32, 20, "Q4_1" },	{ GGUF_T_Q8_0, 32, 34, "Q8_0" },
		{ GGUF_T_Q4_K, 256, 144, "Q4_K" }, { GGUF_T_Q6_K, 256, 210, "Q6_K" },
	};
	uint32_t e, b;
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(g) / sizeof(g[0]); i++) {
		assert_int_equal(kb_type_block(g[i].t, &e, &b), 0);
		assert_int_equal(e, g[i].e);
		assert_int_equal(b, g[i].b);
		assert_string_equal(kb_type_name(g[i].t), g[i].name);
	}
	assert_int_equal(kb_type_block(9, &e, &b), -EINVAL);
	assert_int_equal(kb_type_block(GGUF_T_LAST, &e, &b), -EINVAL);
	assert_int_equal(kb_type_block(UINT32_MAX, NULL, NULL), -EINVAL);
	assert_string_equal(kb_type_name(99), "unknown");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_type_geometry),
		cmocka_unit_test(test_synthetic_getters),
		cmocka_unit_test(test_synthetic_variants),
		cmocka_unit_test(test_fuzz_synthetic),
		cmocka_unit_test(test_open_errors),
		cmocka_unit_test(test_model_open_mmap),
		cmocka_unit_test(test_model_open_mem),
		cmocka_unit_test(test_truncated),
		cmocka_unit_test(test_bad_magic),
		cmocka_unit_test(test_bad_version),
		cmocka_unit_test(test_huge_counts),
		cmocka_unit_test(test_string_past_end),
		cmocka_unit_test(test_bad_value_type),
		cmocka_unit_test(test_unknown_tensor_type),
		cmocka_unit_test(test_bad_dims),
		cmocka_unit_test(test_misaligned_offset),
		cmocka_unit_test(test_overlapping_tensors),
		cmocka_unit_test(test_data_past_eof),
		cmocka_unit_test(test_duplicates),
		cmocka_unit_test(test_fuzz_header),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
