/* gguf.c — validating reader of GGUF v2/v3 files, mmap'd or in a caller buffer: the parser. */
#include "daemon/model/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "daemon/log.h"
#include "daemon/model/gguf_int.h"

#define GGUF_MAGIC		0x46554747u	/* "GGUF" read as a little-endian u32 */
#define GGUF_HDR_BYTES		24		/* magic, version, n_tensors, n_kv */
#define GGUF_DEFAULT_ALIGN	32
/*
 * The smallest encodings of one key/value pair (key length, type, 1-byte
 * value) and one tensor info (name length, n_dims, one ne, type, offset).
 * Counts are bounded by the bytes left divided by these before anything is
 * allocated, so a corrupt count cannot ask for a giant allocation.
 */
#define GGUF_MIN_KV_BYTES	(8 + 4 + 1)
#define GGUF_MIN_TENSOR_BYTES	(8 + 4 + 8 + 4 + 8)
#define GGUF_MIN_STR_BYTES	8
#define GGUF_SHOW_MAX		64		/* bytes of a name quoted in messages */

/* gguf_open*() hand out &p->f; gguf_close() gets back here from it. */
struct gguf_priv {
	struct gguf_file f;	/* first member */
	bool mapped;		/* base/size came from mmap() */
};

/* A cursor over the file; pos <= size always holds. */
struct rd {
	const uint8_t *base;
	size_t size;
	size_t pos;
	char *err;
	size_t errlen;
};

/* The reader's error string: log_errf into the caller's buffer. */
#define fail(r, ret, ...) log_errf((r)->err, (r)->errlen, (ret), __VA_ARGS__)

/*
 * Quote a name from the file for a message: bounded, control bytes replaced,
 * so a corrupt name cannot flood or garble the log. buf has GGUF_SHOW_MAX+4.
 */
static const char *show(char *buf, struct gguf_str s)
{
	size_t n = s.len < GGUF_SHOW_MAX ? (size_t)s.len : GGUF_SHOW_MAX;
	size_t i;

	for (i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s.ptr[i];
		buf[i] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
	}
	if (s.len > GGUF_SHOW_MAX) {
		memcpy(buf + n, "...", 3);
		n += 3;
	}
	buf[n] = '\0';
	return buf;
}

static bool mul_ovf(uint64_t a, uint64_t b, uint64_t *out)
{
	return __builtin_mul_overflow(a, b, out);
}

static size_t left(const struct rd *r)
{
	return r->size - r->pos;
}

/* ctx names what is being read ("key 'x'", "tensor #3"), field the item. */
static int rd_u32(struct rd *r, uint32_t *v, const char *ctx, const char *field)
{
	if (left(r) < 4)
		return fail(r, -EINVAL, "%s: %s at offset %zu is cut off by end of file (%zu bytes)",
			    ctx, field, r->pos, r->size);
	*v = ld_u32(r->base + r->pos);
	r->pos += 4;
	return 0;
}

static int rd_u64(struct rd *r, uint64_t *v, const char *ctx, const char *field)
{
	if (left(r) < 8)
		return fail(r, -EINVAL, "%s: %s at offset %zu is cut off by end of file (%zu bytes)",
			    ctx, field, r->pos, r->size);
	*v = ld_u64(r->base + r->pos);
	r->pos += 8;
	return 0;
}

static int rd_str(struct rd *r, struct gguf_str *s, const char *ctx, const char *field)
{
	size_t at = r->pos;
	uint64_t len = 0;
	int ret;

	ret = rd_u64(r, &len, ctx, field);
	if (ret)
		return ret;
	if (len > left(r))
		return fail(r, -EINVAL, "%s: %s length %" PRIu64 " at offset %zu extends past end of file (%zu bytes)",
			    ctx, field, len, at, r->size);
	s->ptr = (const char *)r->base + r->pos;
	s->len = len;
	r->pos += len;
	return 0;
}

static const uint8_t vt_size[GGUF_VT_LAST] = {
	[GGUF_VT_U8] = 1, [GGUF_VT_I8] = 1, [GGUF_VT_U16] = 2, [GGUF_VT_I16] = 2,
	[GGUF_VT_U32] = 4, [GGUF_VT_I32] = 4, [GGUF_VT_F32] = 4, [GGUF_VT_BOOL] = 1,
	[GGUF_VT_U64] = 8, [GGUF_VT_I64] = 8, [GGUF_VT_F64] = 8,
	/* STRING and ARRAY have variable size */
};

static const char *const vt_name[GGUF_VT_LAST] = {
	[GGUF_VT_U8] = "u8", [GGUF_VT_I8] = "i8", [GGUF_VT_U16] = "u16",
	[GGUF_VT_I16] = "i16", [GGUF_VT_U32] = "u32", [GGUF_VT_I32] = "i32",
	[GGUF_VT_F32] = "f32", [GGUF_VT_BOOL] = "bool", [GGUF_VT_STRING] = "string",
	[GGUF_VT_ARRAY] = "array", [GGUF_VT_U64] = "u64", [GGUF_VT_I64] = "i64",
	[GGUF_VT_F64] = "f64",
};

/*
 * Grow *arr (of elsize-byte entries, *cap of them) to hold n+1. Doubling from
 * a small start means memory follows what was actually parsed, not the
 * declared count; want is the declared count, which caps the growth.
 */
static int grow(void **arr, size_t *cap, size_t n, size_t elsize, uint64_t want)
{
	size_t ncap;
	void *p;

	if (n < *cap)
		return 0;
	ncap = *cap ? *cap * 2 : 64;
	if (ncap > want)
		ncap = want;
	if (ncap <= n)
		ncap = n + 1;
	if (ncap > SIZE_MAX / elsize)
		return -ENOMEM;
	p = realloc(*arr, ncap * elsize);
	if (!p)
		return -ENOMEM;
	*arr = p;
	*cap = ncap;
	return 0;
}

_Static_assert(offsetof(struct gguf_kv, key) == 0, "find_dup() reads the key first");
_Static_assert(offsetof(struct gguf_tensor, name) == 0, "find_dup() reads the name first");

static int cmp_str(const void *a, const void *b)
{
	const struct gguf_str *x = a, *y = b;
	size_t n = x->len < y->len ? (size_t)x->len : (size_t)y->len;
	int c = memcmp(x->ptr, y->ptr, n);

	if (c)
		return c;
	return (x->len > y->len) - (x->len < y->len);
}

/*
 * names: n structs of stride bytes, each starting with its struct gguf_str
 * name (key, tensor name). Find two equal names among n (sorted copies, so crafted files with millions
 * of names cannot make this quadratic). Returns 1 and the name, 0, or -ENOMEM.
 */
static int find_dup(const void *names, size_t stride, size_t n,
		    struct gguf_str *dup)
{
	struct gguf_str *s;
	size_t i;
	int ret = 0;

	if (n < 2)
		return 0;
	s = malloc(n * sizeof(*s));
	if (!s)
		return -ENOMEM;
	for (i = 0; i < n; i++)
		memcpy(&s[i], (const char *)names + i * stride, sizeof(s[i]));
	qsort(s, n, sizeof(*s), cmp_str);
	for (i = 1; i < n; i++) {
		if (!cmp_str(&s[i - 1], &s[i])) {
			*dup = s[i];
			ret = 1;
			break;
		}
	}
	free(s);
	return ret;
}

/*
 * Index a string array of n elements starting at r->pos. First pass checks
 * every length against the file, second fills the index, so the index is
 * sized from validated content only.
 */
static int rd_str_array(struct rd *r, struct gguf_kv *kv, const char *ctx)
{
	size_t start = r->pos;
	struct gguf_str s;
	char field[48];
	uint64_t i, n = kv->arr_len;
	int ret;

	if (n > left(r) / GGUF_MIN_STR_BYTES)
		return fail(r, -EINVAL, "%s: string array of %" PRIu64 " elements cannot fit in the %zu bytes left in the file",
			    ctx, n, left(r));
	for (i = 0; i < n; i++) {
		uint64_t len;

		if (left(r) >= 8) {
			len = ld_u64(r->base + r->pos);
			if (len <= left(r) - 8) {
				r->pos += 8 + len;
				continue;
			}
		}
		/* slow path only to word the error */
		snprintf(field, sizeof(field), "element %" PRIu64, i);
		ret = rd_str(r, &s, ctx, field);
		return ret ? ret : fail(r, -EINVAL, "%s: %s: internal error", ctx, field);
	}
	if (n == 0)
		return 0;
	kv->strs = malloc(n * sizeof(*kv->strs));
	if (!kv->strs)
		return fail(r, -ENOMEM, "%s: no memory to index %" PRIu64 " strings", ctx, n);
	r->pos = start;
	for (i = 0; i < n; i++) {
		kv->strs[i].len = ld_u64(r->base + r->pos);
		kv->strs[i].ptr = (const char *)r->base + r->pos + 8;
		r->pos += 8 + kv->strs[i].len;
	}
	return 0;
}

static int check_bools(struct rd *r, const uint8_t *p, uint64_t n, const char *ctx)
{
	uint64_t i;

	for (i = 0; i < n; i++)
		if (p[i] > 1)
			return fail(r, -EINVAL, "%s: bool value %u at offset %zu is neither 0 nor 1",
				    ctx, p[i], (size_t)(p + i - r->base));
	return 0;
}

/* Parse one key/value pair into kv (zeroed by the caller). */
static int rd_kv(struct rd *r, struct gguf_kv *kv, uint64_t idx)
{
	char ctx[GGUF_SHOW_MAX + 32], name[GGUF_SHOW_MAX + 4];
	uint64_t bytes;
	uint32_t et = 0;
	int ret;

	snprintf(ctx, sizeof(ctx), "key #%" PRIu64, idx);
	ret = rd_str(r, &kv->key, ctx, "name");
	if (ret)
		return ret;
	if (kv->key.len == 0)
		return fail(r, -EINVAL, "%s: empty key name", ctx);
	snprintf(ctx, sizeof(ctx), "key '%s'", show(name, kv->key));

	ret = rd_u32(r, &kv->type, ctx, "value type");
	if (ret)
		return ret;
	if (kv->type >= GGUF_VT_LAST)
		return fail(r, -EINVAL, "%s: unknown value type %u", ctx, kv->type);

	if (kv->type == GGUF_VT_STRING) {
		struct gguf_str v;

		/* data points at the length prefix, as for string array elements */
		kv->data = r->base + r->pos;
		return rd_str(r, &v, ctx, "string value");
	}

	if (kv->type != GGUF_VT_ARRAY) {
		if (left(r) < vt_size[kv->type])
			return fail(r, -EINVAL, "%s: %s value at offset %zu is cut off by end of file (%zu bytes)",
				    ctx, vt_name[kv->type], r->pos, r->size);
		kv->data = r->base + r->pos;
		r->pos += vt_size[kv->type];
		if (kv->type == GGUF_VT_BOOL)
			return check_bools(r, kv->data, 1, ctx);
		return 0;
	}

	ret = rd_u32(r, &et, ctx, "array element type");
	if (ret)
		return ret;
	if (et == GGUF_VT_ARRAY)
		return fail(r, -EINVAL, "%s: arrays of arrays are not supported", ctx);
	if (et >= GGUF_VT_LAST)
		return fail(r, -EINVAL, "%s: unknown array element type %u", ctx, et);
	kv->arr_type = et;
	ret = rd_u64(r, &kv->arr_len, ctx, "array length");
	if (ret)
		return ret;
	kv->data = r->base + r->pos;
	if (et == GGUF_VT_STRING)
		return rd_str_array(r, kv, ctx);

	if (mul_ovf(kv->arr_len, vt_size[et], &bytes) || bytes > left(r))
		return fail(r, -EINVAL, "%s: array of %" PRIu64 " %s at offset %zu extends past end of file (%zu bytes)",
			    ctx, kv->arr_len, vt_name[et], r->pos, r->size);
	r->pos += bytes;
	if (et == GGUF_VT_BOOL)
		return check_bools(r, kv->data, kv->arr_len, ctx);
	return 0;
}

/* Parse one tensor info; the data offset (relative to the data section) goes to *off. */
static int rd_tensor(struct rd *r, struct gguf_tensor *t, uint64_t *off,
		     uint64_t align, uint64_t idx)
{
	char ctx[GGUF_SHOW_MAX + 32], name[GGUF_SHOW_MAX + 4], field[16];
	uint32_t d, be, bb;
	uint64_t n = 1;
	int ret;

	snprintf(ctx, sizeof(ctx), "tensor #%" PRIu64, idx);
	ret = rd_str(r, &t->name, ctx, "name");
	if (ret)
		return ret;
	if (t->name.len == 0)
		return fail(r, -EINVAL, "%s: empty tensor name", ctx);
	snprintf(ctx, sizeof(ctx), "tensor '%s'", show(name, t->name));

	ret = rd_u32(r, &t->n_dims, ctx, "n_dims");
	if (ret)
		return ret;
	if (t->n_dims < 1 || t->n_dims > 4)
		return fail(r, -EINVAL, "%s: %u dimensions (expected 1..4)", ctx, t->n_dims);
	for (d = 0; d < 4; d++)
		t->ne[d] = 1;
	for (d = 0; d < t->n_dims; d++) {
		snprintf(field, sizeof(field), "ne[%u]", d);
		ret = rd_u64(r, &t->ne[d], ctx, field);
		if (ret)
			return ret;
		/* ggml keeps ne in int64_t */
		if (t->ne[d] < 1 || t->ne[d] > INT64_MAX)
			return fail(r, -EINVAL, "%s: ne[%u] = %" PRIu64 " out of range",
				    ctx, d, t->ne[d]);
		if (mul_ovf(n, t->ne[d], &n) || n > INT64_MAX)
			return fail(r, -EINVAL, "%s: element count overflows at ne[%u]", ctx, d);
	}
	t->n_elems = n;

	ret = rd_u32(r, &t->type, ctx, "type");
	if (ret)
		return ret;
	if (kb_type_block(t->type, &be, &bb))
		return fail(r, -ENOTSUP, "%s: unsupported tensor type %u", ctx, t->type);
	if (t->ne[0] % be)
		return fail(r, -EINVAL, "%s: ne[0] = %" PRIu64 " is not a multiple of the %s block size (%u)",
			    ctx, t->ne[0], kb_type_name(t->type), be);
	/* n is a multiple of be because ne[0] is */
	if (mul_ovf(n / be, bb, &t->size))
		return fail(r, -EINVAL, "%s: byte size overflows", ctx);

	ret = rd_u64(r, off, ctx, "data offset");
	if (ret)
		return ret;
	if (*off % align)
		return fail(r, -EINVAL, "%s: data offset %" PRIu64 " is not a multiple of the alignment (%" PRIu64 ")",
			    ctx, *off, align);
	return 0;
}

/* general.alignment: optional u32, a power of two; default 32. */
static int rd_alignment(struct rd *r, const struct gguf_file *f, uint64_t *align)
{
	const struct gguf_kv *kv = gguf_find_kv(f, "general.alignment");
	uint32_t a;

	*align = GGUF_DEFAULT_ALIGN;
	if (!kv)
		return 0;
	if (kv->type != GGUF_VT_U32)
		return fail(r, -EINVAL, "key 'general.alignment': type %s, expected u32",
			    vt_name[kv->type]);
	a = ld_u32(kv->data);
	if (a == 0 || (a & (a - 1)))
		return fail(r, -EINVAL, "key 'general.alignment': %u is not a power of two", a);
	*align = a;
	return 0;
}

/* The fixed header: magic, version and the two counts, each bounded by the bytes left. */
static int rd_header(struct rd *r, struct gguf_file *f, uint64_t *n_kv, uint64_t *n_tensors)
{
	uint32_t magic;

	if (r->size < GGUF_HDR_BYTES)
		return fail(r, -EINVAL, "header: file is %zu bytes, smaller than a GGUF header (%d)",
			    r->size, GGUF_HDR_BYTES);
	magic = ld_u32(r->base);
	if (magic != GGUF_MAGIC)
		return fail(r, -EINVAL, "header: bad magic 0x%08x (expected \"GGUF\"): not a GGUF file", magic);
	f->version = ld_u32(r->base + 4);
	if (f->version == 1)
		return fail(r, -EINVAL, "header: GGUF v1 is not supported (only v2 and v3): re-convert the model");
	if (f->version != 2 && f->version != 3) {
		if (f->version == __builtin_bswap32(2) || f->version == __builtin_bswap32(3))
			return fail(r, -EINVAL, "header: big-endian GGUF files are not supported");
		return fail(r, -EINVAL, "header: unsupported GGUF version %u (only 2 and 3)", f->version);
	}
	*n_tensors = ld_u64(r->base + 8);
	*n_kv = ld_u64(r->base + 16);
	r->pos = GGUF_HDR_BYTES;

	/* each bounded alone first so the sum below cannot overflow */
	if (*n_kv > left(r) / GGUF_MIN_KV_BYTES)
		return fail(r, -EINVAL, "header: key count %" PRIu64 " cannot fit in a file of %zu bytes",
			    *n_kv, r->size);
	if (*n_tensors > left(r) / GGUF_MIN_TENSOR_BYTES)
		return fail(r, -EINVAL, "header: tensor count %" PRIu64 " cannot fit in a file of %zu bytes",
			    *n_tensors, r->size);
	if (*n_kv * GGUF_MIN_KV_BYTES + *n_tensors * GGUF_MIN_TENSOR_BYTES > left(r))
		return fail(r, -EINVAL, "header: %" PRIu64 " keys and %" PRIu64 " tensors cannot fit in a file of %zu bytes",
			    *n_kv, *n_tensors, r->size);
	return 0;
}

/* The n_kv key/value pairs into f->kv; a key may appear once. */
static int rd_kvs(struct rd *r, struct gguf_file *f, uint64_t n_kv)
{
	char name[GGUF_SHOW_MAX + 4];
	size_t kv_cap = 0;
	struct gguf_str dup;
	uint64_t i;
	int ret;

	for (i = 0; i < n_kv; i++) {
		if (grow((void **)&f->kv, &kv_cap, f->n_kv, sizeof(*f->kv), n_kv))
			return fail(r, -ENOMEM, "key #%" PRIu64 ": out of memory", i);
		memset(&f->kv[f->n_kv], 0, sizeof(*f->kv));
		/* counted before parsing so gguf_close() frees a half-built index */
		f->n_kv++;
		ret = rd_kv(r, &f->kv[i], i);
		if (ret)
			return ret;
	}
	ret = find_dup(f->kv, sizeof(*f->kv), f->n_kv, &dup);
	if (ret < 0)
		return fail(r, ret, "keys: out of memory");
	if (ret)
		return fail(r, -EINVAL, "key '%s': appears more than once", show(name, dup));
	return 0;
}

/*
 * The n_tensors tensor infos into f->tensors and their data offsets into
 * *offs (the caller frees it, also on failure); a name may appear once.
 */
static int rd_tensors(struct rd *r, struct gguf_file *f, uint64_t n_tensors, uint64_t **offs)
{
	char name[GGUF_SHOW_MAX + 4];
	size_t t_cap = 0, o_cap = 0;
	struct gguf_str dup;
	uint64_t i;
	int ret;

	for (i = 0; i < n_tensors; i++) {
		if (grow((void **)&f->tensors, &t_cap, f->n_tensors, sizeof(*f->tensors), n_tensors) ||
		    grow((void **)offs, &o_cap, f->n_tensors, sizeof(**offs), n_tensors))
			return fail(r, -ENOMEM, "tensor #%" PRIu64 ": out of memory", i);
		memset(&f->tensors[i], 0, sizeof(*f->tensors));
		f->n_tensors++;
		ret = rd_tensor(r, &f->tensors[i], &(*offs)[i], f->alignment, i);
		if (ret)
			return ret;
	}
	ret = find_dup(f->tensors, sizeof(*f->tensors), f->n_tensors, &dup);
	if (ret < 0)
		return fail(r, ret, "tensors: out of memory");
	if (ret)
		return fail(r, -EINVAL, "tensor '%s': appears more than once", show(name, dup));
	return 0;
}

/* Point each tensor at its data, which must lie inside the file. */
static int place_data(struct rd *r, struct gguf_file *f, const uint64_t *offs)
{
	char name[GGUF_SHOW_MAX + 4];
	size_t data_start;
	uint64_t i;

	/* the data section starts at the next multiple of the alignment */
	data_start = r->pos + (f->alignment - r->pos % f->alignment) % f->alignment;
	if (data_start < r->pos || data_start > r->size)
		return fail(r, -EINVAL, "tensor '%s': data section would start at %zu, past end of file (%zu bytes)",
			    show(name, f->tensors[0].name), data_start, r->size);
	for (i = 0; i < f->n_tensors; i++) {
		struct gguf_tensor *t = &f->tensors[i];
		size_t room = r->size - data_start;

		if (offs[i] > room || t->size > room - offs[i]) {
			uint64_t beg = offs[i] + data_start, end;

			if (beg < offs[i] || __builtin_add_overflow(beg, t->size, &end))
				end = UINT64_MAX;
			if (beg < offs[i])
				beg = UINT64_MAX;
			return fail(r, -EINVAL, "tensor '%s': data [%" PRIu64 ", %" PRIu64 ") extends past end of file (%zu bytes)",
				    show(name, t->name), beg, end, r->size);
		}
		t->data = r->base + data_start + offs[i];
	}
	return 0;
}

/* A tensor's bytes in the data section, for no_overlap(). */
struct span {
	uint64_t beg, end;
	uint64_t idx;
};

static int span_cmp(const void *a, const void *b)
{
	const struct span *x = a, *y = b;
	return x->beg < y->beg ? -1 : x->beg > y->beg;
}

/*
 * No two tensors share bytes: a file whose tensors overlap is no file any
 * writer makes, and one tensor's bytes read as another's type are garbage
 * (NaNs in the kernels) rather than a model.
 */
static int no_overlap(struct rd *r, struct gguf_file *f, const uint64_t *offs)
{
	char a[GGUF_SHOW_MAX + 4], b[GGUF_SHOW_MAX + 4];
	struct span *v = malloc((size_t)f->n_tensors * sizeof(*v));
	if (!v)
		return fail(r, -ENOMEM, "out of memory checking tensor placement");
	size_t n = 0;
	for (uint64_t i = 0; i < f->n_tensors; i++)
		if (f->tensors[i].size)
			v[n++] = (struct span){ offs[i], offs[i] + f->tensors[i].size, i };
	qsort(v, n, sizeof(*v), span_cmp);
	int ret = 0;
	for (size_t i = 1; i < n && !ret; i++)
		if (v[i].beg < v[i - 1].end)
			ret = fail(r, -EINVAL, "tensors '%s' and '%s' overlap in the data section",
				   show(a, f->tensors[v[i - 1].idx].name), show(b, f->tensors[v[i].idx].name));
	free(v);
	return ret;
}

static int parse(struct rd *r, struct gguf_file *f)
{
	uint64_t n_kv = 0, n_tensors = 0, *offs = NULL;
	int ret;

	ret = rd_header(r, f, &n_kv, &n_tensors);
	if (!ret)
		ret = rd_kvs(r, f, n_kv);
	if (!ret)
		ret = rd_alignment(r, f, &f->alignment);
	if (!ret)
		ret = rd_tensors(r, f, n_tensors, &offs);
	if (!ret && f->n_tensors)
		ret = place_data(r, f, offs);
	if (!ret && f->n_tensors)
		ret = no_overlap(r, f, offs);
	free(offs);
	return ret;
}

static void release(struct gguf_priv *p)
{
	uint64_t i;

	for (i = 0; i < p->f.n_kv; i++)
		free(p->f.kv[i].strs);
	free(p->f.kv);
	free(p->f.tensors);
	if (p->mapped)
		munmap((void *)p->f.base, p->f.size);
	free(p);
}

static int open_common(struct gguf_file **out, const void *buf, size_t size,
		       bool mapped, char *err, size_t errlen)
{
	struct rd r = { .base = buf, .size = size, .err = err, .errlen = errlen };
	struct gguf_priv *p;
	int ret;

	p = calloc(1, sizeof(*p));
	if (!p) {
		if (mapped)
			munmap((void *)buf, size);
		return fail(&r, -ENOMEM, "out of memory");
	}
	p->f.base = buf;
	p->f.size = size;
	p->mapped = mapped;
	ret = parse(&r, &p->f);
	if (ret) {
		release(p);
		return ret;
	}
	*out = &p->f;
	return 0;
}

int gguf_open_mem(struct gguf_file **out, const void *buf, size_t size,
		  char *err, size_t errlen)
{
	struct rd r = { .err = err, .errlen = errlen };

	*out = NULL;
	if (!buf && size)
		return fail(&r, -EINVAL, "NULL buffer of %zu bytes", size);
	if (err && errlen)
		err[0] = '\0';
	/* a NULL empty buffer is just a too-short file */
	return open_common(out, buf ? buf : "", size, false, err, errlen);
}

/* Whether someone other than this process's user may change the file under a mapping. */
static bool writable_by_others(const struct stat *st)
{
	return (st->st_mode & (S_IWGRP | S_IWOTH)) || st->st_uid != geteuid();
}

/* The file's bytes in private anonymous memory (read-only after); MAP_FAILED with errno set. */
static void *read_private(int fd, size_t size)
{
	uint8_t *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return MAP_FAILED;
	for (size_t at = 0; at < size;) {
		ssize_t n = pread(fd, p + at, size - at, (off_t)at);
		if (n <= 0) {
			int e = n < 0 ? errno : EIO;	/* shorter than it was: changed while read */
			munmap(p, size);
			errno = e;
			return MAP_FAILED;
		}
		at += (size_t)n;
	}
	mprotect(p, size, PROT_READ);
	return p;
}

int gguf_open(struct gguf_file **out, const char *path, char *err, size_t errlen)
{
	struct rd r = { .err = err, .errlen = errlen };
	struct stat st;
	void *map;
	int fd, ret;

	*out = NULL;
	if (err && errlen)
		err[0] = '\0';
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		ret = -errno;
		return fail(&r, ret, "open '%s': %s", path, strerror(-ret));
	}
	if (fstat(fd, &st)) {
		ret = -errno;
		fail(&r, ret, "stat '%s': %s", path, strerror(-ret));
		goto err_close;
	}
	if (!S_ISREG(st.st_mode)) {
		ret = fail(&r, -EINVAL, "'%s' is not a regular file", path);
		goto err_close;
	}
	if (st.st_size < GGUF_HDR_BYTES) {
		ret = fail(&r, -EINVAL, "header: '%s' is %jd bytes, smaller than a GGUF header (%d)",
			   path, (intmax_t)st.st_size, GGUF_HDR_BYTES);
		goto err_close;
	}
	if ((uintmax_t)st.st_size > SIZE_MAX) {
		ret = fail(&r, -EFBIG, "'%s' is too large to map", path);
		goto err_close;
	}
	bool copy = writable_by_others(&st);
	map = copy ? read_private(fd, (size_t)st.st_size) :
		     mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (map == MAP_FAILED) {
		ret = -errno;
		fail(&r, ret, "%s '%s': %s", copy ? "read" : "mmap", path, strerror(-ret));
		goto err_close;
	}
	close(fd);
	ret = open_common(out, map, (size_t)st.st_size, true, err, errlen);
	if (!ret)
		(*out)->copied = copy;
	return ret;

err_close:
	close(fd);
	return ret;
}

void gguf_close(struct gguf_file *f)
{
	if (f)
		release((struct gguf_priv *)((char *)f - offsetof(struct gguf_priv, f)));
}
