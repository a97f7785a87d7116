/* gguf_patch.h — a copy of a GGUF file with one integer metadata value changed, or keys and a tensor added, for tests. */
/*
 * A test that needs a model with other hyperparameters (a short context,
 * say) copies the real one and overwrites the value of one key in place:
 * the key's string (u64 length, bytes) is found in the file, then its
 * value type (u32) and the value after it, as daemon/model/gguf.c reads
 * them. Only integer types (u8..u64, i8..i64) are patched, and only with
 * a value that fits the type.
 */
#ifndef KVD_TESTS_LIB_GGUF_PATCH_H
#define KVD_TESTS_LIB_GGUF_PATCH_H

#include <stddef.h>
#include <stdint.h>

/*
 * Copy src to dst (created or truncated, mode 0644) and set key's integer
 * value to value. 0, -ENOENT when the key is not in the file, -EINVAL when
 * its type is not an integer or value does not fit it, or -errno.
 */
int gguf_patch_int(const char *src, const char *dst, const char *key, uint64_t value);

/*
 * A GGUF file written byte by byte, as a converter writes one: little-endian
 * integers, length-prefixed strings, keys with their value type. The
 * buffer grows as needed (a test aborts if it cannot); free w->p after.
 */
struct wbuf {
	uint8_t *p;
	size_t len, cap;
};
void w_bytes(struct wbuf *w, const void *d, size_t n);
void w_u8(struct wbuf *w, uint8_t v);
void w_u32(struct wbuf *w, uint32_t v);
void w_u64(struct wbuf *w, uint64_t v);
void w_str(struct wbuf *w, const char *s);
void w_key(struct wbuf *w, const char *key, uint32_t type);
/* Zero bytes up to the next multiple of align (0: none). */
void w_pad(struct wbuf *w, size_t align);

/* A metadata entry to add: type is GGUF_VT_STRING (str), GGUF_VT_U32 (u32) or GGUF_VT_F32 (f32). */
struct gguf_add_kv {
	const char *key;
	uint32_t type;
	const char *str;
	uint32_t u32;
	float f32;
};

/*
 * Copy src to dst with n_kv entries added after its own and, when tensor is
 * not NULL, one more 1-D F32 tensor of that name and n_elems ones after the
 * file's last: what a converter that knows more than kvd would write. The
 * file is parsed with daemon/model/gguf.c, so src must be valid. 0, or
 * -errno (dst removed).
 */
int gguf_extend(const char *src, const char *dst, const struct gguf_add_kv *kv, int n_kv,
		const char *tensor, uint64_t n_elems);

#endif
