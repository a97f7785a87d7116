/* gguf_patch.h — a copy of a GGUF file with one integer metadata value changed, for tests. */
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

#include <stdint.h>

/*
 * Copy src to dst (created or truncated, mode 0644) and set key's integer
 * value to value. 0, -ENOENT when the key is not in the file, -EINVAL when
 * its type is not an integer or value does not fit it, or -errno.
 */
int gguf_patch_int(const char *src, const char *dst, const char *key, uint64_t value);

#endif
