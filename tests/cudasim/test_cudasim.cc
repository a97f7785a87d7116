/* test_cudasim.cc — the simulation itself: warps, barriers and shuffles behave as a device's, and what a device would fault on fails the launch here, by name. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
extern "C" {
#include <cmocka.h>
}

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cuda_runtime.h>

/* ---- kernels ---- */

__device__ float warp_sum(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

/*
 * The block sum of kernels/cuda/norm.cu before its fix (broken = 1):
 * warp 0 alone sums the partials, then each warp broadcasts its own lane
 * 0, so warps 1.. get 0; after it (broken = 0) every warp sums them.
 */
__global__ void block_sum_kernel(float *out, int broken)
{
	__shared__ float part[8];
	const unsigned lane = threadIdx.x % 32;
	float v = warp_sum((float)(threadIdx.x + 1));
	if (lane == 0)
		part[threadIdx.x / 32] = v;
	__syncthreads();
	float t;
	if (broken) {
		t = warp_sum(threadIdx.x < 8 ? part[threadIdx.x] : 0.0f);
		t = __shfl_sync(0xffffffffu, t, 0);
	} else {
		t = warp_sum(lane < 8 ? part[lane] : 0.0f);
	}
	out[blockIdx.x * blockDim.x + threadIdx.x] = t;
}

/* Every thread but the first warp returns before a __syncthreads(). */
__global__ void early_return_kernel(float *out)
{
	if (threadIdx.x >= 32)
		return;
	__syncthreads();
	out[threadIdx.x] = 1.0f;
}

/* Half a warp returns, the other half shuffles over the full mask. */
__global__ void half_warp_kernel(float *out)
{
	if (threadIdx.x % 32 >= 16)
		return;
	out[threadIdx.x] = warp_sum(1.0f);
}

__global__ void write_kernel(float *out, float v)
{
	out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}

/* Dynamic shared memory: each thread writes its slot, reads its neighbour's after the barrier. */
__global__ void smem_kernel(float *out)
{
	CUDA_DYN_SHARED(float, s);
	s[threadIdx.x] = (float)threadIdx.x;
	__syncthreads();
	out[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}

/* ---- helpers ---- */

static float *dev(size_t n)
{
	void *p;
	assert_int_equal(cudaMalloc(&p, n * sizeof(float)), cudaSuccess);
	return (float *)p;
}

/*
 * A faulting launch poisons the process's context, as on a device: each
 * such case runs in a child, which exits 0 when the launch failed as it
 * should and its message (on stderr) holds want.
 */
static void in_child(void (*body)(void), const char *want)
{
	int fd[2];
	assert_int_equal(pipe(fd), 0);
	fflush(stdout);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		dup2(fd[1], 2);
		close(fd[0]);
		body();
		fflush(stderr);
		_exit(cudaGetLastError() == cudaSuccess ? 3 : 0);
	}
	close(fd[1]);
	char buf[4096];
	size_t len = 0;
	ssize_t r;
	while (len + 1 < sizeof(buf) && (r = read(fd[0], buf + len, sizeof(buf) - 1 - len)) > 0)
		len += (size_t)r;
	buf[len] = '\0';
	close(fd[0]);
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	printf("%s", buf);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	if (!strstr(buf, want))
		fail_msg("the message does not say '%s'", want);
}

/* ---- tests ---- */

static void test_block_sum(void **state)
{
	(void)state;
	const unsigned n = 256;
	float *d = dev(2 * n), h[512];
	CUDA_LAUNCH(2, n, 0, nullptr, block_sum_kernel)(d, 0);
	assert_int_equal(cudaMemcpy(h, d, sizeof(float) * n, cudaMemcpyDeviceToHost), cudaSuccess);
	for (unsigned i = 0; i < n; i++)
		assert_true(h[i] == n * (n + 1) / 2.0f);
	CUDA_LAUNCH(1, n, 0, nullptr, block_sum_kernel)(d, 1);
	assert_int_equal(cudaMemcpy(h, d, sizeof(float) * n, cudaMemcpyDeviceToHost), cudaSuccess);
	/* The bug as the device showed it: warp 0 has the sum, the seven others 0. */
	for (unsigned i = 0; i < n; i++)
		assert_true(h[i] == (i < 32 ? n * (n + 1) / 2.0f : 0.0f));
	cudaFree(d);
}

static void test_smem(void **state)
{
	(void)state;
	float *d = dev(128), h[128];
	CUDA_LAUNCH(1, 128, 128 * sizeof(float), nullptr, smem_kernel)(d);
	assert_int_equal(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost), cudaSuccess);
	for (unsigned i = 0; i < 128; i++)
		assert_true(h[i] == (float)((i + 1) % 128));
	/* Past the 48 KiB default: refused until the kernel opts in, as on a device. */
	CUDA_LAUNCH(1, 128, 64 << 10, nullptr, smem_kernel)(d);
	assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
	assert_int_equal(cudaFuncSetAttribute(smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
					      64 << 10), cudaSuccess);
	CUDA_LAUNCH(1, 128, 64 << 10, nullptr, smem_kernel)(d);
	assert_int_equal(cudaGetLastError(), cudaSuccess);
	CUDA_LAUNCH(1, 2048, 0, nullptr, smem_kernel)(d);
	assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
	cudaFree(d);
}

/* Recorded launches run at each replay with the parameters of the last update. */
static void test_graph(void **state)
{
	(void)state;
	cudaStream_t s;
	cudaGraph_t g;
	cudaGraphExec_t ex;
	float *d = dev(32), h[32];
	assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
	assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
	CUDA_LAUNCH(1, 32, 0, s, write_kernel)(d, 1.0f);
	assert_int_equal(cudaStreamEndCapture(s, &g), cudaSuccess);
	assert_int_equal(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost), cudaSuccess);
	assert_true(h[0] != 1.0f);	/* recorded, not run */
	assert_int_equal(cudaGraphInstantiate(&ex, g, 0), cudaSuccess);
	assert_int_equal(cudaGraphLaunch(ex, s), cudaSuccess);
	assert_int_equal(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost), cudaSuccess);
	assert_true(h[31] == 1.0f);
	cudaGraphDestroy(g);
	/* The same kernel with another value updates in place; another topology does not. */
	assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
	CUDA_LAUNCH(1, 32, 0, s, write_kernel)(d, 2.0f);
	assert_int_equal(cudaStreamEndCapture(s, &g), cudaSuccess);
	cudaGraphExecUpdateResultInfo info;
	assert_int_equal(cudaGraphExecUpdate(ex, g, &info), cudaSuccess);
	cudaGraphDestroy(g);
	assert_int_equal(cudaGraphLaunch(ex, s), cudaSuccess);
	assert_int_equal(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost), cudaSuccess);
	assert_true(h[5] == 2.0f);
	assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
	CUDA_LAUNCH(1, 32, 0, s, smem_kernel)(d);
	assert_int_equal(cudaStreamEndCapture(s, &g), cudaSuccess);
	assert_int_equal(cudaGraphExecUpdate(ex, g, &info), cudaErrorGraphExecUpdateFailure);
	assert_int_equal(cudaGetLastError(), cudaErrorGraphExecUpdateFailure);
	cudaGraphDestroy(g);
	/* A synchronising call while recording breaks the capture. */
	assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
	void *p;
	assert_int_equal(cudaMalloc(&p, 64), cudaErrorStreamCaptureUnsupported);
	assert_int_equal(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
	assert_null(g);
	cudaGraphExecDestroy(ex);
	cudaStreamDestroy(s);
	cudaFree(d);
}

static void copy_past_end(void)
{
	float *d = dev(16), h[32] = { 0 };
	cudaMemcpy(d, h, sizeof(h), cudaMemcpyHostToDevice);
}

static void test_copy_checked(void **state)
{
	(void)state;
	in_child(copy_past_end, "runs 64 bytes past the end of its device buffer of 64 bytes");
}

static void host_pointer(void)
{
	static float h[32];
	CUDA_LAUNCH(1, 32, 0, nullptr, write_kernel)(h, 1.0f);
}

static void early_return(void)
{
	CUDA_LAUNCH(1, 64, 0, nullptr, early_return_kernel)(dev(64));
	cudaDeviceSynchronize();
}

static void half_warp(void)
{
	CUDA_LAUNCH(1, 32, 0, nullptr, half_warp_kernel)(dev(32));
	cudaDeviceSynchronize();
}

static void test_faults(void **state)
{
	(void)state;
	in_child(host_pointer, "pointer argument 0 is not device memory");
	in_child(early_return, "deadlock: 32 of 64 threads wait in __syncthreads(), 32 have returned");
	in_child(half_warp, "warp 0: lanes 0x0000ffff wait in a shuffle over mask 0xffffffff, lanes 0xffff0000 of it have returned");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_block_sum),
		cmocka_unit_test(test_smem),
		cmocka_unit_test(test_graph),
		cmocka_unit_test(test_copy_checked),
		cmocka_unit_test(test_faults),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
