/* cublas.cc — the cudasim's cuBLAS: handles and GemmEx, its operands checked as device memory and the product computed on the host in f32. */
#include <string.h>
#include <algorithm>
#include <string>
#include <thread>
#include <vector>
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include "tests/cudasim/sim.h"

struct cudasim_blas {
	cudaStream_t stream = nullptr;
	void *ws = nullptr;
	size_t ws_bytes = 0;
};

namespace {

float load(const void *p, cudaDataType_t t, size_t i)
{
	if (t == CUDA_R_32F)
		return ((const float *)p)[i];
	return __half2float(((const __half *)p)[i]);
}

/* s = sum a[i] b[i] in eight running sums (the compiler vectorises them without reassociating). */
float dot(const float *a, const float *b, int k)
{
	float s[8] = { 0 };
	int i = 0;
	for (; i + 8 <= k; i += 8)
		for (int l = 0; l < 8; l++)
			s[l] += a[i + l] * b[i + l];
	float t = 0.0f;
	for (int l = 0; l < 8; l++)
		t += s[l];
	for (; i < k; i++)
		t += a[i] * b[i];
	return t;
}

struct gemm_args {
	cublasOperation_t ta, tb;
	int m, n, k;
	float alpha, beta;
	const void *A, *B;
	cudaDataType_t at, bt;
	int lda, ldb, ldc;
	float *C;
};

/* Rows [r0, r1) of C: op(A)'s rows converted to f32 in tiles, dotted with op(B)'s converted columns. */
void gemm_rows(const gemm_args &g, const std::vector<float> &bt, int r0, int r1)
{
	const int TILE = 32;
	std::vector<float> at((size_t)TILE * g.k);
	for (int i0 = r0; i0 < r1; i0 += TILE) {
		int ni = std::min(TILE, r1 - i0);
		for (int i = 0; i < ni; i++)
			for (int p = 0; p < g.k; p++) {
				size_t e = g.ta == CUBLAS_OP_N ? (size_t)(i0 + i) + (size_t)p * g.lda
							      : (size_t)p + (size_t)(i0 + i) * g.lda;
				at[(size_t)i * g.k + p] = load(g.A, g.at, e);
			}
		for (int j = 0; j < g.n; j++)
			for (int i = 0; i < ni; i++) {
				float s = dot(&at[(size_t)i * g.k], &bt[(size_t)j * g.k], g.k);
				float *c = &g.C[(size_t)(i0 + i) + (size_t)j * g.ldc];
				*c = g.beta != 0.0f ? g.alpha * s + g.beta * *c : g.alpha * s;
			}
	}
}

void gemm(const gemm_args &g)
{
	std::vector<float> bt((size_t)g.n * g.k);	/* op(B)'s columns, each contiguous */
	for (int j = 0; j < g.n; j++)
		for (int p = 0; p < g.k; p++) {
			size_t e = g.tb == CUBLAS_OP_N ? (size_t)p + (size_t)j * g.ldb
						      : (size_t)j + (size_t)p * g.ldb;
			bt[(size_t)j * g.k + p] = load(g.B, g.bt, e);
		}
	/* Large products on the host's cores: each thread its own rows of C. */
	unsigned nt = std::min(4u, std::max(1u, std::thread::hardware_concurrency()));
	if ((double)g.m * g.n * g.k < 1e7 || g.m < 64)
		nt = 1;
	std::vector<std::thread> th;
	int per = (g.m + (int)nt - 1) / (int)nt;
	for (unsigned t = 1; t < nt; t++) {
		int r0 = (int)t * per, r1 = std::min(g.m, r0 + per);
		if (r0 < r1)
			th.emplace_back([&g, &bt, r0, r1]() { gemm_rows(g, bt, r0, r1); });
	}
	gemm_rows(g, bt, 0, std::min(g.m, per));
	for (std::thread &x : th)
		x.join();
}

size_t esize(cudaDataType_t t)
{
	return t == CUDA_R_32F ? 4 : 2;
}

/* The operand's elements (rows x cols, column-major, leading dimension ld) inside one device buffer. */
bool operand_ok(const char *what, const void *p, cudaDataType_t t, int rows, int cols, int ld)
{
	std::string why;
	size_t bytes = ((size_t)(cols - 1) * ld + rows) * esize(t);
	if (cudasim::device_range(p, bytes, &why))
		return true;
	fprintf(stderr, "cudasim: cublasGemmEx: %s (%d x %d, ld %d): %s\n", what, rows, cols, ld,
		why.c_str());
	return false;
}

}	/* namespace */

cublasStatus_t cublasCreate(cublasHandle_t *h)
{
	*h = new cudasim_blas();
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t h)
{
	delete h;
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s)
{
	if (!h)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	h->stream = s;
	h->ws = nullptr;	/* as cuBLAS: a new stream drops the user workspace */
	h->ws_bytes = 0;
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t bytes)
{
	std::string why;
	if (!h)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (bytes && !cudasim::device_range(ws, bytes, &why)) {
		fprintf(stderr, "cudasim: cublasSetWorkspace: %s\n", why.c_str());
		return CUBLAS_STATUS_INVALID_VALUE;
	}
	h->ws = ws;
	h->ws_bytes = bytes;
	return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusString(cublasStatus_t s)
{
	switch (s) {
	case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
	case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
	case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
	case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
	case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
	case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
	}
	return "CUBLAS_STATUS_UNKNOWN";
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
			    int n, int k, const void *alpha, const void *A, cudaDataType_t at,
			    int lda, const void *B, cudaDataType_t bt, int ldb, const void *beta,
			    void *C, cudaDataType_t ct, int ldc, cublasComputeType_t compute,
			    cublasGemmAlgo_t algo)
{
	(void)algo;
	if (!h)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (m < 0 || n < 0 || k < 0 || !alpha || !beta)
		return CUBLAS_STATUS_INVALID_VALUE;
	if (at != bt || (at != CUDA_R_16F && at != CUDA_R_32F) || ct != CUDA_R_32F ||
	    compute != CUBLAS_COMPUTE_32F)
		return CUBLAS_STATUS_NOT_SUPPORTED;
	const int ar = ta == CUBLAS_OP_N ? m : k, ac = ta == CUBLAS_OP_N ? k : m;
	const int br = tb == CUBLAS_OP_N ? k : n, bc = tb == CUBLAS_OP_N ? n : k;
	if (lda < std::max(1, ar) || ldb < std::max(1, br) || ldc < std::max(1, m))
		return CUBLAS_STATUS_INVALID_VALUE;
	if (m == 0 || n == 0)
		return CUBLAS_STATUS_SUCCESS;
	if ((k && (!operand_ok("A", A, at, ar, ac, lda) || !operand_ok("B", B, bt, br, bc, ldb))) ||
	    !operand_ok("C", C, ct, m, n, ldc))
		return CUBLAS_STATUS_EXECUTION_FAILED;
	gemm_args g = { ta, tb, m, n, k, *(const float *)alpha, *(const float *)beta, A, B, at, bt,
			lda, ldb, ldc, (float *)C };
	cudaError_t e = cudasim::enqueue(h->stream, "cublasGemmEx", [g]() {
		if (cudasim::sticky() == cudaSuccess)
			gemm(g);
	});
	return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}
