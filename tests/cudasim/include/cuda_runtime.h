/* cuda_runtime.h — the cudasim's CUDA runtime: what kernels/cuda calls, its kernels run as host threads of a simulated GPU. */
#ifndef KVD_CUDASIM_RUNTIME_H
#define KVD_CUDASIM_RUNTIME_H

#ifndef __cplusplus
#error "the cudasim compiles the .cu files of kernels/cuda as C++17"
#endif

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

/*
 * The .cu files of kernels/cuda compiled by g++ against this header: every kernel runs
 * on the host, each CUDA thread a fiber of its block, so the kernels' own
 * indexing, reductions, barriers and shuffles execute as written (see
 * tests/cudasim/README.md for what is modelled and what is not).
 */
#define KVD_CUDASIM 1

/* ---- qualifiers ---- */
#define __host__
#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
/* One copy for every block: the blocks of a grid run one after another, one grid at a time. */
#define __shared__ static
#define warpSize 32

/* ---- vector types ---- */
struct uint3 {
	unsigned x, y, z;
};
struct dim3 {
	unsigned x, y, z;
	constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(16) float4 {
	float x, y, z, w;
};
struct alignas(16) uint4 {
	unsigned x, y, z, w;
};
static inline float4 make_float4(float x, float y, float z, float w)
{
	return float4{ x, y, z, w };
}
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w)
{
	return uint4{ x, y, z, w };
}

/* ---- errors, streams, graphs, devices ---- */
enum cudaError {
	cudaSuccess = 0,
	cudaErrorInvalidValue = 1,
	cudaErrorMemoryAllocation = 2,
	cudaErrorInvalidConfiguration = 9,
	cudaErrorInvalidDevicePointer = 17,
	cudaErrorInvalidMemcpyDirection = 21,
	cudaErrorNoDevice = 100,
	cudaErrorInvalidDevice = 101,
	cudaErrorInvalidResourceHandle = 400,
	cudaErrorIllegalAddress = 700,
	cudaErrorLaunchFailure = 719,
	cudaErrorStreamCaptureUnsupported = 900,
	cudaErrorStreamCaptureInvalidated = 901,
	cudaErrorGraphExecUpdateFailure = 910,
};
typedef enum cudaError cudaError_t;

enum cudaMemcpyKind {
	cudaMemcpyHostToHost = 0,
	cudaMemcpyHostToDevice = 1,
	cudaMemcpyDeviceToHost = 2,
	cudaMemcpyDeviceToDevice = 3,
	cudaMemcpyDefault = 4,
};

enum cudaStreamCaptureMode {
	cudaStreamCaptureModeGlobal = 0,
	cudaStreamCaptureModeThreadLocal = 1,
	cudaStreamCaptureModeRelaxed = 2,
};

enum cudaFuncAttribute {
	cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};

#define cudaStreamDefault 0x0
#define cudaStreamNonBlocking 0x1

typedef struct cudasim_stream *cudaStream_t;
typedef struct cudasim_graph *cudaGraph_t;
typedef struct cudasim_graph *cudaGraphExec_t;

struct cudaGraphExecUpdateResultInfo {
	int result;
	void *errorNode;
	void *errorFromNode;
};

struct cudaDeviceProp {
	char name[256];
	size_t totalGlobalMem;
	size_t sharedMemPerBlock;
	size_t sharedMemPerBlockOptin;
	int maxThreadsPerBlock;
	int multiProcessorCount;
	int major, minor;
};

const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaMalloc(void **p, size_t bytes);
template <class T>
static inline cudaError_t cudaMalloc(T **p, size_t bytes)
{
	return cudaMalloc((void **)p, bytes);
}
cudaError_t cudaFree(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
			    cudaStream_t s = 0);
cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s = 0);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t g, unsigned long long flags);
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t exec, cudaGraph_t g,
				cudaGraphExecUpdateResultInfo *info);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);

namespace cudasim {
cudaError_t func_set_attribute(const void *fn, cudaFuncAttribute attr, int value);
}
template <class F>
static inline cudaError_t cudaFuncSetAttribute(F *fn, cudaFuncAttribute attr, int value)
{
	return ::cudasim::func_set_attribute(reinterpret_cast<const void *>(fn), attr, value);
}

/* ---- what a thread sees ---- */
namespace cudasim {
extern const uint3 *cur_tid;
extern uint3 cur_block;
extern dim3 cur_bdim, cur_gdim;
/* The block's dynamic shared memory (the launch's third parameter), poisoned with NaNs. */
void *dyn_smem(void);
void syncthreads(void);
/* lane's value of the warp's exchange: xor 1 takes lane ^ arg, xor 0 lane arg. */
uint64_t shfl(unsigned mask, uint64_t v, int arg, int xor_mode, int width);
}
#define threadIdx (*::cudasim::cur_tid)
#define blockIdx (::cudasim::cur_block)
#define blockDim (::cudasim::cur_bdim)
#define gridDim (::cudasim::cur_gdim)

static inline void __syncthreads(void)
{
	::cudasim::syncthreads();
}

template <class T>
static inline T cudasim_shfl(unsigned mask, T v, int arg, int xor_mode, int width)
{
	static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of a word");
	uint64_t u = 0;
	memcpy(&u, &v, sizeof(T));
	u = ::cudasim::shfl(mask, u, arg, xor_mode, width);
	memcpy(&v, &u, sizeof(T));
	return v;
}
template <class T>
static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32)
{
	return cudasim_shfl(mask, v, src, 0, width);
}
template <class T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32)
{
	return cudasim_shfl(mask, v, lane_mask, 1, width);
}

/* ---- device intrinsics: the host's IEEE operations (this code is built with -ffp-contract=off) ---- */
static inline float __fmul_rn(float a, float b)
{
	return a * b;
}
static inline float __fadd_rn(float a, float b)
{
	return a + b;
}
static inline float __fsub_rn(float a, float b)
{
	return a - b;
}
static inline float __fdiv_rn(float a, float b)
{
	return a / b;
}
static inline int __float2int_rn(float x)
{
	return (int)nearbyintf(x);	/* the default rounding: to nearest, ties to even */
}
static inline float __int_as_float(int i)
{
	float f;
	memcpy(&f, &i, 4);
	return f;
}
static inline float __uint_as_float(unsigned u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}
static inline unsigned __float_as_uint(float f)
{
	unsigned u;
	memcpy(&u, &f, 4);
	return u;
}
template <class T>
static inline T __ldg(const T *p)
{
	return *p;
}
/* Byte i of the result is byte (s >> 4 i) & 7 of the eight bytes y:x. */
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s)
{
	uint64_t v = (uint64_t)y << 32 | x;
	unsigned r = 0;
	for (int i = 0; i < 4; i++)
		r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
	return r;
}
template <class A, class B>
static inline typename std::common_type<A, B>::type min(A a, B b)
{
	typedef typename std::common_type<A, B>::type T;
	return (T)a < (T)b ? (T)a : (T)b;
}
template <class A, class B>
static inline typename std::common_type<A, B>::type max(A a, B b)
{
	typedef typename std::common_type<A, B>::type T;
	return (T)a > (T)b ? (T)a : (T)b;
}

/* ---- launches: CUDA_LAUNCH(grid, block, smem, stream, kernel)(args...) ---- */
namespace cudasim {
struct launch_cfg {
	const char *name;	/* the kernel as the launch spells it */
	const void *fn;
	dim3 grid, block;
	size_t smem;
	cudaStream_t stream;
};

/*
 * Run the grid now (each thread calling body), or record it into the
 * stream's capture; bad_arg >= 0 names a pointer argument that is neither
 * NULL nor inside a live device allocation, which fails the launch.
 */
void launch(const launch_cfg &c, std::function<void()> body, int bad_arg);
/* 1 when p is NULL or inside (or one past) a live cudaMalloc'ed buffer. */
int device_pointer(const void *p);

template <class T>
static inline bool arg_ok(const T &v)
{
	if constexpr (std::is_pointer<T>::value)
		return device_pointer((const void *)v);
	else
		return true;
}

template <class Tuple, size_t... I>
static inline int first_bad_arg(const Tuple &t, std::index_sequence<I...>)
{
	int bad = -1;
	((bad < 0 && !arg_ok(std::get<I>(t)) ? (void)(bad = (int)I) : (void)0), ...);
	return bad;
}

template <class... P>
struct launcher {
	void (*fn)(P...);
	launch_cfg cfg;
	template <class... A>
	void operator()(A &&...a) const
	{
		static_assert(sizeof...(A) == sizeof...(P), "a kernel's argument count");
		/* The arguments are converted and copied at the launch, as the runtime does. */
		std::tuple<typename std::decay<P>::type...> args(static_cast<P>(std::forward<A>(a))...);
		int bad = first_bad_arg(args, std::index_sequence_for<P...>{});
		void (*f)(P...) = fn;
		launch(cfg, [f, args]() { std::apply(f, args); }, bad);
	}
};

template <class... P>
static inline launcher<P...> make_launch(void (*fn)(P...), const char *name, dim3 grid, dim3 block,
					 size_t smem, cudaStream_t s)
{
	return launcher<P...>{ fn, { name, reinterpret_cast<const void *>(fn), grid, block, smem, s } };
}

/* A library's device work (cuBLAS here): run now on the host, or recorded into the capture. */
cudaError_t enqueue(cudaStream_t s, const char *name, std::function<void()> op);
}

#define CUDA_LAUNCH(grid, block, smem, stream, ...) \
	::cudasim::make_launch(__VA_ARGS__, #__VA_ARGS__, dim3(grid), dim3(block), (smem), (stream))
#define CUDA_DYN_SHARED(T, name) T *name = (T *)::cudasim::dyn_smem()

#endif
