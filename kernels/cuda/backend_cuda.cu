/* backend_cuda.cu — the CUDA backend: the vtable, device memory, scratch, and CUDA graphs of decode steps. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cublas_v2.h>
#include "kernels/cuda/argmax.cuh"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/eltwise.cuh"
#include "kernels/cuda/geglu.cuh"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/hostcheck.h"
#include "kernels/cuda/kvcache.cuh"
#include "kernels/cuda/matvec.cuh"
#include "kernels/cuda/norm.cuh"
#include "kernels/cuda/plan.h"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/swiglu.cuh"

#define BLAS_WORKSPACE (32u << 20)

/* A device buffer that only grows; it may not grow while a step is being recorded. */
struct scratch {
	void *p;
	size_t cap;
};

struct cuda_backend {
	struct backend base;
	int dev;
	uint32_t n_sms;
	cudaStream_t stream;
	cublasHandle_t blas;
	void *blas_ws;
	struct scratch wdeq;	/* (rows, cols) f16: a weight dequantized for the GEMM */
	struct scratch xh;	/* (n, cols) f16: activations for the GEMM */
	struct scratch part;	/* attention split partials */
	struct scratch ids;	/* argmax results */
	/* CUDA graphs: a step whose shape key repeats the previous one is recorded and replayed. */
	int graphs;		/* 0 when KVD_CUDA_GRAPHS=0: every step runs unrecorded */
	uint64_t last_key;
	int capturing;
	cudaGraphExec_t exec;
};

#define CU(b) ((struct cuda_backend *)(b))

extern "C" int cuda_fail(const char *call, const char *file, int line, const char *what)
{
	fprintf(stderr, "kvd: cuda: %s failed at %s:%d: %s\n", call, file, line, what);
	return -EIO;
}

static int grow(struct cuda_backend *cb, struct scratch *s, size_t bytes)
{
	if (bytes <= s->cap)
		return 0;
	/* No allocation inside a recording: the step is run again unrecorded, which grows it. */
	if (cb->capturing)
		return -EAGAIN;
	size_t cap = bytes + bytes / 4;
	if (s->p) {
		CK(cudaStreamSynchronize(cb->stream));
		CK(cudaFree(s->p));
		s->p = NULL;
		s->cap = 0;
	}
	CK(cudaMalloc(&s->p, cap));
	s->cap = cap;
	return 0;
}

/* ---- matmul ---- */

static int gemm_one(struct cuda_backend *cb, float *y, const struct kb_weight *w, const float *x,
		    const void *xh, uint32_t n)
{
	if (w->type == KB_F32)
		return cuda_gemm(cb->blas, y, w->data, x, w->rows, w->cols, n, 0);
	const void *wf = w->data;
	if (w->type != KB_F16) {
		int rc = grow(cb, &cb->wdeq, (size_t)w->rows * w->cols * 2);
		if (rc)
			return rc;
		rc = cuda_dequant_f16(cb->stream, cb->wdeq.p, w->data, w->type, w->rows, w->cols,
				      w->row_bytes);
		if (rc)
			return rc;
		wf = cb->wdeq.p;
	}
	return cuda_gemm(cb->blas, y, wf, xh, w->rows, w->cols, n, 1);
}

static int cu_matmul_multi(struct backend *b, float *const *y, const struct kb_weight *const *w,
			   uint32_t count, const float *x, uint32_t n)
{
	struct cuda_backend *cb = CU(b);
	if (n == 0)
		return 0;
	if (count == 0)
		return -EINVAL;
	const uint32_t cols = w[0]->cols;
	for (uint32_t i = 0; i < count; i++) {
		int rc = cuda_plan_weight(w[i]->type, w[i]->cols, w[i]->row_bytes,
					  (uintptr_t)w[i]->data);
		if (rc)
			return rc;
		if (w[i]->cols != cols)
			return -EINVAL;
	}
	if (!cuda_plan_use_gemm(n, w[0]->type)) {
		for (uint32_t i = 0; i < count; i++) {
			int rc = cuda_matvec(cb->stream, y[i], w[i]->data, w[i]->type, w[i]->rows, cols,
					     w[i]->row_bytes, x, n);
			if (rc)
				return rc;
		}
		return 0;
	}
	/* x goes to f16 once for every weight of the call. */
	int rc = grow(cb, &cb->xh, (size_t)n * cols * 2);
	if (!rc)
		rc = cuda_f32_to_f16(cb->stream, cb->xh.p, x, (size_t)n * cols);
	for (uint32_t i = 0; !rc && i < count; i++)
		rc = gemm_one(cb, y[i], w[i], x, cb->xh.p, n);
	return rc;
}

static int cu_matmul(struct backend *b, float *y, const struct kb_weight *w, const float *x,
		     uint32_t n)
{
	return cu_matmul_multi(b, &y, &w, 1, x, n);
}

static int cu_get_rows(struct backend *b, float *out, const struct kb_weight *w,
		       const uint32_t *ids, uint32_t n)
{
	int rc = cuda_plan_weight(w->type, w->cols, w->row_bytes, (uintptr_t)w->data);
	if (rc)
		return rc;
	return cuda_get_rows(CU(b)->stream, out, w->data, w->type, w->rows, w->cols, w->row_bytes,
			     ids, n);
}

/* ---- row ops ---- */

static int cu_rmsnorm(struct backend *b, float *out, const float *x, const float *g, uint32_t n,
		      uint32_t dim, float eps)
{
	return cuda_rmsnorm(CU(b)->stream, out, x, g, n, dim, eps);
}

static int cu_add_rmsnorm(struct backend *b, float *out, float *x, const float *y, const float *g,
			  uint32_t n, uint32_t dim, float eps)
{
	return cuda_add_rmsnorm(CU(b)->stream, out, x, y, g, n, dim, eps);
}

static int cu_rope(struct backend *b, float *x, const uint32_t *pos, uint32_t n, uint32_t n_heads,
		   uint32_t head_dim, const struct kb_rope *rope)
{
	if (rope->rot_dim > head_dim || rope->rot_dim % 2)
		return -EINVAL;
	if (rope->ext_factor != 0.0f && !(rope->freq_scale > 0.0f))
		return -EINVAL;
	struct cuda_rope_args a;
	a.rot_dim = rope->rot_dim;
	a.neox = rope->neox;
	/* The same powf as the CPU's table, on the host, so both walk identical angles. */
	a.step = powf(rope->theta, -2.0f / (float)rope->rot_dim);
	a.freq_scale = rope->freq_scale;
	a.ext_factor = rope->ext_factor;
	a.mscale = rope->attn_factor;
	a.corr_lo = rope->corr_lo;
	a.corr_hi = rope->corr_hi;
	a.freq_factors = rope->freq_factors;
	/* YaRN's magnitude correction, once per call, as ggml's rope_yarn computes it. */
	if (rope->ext_factor != 0.0f)
		a.mscale *= 1.0f + 0.1f * logf(1.0f / rope->freq_scale);
	return cuda_rope(CU(b)->stream, x, pos, n, n_heads, head_dim, &a);
}

static int cu_swiglu(struct backend *b, float *out, const float *gate, const float *up, uint32_t n,
		     uint32_t dim)
{
	return cuda_swiglu(CU(b)->stream, out, gate, up, (size_t)n * dim);
}

static int cu_add(struct backend *b, float *x, const float *y, uint32_t n, uint32_t dim)
{
	return cuda_add(CU(b)->stream, x, y, (size_t)n * dim);
}

/* ---- what only some architectures use ---- */

static int cu_add_bias(struct backend *b, float *x, const float *bias, uint32_t n, uint32_t dim)
{
	return cuda_add_bias(CU(b)->stream, x, bias, n, dim);
}

static int cu_scale(struct backend *b, float *x, float k, uint32_t n, uint32_t dim)
{
	return cuda_scale(CU(b)->stream, x, k, (size_t)n * dim);
}

static int cu_softcap(struct backend *b, float *x, float cap, uint32_t n, uint32_t dim)
{
	return cuda_softcap(CU(b)->stream, x, cap, (size_t)n * dim);
}

static int cu_geglu(struct backend *b, float *out, const float *gate, const float *up, uint32_t n,
		    uint32_t dim)
{
	return cuda_geglu(CU(b)->stream, out, gate, up, (size_t)n * dim);
}

/* ---- K/V and attention ---- */

static int kv_ok(const struct kb_kv_view *kv, uint32_t kv_dim)
{
	if (kv->type != KB_F32 && kv->type != KB_F16 && kv->type != KB_Q8_0)
		return -ENOTSUP;
	if (kv->block_tokens == 0 || (kv->block_tokens & (kv->block_tokens - 1)))
		return -EINVAL;
	if (kv->type == KB_Q8_0 && kv_dim % 32)
		return -EINVAL;
	return 0;
}

/* Positions checked on the host copies: the device never indexes past a table. */
static int rows_in_range(const struct kb_kv_rows *kv, uint32_t n)
{
	for (uint32_t r = 0; r < n; r++)
		if (kv->h_pos[r] >= (uint64_t)kv->h_tab_len[r] * kv->geo.block_tokens)
			return -ERANGE;
	return 0;
}

static int cu_write_kv_rows(struct backend *b, const struct kb_kv_rows *kv, const uint32_t *pos,
			    uint32_t n, uint32_t kv_dim, const float *k, const float *v)
{
	int rc = kv_ok(&kv->geo, kv_dim);
	if (!rc)
		rc = rows_in_range(kv, n);
	return rc ? rc : cuda_write_kv(CU(b)->stream, kv, pos, n, kv_dim, k, v);
}

static int cu_attention_rows(struct backend *b, float *out, const float *q,
			     const struct kb_kv_rows *kv, const uint32_t *pos, uint32_t n,
			     const struct kb_attn_shape *sh)
{
	struct cuda_backend *cb = CU(b);
	if (n == 0)
		return 0;
	if (sh->n_kv_heads == 0 || sh->n_heads % sh->n_kv_heads)
		return -EINVAL;
	int rc = kv_ok(&kv->geo, sh->n_kv_heads * sh->head_dim);
	if (!rc)
		rc = rows_in_range(kv, n);
	if (rc)
		return rc;
	uint32_t max_ctx = 0, max_rows = 0;
	for (uint32_t r = 0; r < n; r++)
		max_ctx = kv->h_pos[r] + 1 > max_ctx ? kv->h_pos[r] + 1 : max_ctx;
	for (uint32_t t = 0; t < kv->n_tiles; t++)
		max_rows = kv->h_tiles[2 * t + 1] > max_rows ? kv->h_tiles[2 * t + 1] : max_rows;
	struct cuda_attn_plan p;
	rc = cuda_plan_attention(&p, kv->n_tiles, max_rows, max_ctx, sh->n_heads, sh->n_kv_heads,
				 sh->head_dim, cb->n_sms);
	if (rc == -EINVAL)
		fprintf(stderr, "kvd: cuda: attention takes head sizes 64, 96, 128 and 256 and up to %d "
			"query heads per KV head; this model has head size %u and %u\n", CUDA_ATT_QUERIES,
			sh->head_dim, sh->n_heads / sh->n_kv_heads);
	if (!rc)
		rc = grow(cb, &cb->part, p.part_floats * sizeof(float));
	return rc ? rc : cuda_attention(cb->stream, &p, out, q, kv, pos, sh, (float *)cb->part.p);
}

static int cu_argmax(struct backend *b, uint32_t *ids, const float *x, uint32_t n, uint32_t dim)
{
	struct cuda_backend *cb = CU(b);
	if (n == 0)
		return 0;
	int rc = grow(cb, &cb->ids, n * sizeof(uint32_t));
	if (!rc)
		rc = cuda_argmax(cb->stream, (uint32_t *)cb->ids.p, x, n, dim);
	if (rc)
		return rc;
	CK(cudaMemcpyAsync(ids, cb->ids.p, n * sizeof(uint32_t), cudaMemcpyDeviceToHost,
			   cb->stream));
	CK(cudaStreamSynchronize(cb->stream));
	return 0;
}

/* ---- memory ---- */

static int cu_buf_alloc(struct backend *b, void **out, size_t bytes)
{
	(void)b;
	void *p = NULL;
	/* cudaMalloc, never managed memory: the pool and activations stay on the device. */
	cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
	if (e == cudaErrorMemoryAllocation) {
		cudaGetLastError();
		return -ENOMEM;
	}
	CK(e);
	*out = p;
	return 0;
}

static void cu_buf_free(struct backend *b, void *p)
{
	(void)b;
	cudaError_t e = cudaFree(p);
	if (e != cudaSuccess)
		cuda_fail("cudaFree(p)", __FILE__, __LINE__, cudaGetErrorString(e));
}

static int cu_upload(struct backend *b, void *dst, const void *src, size_t bytes)
{
	if (bytes)
		CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, CU(b)->stream));
	return 0;
}

static int cu_download(struct backend *b, void *dst, const void *src, size_t bytes)
{
	if (!bytes)
		return 0;
	CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, CU(b)->stream));
	CK(cudaStreamSynchronize(CU(b)->stream));
	return 0;
}

static int cu_copy(struct backend *b, void *dst, const void *src, size_t bytes)
{
	if (bytes)
		CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, CU(b)->stream));
	return 0;
}

static int cu_import(struct backend *b, const void **out, const void *src, size_t bytes)
{
	void *p;
	int rc = cu_buf_alloc(b, &p, bytes);
	if (rc)
		return rc;
	cudaError_t e = cudaMemcpy(p, src, bytes, cudaMemcpyHostToDevice);
	if (e != cudaSuccess) {
		cudaFree(p);
		return cuda_fail("cudaMemcpy(p, src, bytes, H2D)", __FILE__, __LINE__,
				 cudaGetErrorString(e));
	}
	*out = p;
	return 0;
}

static void cu_unimport(struct backend *b, const void *p)
{
	cu_buf_free(b, (void *)p);
}

/* ---- CUDA graphs ---- */

static int cu_step_begin(struct backend *b, uint64_t key)
{
	struct cuda_backend *cb = CU(b);
	int repeat = cb->graphs && key && key == cb->last_key;
	if (key)
		cb->last_key = key;
	if (!repeat)
		return 0;
	CK(cudaStreamBeginCapture(cb->stream, cudaStreamCaptureModeThreadLocal));
	cb->capturing = 1;
	return 0;
}

static int cu_step_end(struct backend *b, int rc)
{
	struct cuda_backend *cb = CU(b);
	if (!cb->capturing)
		return rc;
	cb->capturing = 0;
	cudaGraph_t g = NULL;
	cudaError_t e = cudaStreamEndCapture(cb->stream, &g);
	if (rc || e != cudaSuccess) {
		if (g)
			cudaGraphDestroy(g);
		if (e != cudaSuccess) {
			cudaGetLastError();
			/* The recording broke (an operation that cannot be captured): run it plainly. */
			return rc ? rc : -EAGAIN;
		}
		return rc;
	}
	if (cb->exec) {
		cudaGraphExecUpdateResultInfo info;
		if (cudaGraphExecUpdate(cb->exec, g, &info) != cudaSuccess) {
			cudaGetLastError();	/* another topology: instantiate afresh */
			cudaGraphExecDestroy(cb->exec);
			cb->exec = NULL;
		}
	}
	if (!cb->exec) {
		e = cudaGraphInstantiate(&cb->exec, g, 0);
		if (e != cudaSuccess) {
			cb->exec = NULL;
			cudaGraphDestroy(g);
			return cuda_fail("cudaGraphInstantiate(&exec, g, 0)", __FILE__, __LINE__,
					 cudaGetErrorString(e));
		}
	}
	cudaGraphDestroy(g);
	CK(cudaGraphLaunch(cb->exec, cb->stream));
	return 0;
}

/* ---- lifetime ---- */

static void scratch_free(struct scratch *s)
{
	if (s->p)
		cudaFree(s->p);
	s->p = NULL;
	s->cap = 0;
}

static void cu_destroy(struct backend *b)
{
	struct cuda_backend *cb = CU(b);
	if (!cb)
		return;
	if (cb->stream)
		cudaStreamSynchronize(cb->stream);
	if (cb->exec)
		cudaGraphExecDestroy(cb->exec);
	if (cb->blas)
		cublasDestroy(cb->blas);
	if (cb->blas_ws)
		cudaFree(cb->blas_ws);
	scratch_free(&cb->wdeq);
	scratch_free(&cb->xh);
	scratch_free(&cb->part);
	scratch_free(&cb->ids);
	if (cb->stream)
		cudaStreamDestroy(cb->stream);
	free(cb);
}

static const struct backend_ops cuda_ops = {
	.name = "cuda",
	.destroy = cu_destroy,
	.matmul = cu_matmul,
	.matmul_multi = cu_matmul_multi,
	.get_rows = cu_get_rows,
	.rmsnorm = cu_rmsnorm,
	.rope = cu_rope,
	.swiglu = cu_swiglu,
	.add = cu_add,
	.write_kv_rows = cu_write_kv_rows,
	.attention_rows = cu_attention_rows,
	.add_rmsnorm = cu_add_rmsnorm,
	.argmax = cu_argmax,
	.buf_alloc = cu_buf_alloc,
	.buf_free = cu_buf_free,
	.upload = cu_upload,
	.download = cu_download,
	.copy = cu_copy,
	.import = cu_import,
	.unimport = cu_unimport,
	.step_begin = cu_step_begin,
	.step_end = cu_step_end,
	.add_bias = cu_add_bias,
	.scale = cu_scale,
	.softcap = cu_softcap,
	.geglu = cu_geglu,
};

static int cu_devices(char *why, size_t whylen)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess) {
		snprintf(why, whylen, "%s", cudaGetErrorString(e));
		cudaGetLastError();
		return 0;
	}
	if (n == 0)
		snprintf(why, whylen, "no CUDA device");
	return n;
}

/* Every step of creation that can fail, with the call named in why. */
#define CK_CREATE(call)                                                                 \
	do {                                                                            \
		cudaError_t e_ = (call);                                                \
		if (e_ != cudaSuccess) {                                                \
			snprintf(why, whylen, "%s: %s", #call, cudaGetErrorString(e_)); \
			rc = cuda_fail(#call, __FILE__, __LINE__, cudaGetErrorString(e_)); \
			goto err;                                                       \
		}                                                                       \
	} while (0)

static int cu_create(struct backend **out, int dev, char *why, size_t whylen)
{
	int n = cu_devices(why, whylen), rc = -EIO;
	if (n <= 0 || dev >= n)
		return -ENODEV;
	struct cuda_backend *cb = (struct cuda_backend *)calloc(1, sizeof(*cb));
	if (!cb)
		return -ENOMEM;
	cudaDeviceProp prop;
	cb->dev = dev;
	CK_CREATE(cudaSetDevice(dev));
	CK_CREATE(cudaGetDeviceProperties(&prop, dev));
	if (prop.major < 8) {
		snprintf(why, whylen, "%s is compute capability %d.%d; kvd's kernels need 8.0 or newer",
			 prop.name, prop.major, prop.minor);
		rc = -ENODEV;
		goto err;
	}
	cb->n_sms = (uint32_t)prop.multiProcessorCount;
	CK_CREATE(cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking));
	if (cublasCreate(&cb->blas) != CUBLAS_STATUS_SUCCESS) {
		cb->blas = NULL;
		snprintf(why, whylen, "cublasCreate failed");
		rc = -EIO;
		goto err;
	}
	CK_CREATE(cudaMalloc(&cb->blas_ws, BLAS_WORKSPACE));
	/* cublasSetStream resets the workspace, so the workspace comes second; graphs need it. */
	if (cublasSetStream(cb->blas, cb->stream) != CUBLAS_STATUS_SUCCESS ||
	    cublasSetWorkspace(cb->blas, cb->blas_ws, BLAS_WORKSPACE) != CUBLAS_STATUS_SUCCESS) {
		snprintf(why, whylen, "cublasSetStream/cublasSetWorkspace failed");
		rc = -EIO;
		goto err;
	}
	if (cuda_attention_init()) {
		snprintf(why, whylen, "cannot give the attention kernels their shared memory");
		rc = -EIO;
		goto err;
	}
	/*
	 * Recording a step costs host time that plain launches overlap with
	 * the device's work; KVD_CUDA_GRAPHS=0 turns recording off to compare.
	 */
	cb->graphs = !(getenv("KVD_CUDA_GRAPHS") && !strcmp(getenv("KVD_CUDA_GRAPHS"), "0"));
	cb->base.ops = &cuda_ops;
	cb->base.n_threads = 1;
	cb->base.host_mem = 0;
	snprintf(why, whylen, "%s, compute %d.%d, %u SMs, %.1f GiB", prop.name, prop.major,
		 prop.minor, cb->n_sms, (double)prop.totalGlobalMem / (1u << 30));
	*out = &cb->base;
	return 0;
err:
	cu_destroy(&cb->base);
	return rc;
}

/*
 * The object's one export (kernels/cuda/libkvd-cuda.map): kernels/backend.c
 * finds it by name and checks the ABI before it calls anything else here.
 */
extern "C" const struct kb_cuda_api *KB_CUDA_ENTRY(void)
{
	static const struct kb_cuda_api api = {
		KB_CUDA_ABI, (uint32_t)sizeof(struct backend_ops), cu_devices, cu_create,
		cuda_host_deq32,
	};
	return &api;
}
