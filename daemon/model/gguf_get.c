/* gguf_get.c — lookups and typed getters over a parsed GGUF file. */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include "daemon/model/gguf.h"
#include "daemon/model/gguf_int.h"

const struct gguf_kv *gguf_find_kv(const struct gguf_file *f, const char *key)
{
	size_t len;
	uint64_t i;

	if (!f || !key)
		return NULL;
	len = strlen(key);
	for (i = 0; i < f->n_kv; i++)
		if (f->kv[i].key.len == len && !memcmp(f->kv[i].key.ptr, key, len))
			return &f->kv[i];
	return NULL;
}

const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name)
{
	size_t len;
	uint64_t i;

	if (!f || !name)
		return NULL;
	len = strlen(name);
	for (i = 0; i < f->n_tensors; i++)
		if (f->tensors[i].name.len == len && !memcmp(f->tensors[i].name.ptr, name, len))
			return &f->tensors[i];
	return NULL;
}

/* Any integer kv as a u64; -EINVAL for other types and negative values. */
static int kv_uint(const struct gguf_kv *kv, uint64_t *v)
{
	const void *p = kv->data;
	int64_t s;

	switch (kv->type) {
	case GGUF_VT_U8:  *v = *(const uint8_t *)p; return 0;
	case GGUF_VT_U16: { uint16_t x; memcpy(&x, p, 2); *v = x; return 0; }
	case GGUF_VT_U32: *v = ld_u32(p); return 0;
	case GGUF_VT_U64: *v = ld_u64(p); return 0;
	case GGUF_VT_I8:  s = *(const int8_t *)p; break;
	case GGUF_VT_I16: { int16_t x; memcpy(&x, p, 2); s = x; break; }
	case GGUF_VT_I32: { int32_t x; memcpy(&x, p, 4); s = x; break; }
	case GGUF_VT_I64: memcpy(&s, p, 8); break;
	default:
		return -EINVAL;
	}
	if (s < 0)
		return -EINVAL;
	*v = (uint64_t)s;
	return 0;
}

int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out)
{
	const struct gguf_kv *kv = gguf_find_kv(f, key);
	uint64_t v;

	if (!kv)
		return -ENOENT;
	if (kv_uint(kv, &v) || v > UINT32_MAX)
		return -EINVAL;
	*out = (uint32_t)v;
	return 0;
}

int gguf_get_f32(const struct gguf_file *f, const char *key, float *out)
{
	const struct gguf_kv *kv = gguf_find_kv(f, key);

	if (!kv)
		return -ENOENT;
	if (kv->type == GGUF_VT_F32) {
		memcpy(out, kv->data, sizeof(*out));
		return 0;
	}
	if (kv->type == GGUF_VT_F64) {
		double d;

		memcpy(&d, kv->data, sizeof(d));
		*out = (float)d;
		return 0;
	}
	return -EINVAL;
}

int gguf_get_bool(const struct gguf_file *f, const char *key, int *out)
{
	const struct gguf_kv *kv = gguf_find_kv(f, key);

	if (!kv)
		return -ENOENT;
	if (kv->type != GGUF_VT_BOOL)
		return -EINVAL;
	*out = *(const uint8_t *)kv->data != 0;
	return 0;
}

int gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *out)
{
	const struct gguf_kv *kv = gguf_find_kv(f, key);

	if (!kv)
		return -ENOENT;
	if (kv->type != GGUF_VT_STRING)
		return -EINVAL;
	out->len = ld_u64(kv->data);
	out->ptr = (const char *)kv->data + 8;
	return 0;
}

int gguf_get_arr(const struct gguf_file *f, const char *key, uint32_t elem_type,
		 const void **data, uint64_t *n)
{
	const struct gguf_kv *kv = gguf_find_kv(f, key);

	if (!kv)
		return -ENOENT;
	if (kv->type != GGUF_VT_ARRAY || kv->arr_type != elem_type)
		return -EINVAL;
	if (data)
		*data = kv->data;
	if (n)
		*n = kv->arr_len;
	return 0;
}

struct gguf_str gguf_arr_str(const struct gguf_kv *kv, uint64_t i)
{
	struct gguf_str none = { NULL, 0 };

	if (!kv || !kv->strs || i >= kv->arr_len)
		return none;
	return kv->strs[i];
}
