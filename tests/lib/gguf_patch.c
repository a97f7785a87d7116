/* gguf_patch.c — copy a GGUF file and overwrite one integer metadata value (gguf_patch.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "daemon/model/gguf.h"
#include "tests/lib/gguf_patch.h"

/* GGUF value types (daemon/model/gguf.h numbers them the same way, from the spec). */
enum { VT_U8 = 0, VT_I8 = 1, VT_U16 = 2, VT_I16 = 3, VT_U32 = 4, VT_I32 = 5, VT_U64 = 10, VT_I64 = 11 };

static int copy_fd(int in, int out, off_t len)
{
	off_t done = 0;
	while (done < len) {
		ssize_t n = copy_file_range(in, NULL, out, NULL, (size_t)(len - done), 0);
		if (n < 0 && (errno == EXDEV || errno == ENOSYS || errno == EINVAL)) {
			char buf[1 << 16];
			n = pread(in, buf, sizeof(buf), done);
			if (n > 0 && pwrite(out, buf, (size_t)n, done) != n)
				return -EIO;
		}
		if (n < 0)
			return -errno;
		if (n == 0)
			return -EIO;
		done += n;
	}
	return 0;
}

/* Width of an integer type and the largest value it holds; 0 for any other type. */
static size_t int_width(uint32_t type, uint64_t *max)
{
	switch (type) {
	case VT_U8: *max = UINT8_MAX; return 1;
	case VT_I8: *max = INT8_MAX; return 1;
	case VT_U16: *max = UINT16_MAX; return 2;
	case VT_I16: *max = INT16_MAX; return 2;
	case VT_U32: *max = UINT32_MAX; return 4;
	case VT_I32: *max = INT32_MAX; return 4;
	case VT_U64: *max = UINT64_MAX; return 8;
	case VT_I64: *max = INT64_MAX; return 8;
	default: return 0;
	}
}

int gguf_patch_int(const char *src, const char *dst, const char *key, uint64_t value)
{
	int rc = 0;
	int in = open(src, O_RDONLY | O_CLOEXEC);
	if (in < 0)
		return -errno;
	struct stat st;
	if (fstat(in, &st)) {
		rc = -errno;
		close(in);
		return rc;
	}
	int out = open(dst, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (out < 0) {
		rc = -errno;
		close(in);
		return rc;
	}
	rc = copy_fd(in, out, st.st_size);
	close(in);
	uint8_t *p = MAP_FAILED;
	if (!rc) {
		p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, out, 0);
		if (p == MAP_FAILED)
			rc = -errno;
	}
	if (!rc) {
		/* The key as the file spells it: a u64 length (little-endian), then its bytes. */
		uint8_t pat[8 + 256];
		uint64_t klen = strlen(key);
		if (klen > 256) {
			rc = -EINVAL;
			goto out;
		}
		for (int i = 0; i < 8; i++)
			pat[i] = (uint8_t)(klen >> (8 * i));
		memcpy(pat + 8, key, klen);
		uint8_t *k = memmem(p, (size_t)st.st_size, pat, 8 + klen);
		if (!k || k + 8 + klen + 4 + 8 > p + st.st_size) {
			rc = -ENOENT;
			goto out;
		}
		uint8_t *v = k + 8 + klen;
		uint32_t type = (uint32_t)v[0] | (uint32_t)v[1] << 8 | (uint32_t)v[2] << 16 |
				(uint32_t)v[3] << 24;
		uint64_t max;
		size_t w = int_width(type, &max);
		if (!w || value > max) {
			rc = -EINVAL;
			goto out;
		}
		for (size_t i = 0; i < w; i++)
			v[4 + i] = (uint8_t)(value >> (8 * i));
		if (msync(p, (size_t)st.st_size, MS_SYNC))
			rc = -errno;
	}
out:
	if (p != MAP_FAILED)
		munmap(p, (size_t)st.st_size);
	close(out);
	if (rc)
		unlink(dst);
	return rc;
}

void w_bytes(struct wbuf *w, const void *d, size_t n)
{
	if (w->len + n > w->cap) {
		w->cap = (w->len + n) * 2 + 64;
		w->p = realloc(w->p, w->cap);
		if (!w->p)
			abort();
	}
	memcpy(w->p + w->len, d, n);
	w->len += n;
}

void w_u8(struct wbuf *w, uint8_t v) { w_bytes(w, &v, 1); }
void w_u32(struct wbuf *w, uint32_t v) { w_bytes(w, &v, 4); }
void w_u64(struct wbuf *w, uint64_t v) { w_bytes(w, &v, 8); }

void w_str(struct wbuf *w, const char *s)
{
	w_u64(w, strlen(s));
	w_bytes(w, s, strlen(s));
}

void w_key(struct wbuf *w, const char *key, uint32_t type)
{
	w_str(w, key);
	w_u32(w, type);
}

void w_pad(struct wbuf *w, size_t align)
{
	while (align && w->len % align)
		w_u8(w, 0);
}

static void put_kv(struct wbuf *b, const struct gguf_add_kv *kv)
{
	w_key(b, kv->key, kv->type);
	if (kv->type == GGUF_VT_STRING)
		w_str(b, kv->str);
	else if (kv->type == GGUF_VT_F32)
		w_bytes(b, &kv->f32, 4);
	else
		w_u32(b, kv->u32);
}

/* Where the tensor infos begin and end in f's mapping (they follow the metadata). */
static void info_span(const struct gguf_file *f, size_t *start, size_t *end)
{
	*start = f->size;
	*end = 24;
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		const struct gguf_tensor *t = &f->tensors[i];
		size_t at = (size_t)((const uint8_t *)t->name.ptr - f->base);
		size_t e = at + t->name.len + 4 + 8 * t->n_dims + 4 + 8;
		if (at - 8 < *start)
			*start = at - 8;
		if (e > *end)
			*end = e;
	}
}

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* The whole new file, in b: f's header, metadata, infos and data with the additions. */
static void build_extended(struct wbuf *b, const struct gguf_file *f, const struct gguf_add_kv *kv,
			   int n_kv, const char *tensor, uint64_t n_elems)
{
	size_t info0, info1;
	info_span(f, &info0, &info1);
	size_t data0 = (size_t)align_up(info1, f->alignment);
	w_bytes(b, "GGUF", 4);
	w_u32(b, f->version);
	w_u64(b, f->n_tensors + (tensor != NULL));
	w_u64(b, f->n_kv + (uint64_t)n_kv);
	w_bytes(b, f->base + 24, info0 - 24);
	for (int i = 0; i < n_kv; i++)
		put_kv(b, &kv[i]);
	w_bytes(b, f->base + info0, info1 - info0);
	if (tensor) {
		w_str(b, tensor);
		w_u32(b, 1);
		w_u64(b, n_elems);
		w_u32(b, GGUF_T_F32);
		w_u64(b, align_up(f->size - data0, f->alignment));
	}
	w_pad(b, f->alignment);
	w_bytes(b, f->base + data0, f->size - data0);
	if (tensor) {
		w_pad(b, f->alignment);
		for (uint64_t i = 0; i < n_elems; i++)
			w_bytes(b, &(float){ 1.0f }, 4);
	}
}

int gguf_extend(const char *src, const char *dst, const struct gguf_add_kv *kv, int n_kv,
		const char *tensor, uint64_t n_elems)
{
	struct gguf_file *f;
	char err[256];
	int rc = gguf_open(&f, src, err, sizeof(err));
	if (rc)
		return rc;
	struct wbuf b = { 0 };
	build_extended(&b, f, kv, n_kv, tensor, n_elems);
	gguf_close(f);
	int out = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (out < 0)
		rc = -errno;
	for (size_t done = 0; !rc && done < b.len;) {
		ssize_t n = write(out, b.p + done, b.len - done);
		if (n <= 0)
			rc = n < 0 ? -errno : -EIO;
		else
			done += (size_t)n;
	}
	if (out >= 0 && close(out) && !rc)
		rc = -errno;
	if (rc && out >= 0)
		unlink(dst);
	free(b.p);
	return rc;
}
