/* gguf.h — validated, mmap'd reader of GGUF v2/v3 model files. */
#ifndef KVD_GGUF_H
#define KVD_GGUF_H

#include <stddef.h>
#include <stdint.h>
#include "kernels/backend.h"

/* GGUF metadata value types (numbering fixed by the file format). */
enum gguf_vtype {
	GGUF_VT_U8 = 0, GGUF_VT_I8 = 1, GGUF_VT_U16 = 2, GGUF_VT_I16 = 3,
	GGUF_VT_U32 = 4, GGUF_VT_I32 = 5, GGUF_VT_F32 = 6, GGUF_VT_BOOL = 7,
	GGUF_VT_STRING = 8, GGUF_VT_ARRAY = 9, GGUF_VT_U64 = 10,
	GGUF_VT_I64 = 11, GGUF_VT_F64 = 12, GGUF_VT_LAST
};

/*
 * Tensor element types (ggml numbering): the ones kvd computes with are
 * enum kb_type's, passed through to the backends as they are; kb_type_block()
 * and kb_type_name() give their block geometry and names.
 */
enum gguf_ttype {
	GGUF_T_F32 = KB_F32, GGUF_T_F16 = KB_F16, GGUF_T_Q4_0 = KB_Q4_0, GGUF_T_Q4_1 = KB_Q4_1,
	GGUF_T_Q8_0 = KB_Q8_0, GGUF_T_Q4_K = KB_Q4_K, GGUF_T_Q6_K = KB_Q6_K, GGUF_T_BF16 = KB_BF16,
	GGUF_T_LAST = 40	/* above every ggml type, for tables indexed by type */
};

/* A string inside the mapping: not NUL-terminated. */
struct gguf_str {
	const char *ptr;
	uint64_t len;
};

struct gguf_kv {
	struct gguf_str key;
	uint32_t type;		/* enum gguf_vtype */
	uint32_t arr_type;	/* element type when type == GGUF_VT_ARRAY */
	uint64_t arr_len;	/* elements when type == GGUF_VT_ARRAY */
	const void *data;	/* scalar value, or first array element, in the mapping */
	struct gguf_str *strs;	/* (arr_len,) index of a string array, else NULL */
};

struct gguf_tensor {
	struct gguf_str name;
	uint32_t type;		/* enum gguf_ttype */
	uint32_t n_dims;	/* 1..4 */
	uint64_t ne[4];		/* ne[0] is the contiguous (row) dimension; unused = 1 */
	uint64_t n_elems;
	uint64_t size;		/* bytes, from the type's block size */
	const void *data;	/* inside the mapping, aligned */
};

struct gguf_file {
	uint32_t version;
	uint64_t n_kv;
	struct gguf_kv *kv;		/* (n_kv,) */
	uint64_t n_tensors;
	struct gguf_tensor *tensors;	/* (n_tensors,) */
	uint64_t alignment;
	const uint8_t *base;		/* the whole mapping */
	size_t size;
	int copied;			/* read into private memory, not mapped: see gguf_open() */
};

/*
 * Map and validate the file at path. A file that anyone but this process's
 * user may write (group or other write bits, or another owner) is read
 * into private memory instead (f->copied): a mapping would die of SIGBUS
 * when they truncate it. Every count, string, offset, size and
 * alignment is checked before use; on failure returns -errno (-EINVAL for
 * malformed content, -ENOTSUP for an unknown tensor type) and writes a
 * message naming the offending key or tensor into err. *out is freed with
 * gguf_close().
 */
int gguf_open(struct gguf_file **out, const char *path, char *err, size_t errlen);
/* Same, over a caller-owned buffer that must outlive the gguf_file. */
int gguf_open_mem(struct gguf_file **out, const void *buf, size_t size,
		  char *err, size_t errlen);
void gguf_close(struct gguf_file *f);

const struct gguf_kv *gguf_find_kv(const struct gguf_file *f, const char *key);
const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name);

/*
 * Typed getters: return 0 and store the value, -ENOENT if the key is absent,
 * -EINVAL if it has another type. Integer getters accept any integer type
 * whose value fits.
 */
int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out);
int gguf_get_f32(const struct gguf_file *f, const char *key, float *out);
int gguf_get_bool(const struct gguf_file *f, const char *key, int *out);
int gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *out);
/* Array getters: element type must match; *n receives the length. */
int gguf_get_arr(const struct gguf_file *f, const char *key, uint32_t elem_type,
		 const void **data, uint64_t *n);
/*
 * String arrays are length-prefixed in the file; the reader indexes them at
 * open time. Returns the i-th string of a GGUF_VT_STRING array kv.
 */
struct gguf_str gguf_arr_str(const struct gguf_kv *kv, uint64_t i);

#endif
