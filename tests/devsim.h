/* devsim.h — for tests: the CPU backend dressed as a device (its own buffers, explicit copies, recorded steps). */
#ifndef KVD_TESTS_DEVSIM_H
#define KVD_TESTS_DEVSIM_H

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/backend.h"

/*
 * Buffers are separate allocations filled with garbage, imports are copies,
 * and every byte moves through upload/download/copy, so an engine that
 * hands it a host pointer, forgets an upload or reads a buffer on the host
 * computes garbage. The compute itself is the CPU backend's, so results
 * must equal the CPU's bit for bit. Steps whose key repeats are "recorded":
 * with fail_record set, every recording fails with -EAGAIN (as a device
 * does when scratch must grow) and the engine must rerun the step.
 */
struct devsim {
	struct backend base;
	struct backend *cpu;
	struct backend_ops ops;
	uint64_t last_key;
	int recording;
	int fail_record;
	unsigned records, reruns, uploads, downloads, copies, imports, live_bufs;
};

#define DS(b) ((struct devsim *)(b))
#define DS_CPU(b) (DS(b)->cpu)

static int ds_matmul(struct backend *b, float *y, const struct kb_weight *w, const float *x,
		     uint32_t n)
{
	return DS_CPU(b)->ops->matmul(DS_CPU(b), y, w, x, n);
}

static int ds_matmul_multi(struct backend *b, float *const *y, const struct kb_weight *const *w,
			   uint32_t count, const float *x, uint32_t n)
{
	return DS_CPU(b)->ops->matmul_multi(DS_CPU(b), y, w, count, x, n);
}

static int ds_get_rows(struct backend *b, float *out, const struct kb_weight *w,
		       const uint32_t *ids, uint32_t n)
{
	return DS_CPU(b)->ops->get_rows(DS_CPU(b), out, w, ids, n);
}

static int ds_rmsnorm(struct backend *b, float *out, const float *x, const float *g, uint32_t n,
		      uint32_t dim, float eps)
{
	return DS_CPU(b)->ops->rmsnorm(DS_CPU(b), out, x, g, n, dim, eps);
}

static int ds_rope(struct backend *b, float *x, const uint32_t *pos, uint32_t n, uint32_t nh,
		   uint32_t hd, const struct kb_rope *rope)
{
	return DS_CPU(b)->ops->rope(DS_CPU(b), x, pos, n, nh, hd, rope);
}

static int ds_swiglu(struct backend *b, float *out, const float *g, const float *u, uint32_t n,
		     uint32_t dim)
{
	return DS_CPU(b)->ops->swiglu(DS_CPU(b), out, g, u, n, dim);
}

static int ds_add(struct backend *b, float *x, const float *y, uint32_t n, uint32_t dim)
{
	return DS_CPU(b)->ops->add(DS_CPU(b), x, y, n, dim);
}

static int ds_write_kv_rows(struct backend *b, const struct kb_kv_rows *kv, const uint32_t *pos,
			    uint32_t n, uint32_t kv_dim, const float *k, const float *v)
{
	return DS_CPU(b)->ops->write_kv_rows(DS_CPU(b), kv, pos, n, kv_dim, k, v);
}

static int ds_attention_rows(struct backend *b, float *out, const float *q,
			     const struct kb_kv_rows *kv, const uint32_t *pos, uint32_t n,
			     const struct kb_attn_shape *sh)
{
	return DS_CPU(b)->ops->attention_rows(DS_CPU(b), out, q, kv, pos, n, sh);
}

static int ds_add_rmsnorm(struct backend *b, float *out, float *x, const float *y, const float *g,
			  uint32_t n, uint32_t dim, float eps)
{
	return DS_CPU(b)->ops->add_rmsnorm(DS_CPU(b), out, x, y, g, n, dim, eps);
}

static int ds_argmax(struct backend *b, uint32_t *ids, const float *x, uint32_t n, uint32_t dim)
{
	return DS_CPU(b)->ops->argmax(DS_CPU(b), ids, x, n, dim);
}

static int ds_add_bias(struct backend *b, float *x, const float *bias, uint32_t n, uint32_t dim)
{
	return DS_CPU(b)->ops->add_bias(DS_CPU(b), x, bias, n, dim);
}

static int ds_scale(struct backend *b, float *x, float s, uint32_t n, uint32_t dim)
{
	return DS_CPU(b)->ops->scale(DS_CPU(b), x, s, n, dim);
}

static int ds_softcap(struct backend *b, float *x, float cap, uint32_t n, uint32_t dim)
{
	return DS_CPU(b)->ops->softcap(DS_CPU(b), x, cap, n, dim);
}

static int ds_geglu(struct backend *b, float *out, const float *g, const float *u, uint32_t n,
		    uint32_t dim)
{
	return DS_CPU(b)->ops->geglu(DS_CPU(b), out, g, u, n, dim);
}

static int ds_buf_alloc(struct backend *b, void **out, size_t bytes)
{
	void *p = malloc(bytes ? bytes : 1);
	if (!p)
		return -ENOMEM;
	memset(p, 0xa5, bytes);	/* garbage: nothing may be read before it is written */
	DS(b)->live_bufs++;
	*out = p;
	return 0;
}

static void ds_buf_free(struct backend *b, void *p)
{
	if (p)
		DS(b)->live_bufs--;
	free(p);
}

static int ds_upload(struct backend *b, void *dst, const void *src, size_t bytes)
{
	DS(b)->uploads++;
	memmove(dst, src, bytes);
	return 0;
}

static int ds_download(struct backend *b, void *dst, const void *src, size_t bytes)
{
	DS(b)->downloads++;
	memmove(dst, src, bytes);
	return 0;
}

static int ds_copy(struct backend *b, void *dst, const void *src, size_t bytes)
{
	DS(b)->copies++;
	memmove(dst, src, bytes);
	return 0;
}

static int ds_import(struct backend *b, const void **out, const void *src, size_t bytes)
{
	void *p;
	int rc = ds_buf_alloc(b, &p, bytes);
	if (rc)
		return rc;
	memcpy(p, src, bytes);
	DS(b)->imports++;
	*out = p;
	return 0;
}

static void ds_unimport(struct backend *b, const void *p)
{
	ds_buf_free(b, (void *)p);
}

static int ds_step_begin(struct backend *b, uint64_t key)
{
	struct devsim *d = DS(b);
	d->recording = key && key == d->last_key;
	if (key)
		d->last_key = key;
	else
		d->reruns++;
	return 0;
}

static int ds_step_end(struct backend *b, int rc)
{
	struct devsim *d = DS(b);
	if (!d->recording)
		return rc;
	d->recording = 0;
	d->records++;
	return !rc && d->fail_record ? -EAGAIN : rc;
}

static void ds_destroy(struct backend *b)
{
	struct devsim *d = DS(b);
	d->cpu->ops->destroy(d->cpu);
	free(d);
}

static int devsim_create(struct backend **out, uint32_t n_threads)
{
	struct devsim *d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	int rc = backend_cpu_create(&d->cpu, n_threads);
	if (rc) {
		free(d);
		return rc;
	}
	d->ops = (struct backend_ops){
		.name = "devsim", .destroy = ds_destroy, .matmul = ds_matmul,
		.matmul_multi = ds_matmul_multi, .get_rows = ds_get_rows, .rmsnorm = ds_rmsnorm,
		.rope = ds_rope, .swiglu = ds_swiglu, .add = ds_add,
		.write_kv_rows = ds_write_kv_rows,
		.attention_rows = ds_attention_rows, .add_rmsnorm = ds_add_rmsnorm,
		.argmax = ds_argmax, .buf_alloc = ds_buf_alloc, .buf_free = ds_buf_free,
		.upload = ds_upload, .download = ds_download, .copy = ds_copy, .import = ds_import,
		.unimport = ds_unimport, .step_begin = ds_step_begin, .step_end = ds_step_end,
		.add_bias = ds_add_bias, .scale = ds_scale, .softcap = ds_softcap,
		.geglu = ds_geglu,
	};
	d->base.ops = &d->ops;
	d->base.n_threads = d->cpu->n_threads;
	d->base.host_mem = 0;
	*out = &d->base;
	return 0;
}

#endif
