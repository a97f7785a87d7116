/* runtime.cc — the cudasim's CUDA runtime: device memory, streams, captures and graphs, launches and their errors. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <map>
#include <mutex>
#include <string>
#include <vector>
#include <cuda_runtime.h>
#include "tests/cudasim/sim.h"

namespace {

/* What the simulated device says of itself: an H100/H200-class part, as the kernels' plans see it. */
constexpr size_t DEVICE_BYTES = (size_t)16 << 30;
constexpr size_t SMEM_DEFAULT = 48 << 10;
constexpr size_t SMEM_OPTIN = 227 << 10;
constexpr int N_SMS = 132;

struct node {
	std::string name;
	const void *fn;		/* the kernel, or NULL for a copy or a library's work */
	std::function<void()> run;
};

}	/* namespace */

struct cudasim_stream {
	bool capturing = false;
	bool invalid = false;	/* a call the capture cannot take was made while it recorded */
	std::vector<node> nodes;
};

struct cudasim_graph {
	std::vector<node> nodes;
};

namespace {

std::mutex mu;				/* allocs, allocated, smem_max, the sticky error */
std::map<uintptr_t, size_t> allocs;	/* live device buffers: base -> bytes */
size_t allocated;
std::map<const void *, size_t> smem_max;	/* cudaFuncSetAttribute's opt-ins */
cudaError_t sticky_err = cudaSuccess;
cudasim_stream legacy;			/* stream 0 */
thread_local cudaError_t last_err = cudaSuccess;
thread_local cudasim_stream *capture_here;	/* the capture this thread has open */

const char *env_skip(void)
{
	static const char *s = getenv("KVD_CUDASIM_SKIP");
	return s && *s ? s : nullptr;
}

bool env_trace(void)
{
	static const bool t = getenv("KVD_CUDASIM_TRACE") && !strcmp(getenv("KVD_CUDASIM_TRACE"), "1");
	return t;
}

cudaError_t fail(cudaError_t e)
{
	last_err = e;
	return e;
}

/* A misuse the runtime reports as an error code; said on stderr too, as the cudasim exists to find these. */
cudaError_t misuse(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
cudaError_t misuse(cudaError_t e, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "cudasim: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	return fail(e);
}

cudasim_stream *S(cudaStream_t s)
{
	return s ? s : &legacy;
}

#define STICKY()                                           \
	do {                                               \
		cudaError_t st_ = cudasim::sticky();       \
		if (st_ != cudaSuccess)                    \
			return fail(st_);                  \
	} while (0)

/* A call that may not be made while this thread records (it could synchronise): the capture breaks. */
bool breaks_capture(void)
{
	if (!capture_here)
		return false;
	capture_here->invalid = true;
	return true;
}

bool skipped(const char *name)
{
	return env_skip() && strstr(name, env_skip());
}

void execute(const cudasim::launch_cfg &c, const std::function<void()> &body)
{
	if (cudasim::sticky() != cudaSuccess)
		return;	/* a faulted context runs nothing more */
	if (skipped(c.name)) {
		if (env_trace())
			fprintf(stderr, "cudasim: %s skipped (KVD_CUDASIM_SKIP)\n", c.name);
		return;
	}
	if (env_trace())
		fprintf(stderr, "cudasim: %s grid (%u,%u,%u) block (%u,%u,%u) smem %zu\n", c.name,
			c.grid.x, c.grid.y, c.grid.z, c.block.x, c.block.y, c.block.z, c.smem);
	std::string why;
	if (cudasim::run_grid(c, body, &why)) {
		char b[160];
		snprintf(b, sizeof(b), "kernel %s, grid (%u,%u,%u) block (%u,%u,%u): ", c.name, c.grid.x,
			 c.grid.y, c.grid.z, c.block.x, c.block.y, c.block.z);
		cudasim::set_sticky(cudaErrorLaunchFailure, b + why);
	}
}

void record_or_run(cudasim_stream *st, node &&n)
{
	if (st->capturing)
		st->nodes.push_back(std::move(n));
	else
		n.run();
}

const char *kind_name(cudaMemcpyKind k)
{
	switch (k) {
	case cudaMemcpyHostToHost: return "host to host";
	case cudaMemcpyHostToDevice: return "host to device";
	case cudaMemcpyDeviceToHost: return "device to host";
	case cudaMemcpyDeviceToDevice: return "device to device";
	default: return "default";
	}
}

/* The copy's two ranges where its kind says they are. */
cudaError_t check_copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
	std::string why;
	bool dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
	bool sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
	if (kind == cudaMemcpyDefault) {
		dd = cudasim::device_pointer(dst);
		sd = cudasim::device_pointer(src);
	} else if (kind != cudaMemcpyHostToHost && !dd && !sd) {
		return misuse(cudaErrorInvalidMemcpyDirection, "cudaMemcpy kind %d", (int)kind);
	}
	if (dd && !cudasim::device_range(dst, bytes, &why))
		return misuse(cudaErrorInvalidValue, "cudaMemcpy %s of %zu bytes: the destination %s",
			      kind_name(kind), bytes, why.c_str());
	if (sd && !cudasim::device_range(src, bytes, &why))
		return misuse(cudaErrorInvalidValue, "cudaMemcpy %s of %zu bytes: the source %s",
			      kind_name(kind), bytes, why.c_str());
	if (!dd && cudasim::device_range(dst, 0, &why))
		return misuse(cudaErrorInvalidValue, "cudaMemcpy %s: the destination %p is device memory",
			      kind_name(kind), dst);
	if (!sd && cudasim::device_range(src, 0, &why))
		return misuse(cudaErrorInvalidValue, "cudaMemcpy %s: the source %p is device memory",
			      kind_name(kind), src);
	return cudaSuccess;
}

}	/* namespace */

/* ---- inside the cudasim ---- */

namespace cudasim {

int device_range(const void *p, size_t bytes, std::string *why)
{
	std::lock_guard<std::mutex> g(mu);
	uintptr_t a = (uintptr_t)p;
	auto it = allocs.upper_bound(a);
	char b[160];
	if (it == allocs.begin() || a > std::prev(it)->first + std::prev(it)->second) {
		snprintf(b, sizeof(b), "%p is not in any live device buffer (host memory, or freed)", p);
		*why = b;
		return 0;
	}
	--it;
	if (a + bytes > it->first + it->second) {
		snprintf(b, sizeof(b), "%p runs %zu bytes past the end of its device buffer of %zu bytes",
			 p, (size_t)(a + bytes - it->first - it->second), it->second);
		*why = b;
		return 0;
	}
	return 1;
}

int device_pointer(const void *p)
{
	std::string why;
	return !p || device_range(p, 0, &why);
}

void set_sticky(cudaError_t e, const std::string &msg)
{
	{
		std::lock_guard<std::mutex> g(mu);
		if (sticky_err == cudaSuccess)
			sticky_err = e;
	}
	fprintf(stderr, "cudasim: %s\n", msg.c_str());
}

cudaError_t sticky(void)
{
	std::lock_guard<std::mutex> g(mu);
	return sticky_err;
}

cudaError_t func_set_attribute(const void *fn, cudaFuncAttribute attr, int value)
{
	STICKY();
	if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize)
		return misuse(cudaErrorInvalidValue, "cudaFuncSetAttribute: attribute %d is not modelled",
			      (int)attr);
	if (value < 0 || (size_t)value > SMEM_OPTIN)
		return misuse(cudaErrorInvalidValue,
			      "cudaFuncSetAttribute: %d bytes of dynamic shared memory, the device has %zu",
			      value, SMEM_OPTIN);
	std::lock_guard<std::mutex> g(mu);
	smem_max[fn] = (size_t)value;
	return cudaSuccess;
}

void launch(const launch_cfg &c, std::function<void()> body, int bad_arg)
{
	if (sticky() != cudaSuccess) {
		fail(sticky());
		return;
	}
	const uint64_t threads = (uint64_t)c.block.x * c.block.y * c.block.z;
	if (!threads || threads > 1024 || c.block.z > 64 || !c.grid.x || !c.grid.y || !c.grid.z ||
	    c.grid.y > 65535 || c.grid.z > 65535 || c.grid.x > 0x7fffffffu) {
		misuse(cudaErrorInvalidConfiguration, "launch of %s: grid (%u,%u,%u) block (%u,%u,%u) is not a valid configuration",
		       c.name, c.grid.x, c.grid.y, c.grid.z, c.block.x, c.block.y, c.block.z);
		return;
	}
	size_t lim = SMEM_DEFAULT;
	{
		std::lock_guard<std::mutex> g(mu);
		auto it = smem_max.find(c.fn);
		if (it != smem_max.end() && it->second > lim)
			lim = it->second;
	}
	if (c.smem > lim) {
		misuse(cudaErrorInvalidValue, "launch of %s: %zu bytes of dynamic shared memory, %zu allowed (cudaFuncSetAttribute raises it)",
		       c.name, c.smem, lim);
		return;
	}
	if (bad_arg >= 0) {
		char b[200];
		snprintf(b, sizeof(b), "launch of %s: pointer argument %d is not device memory (an illegal address on a device)",
			 c.name, bad_arg);
		set_sticky(cudaErrorIllegalAddress, b);
		fail(cudaErrorIllegalAddress);
		return;
	}
	launch_cfg cc = c;
	record_or_run(S(c.stream), node{ c.name, c.fn, [cc, body]() { execute(cc, body); } });
}

cudaError_t enqueue(cudaStream_t s, const char *name, std::function<void()> op)
{
	STICKY();
	record_or_run(S(s), node{ name, nullptr, std::move(op) });
	return cudaSuccess;
}

}	/* namespace cudasim */

/* ---- the runtime API ---- */

const char *cudaGetErrorString(cudaError_t e)
{
	switch (e) {
	case cudaSuccess: return "no error";
	case cudaErrorInvalidValue: return "invalid argument";
	case cudaErrorMemoryAllocation: return "out of memory";
	case cudaErrorInvalidConfiguration: return "invalid configuration argument";
	case cudaErrorInvalidDevicePointer: return "invalid device pointer";
	case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
	case cudaErrorNoDevice: return "no CUDA-capable device is detected";
	case cudaErrorInvalidDevice: return "invalid device ordinal";
	case cudaErrorInvalidResourceHandle: return "invalid resource handle";
	case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
	case cudaErrorLaunchFailure: return "unspecified launch failure";
	case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
	case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
	case cudaErrorGraphExecUpdateFailure: return "the graph update was not performed because it included changes which violated constraints specific to instantiated graph update";
	}
	return "unknown error";
}

cudaError_t cudaGetLastError(void)
{
	cudaError_t s = cudasim::sticky();
	if (s != cudaSuccess)
		return s;
	cudaError_t e = last_err;
	last_err = cudaSuccess;
	return e;
}

cudaError_t cudaPeekAtLastError(void)
{
	cudaError_t s = cudasim::sticky();
	return s != cudaSuccess ? s : last_err;
}

cudaError_t cudaGetDeviceCount(int *n)
{
	*n = 1;
	return cudaSuccess;
}

cudaError_t cudaSetDevice(int dev)
{
	STICKY();
	return dev == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice);
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev)
{
	if (dev != 0)
		return fail(cudaErrorInvalidDevice);
	memset(p, 0, sizeof(*p));
	snprintf(p->name, sizeof(p->name), "kvd cudasim (the CUDA kernels on the host)");
	p->totalGlobalMem = DEVICE_BYTES;
	p->sharedMemPerBlock = SMEM_DEFAULT;
	p->sharedMemPerBlockOptin = SMEM_OPTIN;
	p->maxThreadsPerBlock = 1024;
	p->multiProcessorCount = N_SMS;
	p->major = 9;
	p->minor = 0;
	return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
	if (breaks_capture())
		return fail(cudaErrorStreamCaptureUnsupported);
	STICKY();
	return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t bytes)
{
	*p = nullptr;
	if (breaks_capture())
		return fail(cudaErrorStreamCaptureUnsupported);
	STICKY();
	size_t len = (bytes + 255) & ~(size_t)255;
	{
		std::lock_guard<std::mutex> g(mu);
		if (bytes > DEVICE_BYTES || allocated + len > DEVICE_BYTES)
			return fail(cudaErrorMemoryAllocation);
	}
	/* Aligned as cudaMalloc's, and exactly as long as asked: a sanitizer sees the first byte past it. */
	void *m = nullptr;
	if (posix_memalign(&m, 256, bytes ? bytes : 1))
		return fail(cudaErrorMemoryAllocation);
	/* What a fresh device buffer holds is unknown: NaNs and huge indices, never zeros. */
	memset(m, 0xff, bytes);
	std::lock_guard<std::mutex> g(mu);
	allocs[(uintptr_t)m] = bytes;
	allocated += len;
	*p = m;
	return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
	if (!p)
		return cudaSuccess;
	if (breaks_capture())
		return fail(cudaErrorStreamCaptureUnsupported);
	{
		std::lock_guard<std::mutex> g(mu);
		auto it = allocs.find((uintptr_t)p);
		if (it != allocs.end()) {
			allocated -= (it->second + 255) & ~(size_t)255;
			allocs.erase(it);
			free(p);
			return cudaSuccess;
		}
	}
	return misuse(cudaErrorInvalidValue, "cudaFree(%p): not a pointer cudaMalloc returned, or freed twice",
		      p);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
			    cudaStream_t s)
{
	STICKY();
	if (!bytes)
		return cudaSuccess;
	cudaError_t e = check_copy(dst, src, bytes, kind);
	if (e != cudaSuccess)
		return e;
	char name[48];
	snprintf(name, sizeof(name), "memcpy %s", kind_name(kind));
	record_or_run(S(s), node{ name, nullptr, [dst, src, bytes]() {
				      if (cudasim::sticky() == cudaSuccess)
					      memmove(dst, src, bytes);
			      } });
	return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
	if (breaks_capture())
		return fail(cudaErrorStreamCaptureUnsupported);
	cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
	return e != cudaSuccess ? e : cudaDeviceSynchronize();
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s)
{
	STICKY();
	std::string why;
	if (!bytes)
		return cudaSuccess;
	if (!cudasim::device_range(dst, bytes, &why))
		return misuse(cudaErrorInvalidValue, "cudaMemset of %zu bytes: %s", bytes, why.c_str());
	record_or_run(S(s), node{ "memset", nullptr, [dst, value, bytes]() {
				      if (cudasim::sticky() == cudaSuccess)
					      memset(dst, value, bytes);
			      } });
	return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
	(void)flags;
	STICKY();
	*s = new cudasim_stream();
	return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
	if (!s)
		return fail(cudaErrorInvalidResourceHandle);
	if (capture_here == s)
		capture_here = nullptr;
	delete s;
	return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
	if (S(s)->capturing || breaks_capture()) {
		S(s)->invalid = true;
		return fail(cudaErrorStreamCaptureUnsupported);
	}
	STICKY();
	return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode)
{
	STICKY();
	cudasim_stream *st = S(s);
	if (!s || st->capturing)
		return misuse(cudaErrorInvalidValue, "cudaStreamBeginCapture on %s",
			      s ? "a stream that is already capturing" : "the legacy stream");
	st->capturing = true;
	st->invalid = false;
	st->nodes.clear();
	if (mode != cudaStreamCaptureModeRelaxed)
		capture_here = st;
	return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g)
{
	cudasim_stream *st = S(s);
	*g = nullptr;
	if (!st->capturing)
		return misuse(cudaErrorInvalidValue, "cudaStreamEndCapture on a stream that is not capturing");
	st->capturing = false;
	if (capture_here == st)
		capture_here = nullptr;
	std::vector<node> nodes;
	nodes.swap(st->nodes);
	if (st->invalid)
		return fail(cudaErrorStreamCaptureInvalidated);
	STICKY();
	*g = new cudasim_graph{ std::move(nodes) };
	return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t g, unsigned long long flags)
{
	(void)flags;
	STICKY();
	if (!g)
		return fail(cudaErrorInvalidValue);
	*exec = new cudasim_graph{ g->nodes };
	return cudaSuccess;
}

/* Same nodes in the same order, each the same kernel (or copy): the parameters are taken over. */
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t exec, cudaGraph_t g,
				cudaGraphExecUpdateResultInfo *info)
{
	STICKY();
	if (info)
		memset(info, 0, sizeof(*info));
	bool same = exec && g && exec->nodes.size() == g->nodes.size();
	for (size_t i = 0; same && i < g->nodes.size(); i++)
		same = exec->nodes[i].fn == g->nodes[i].fn && exec->nodes[i].name == g->nodes[i].name;
	if (!same) {
		if (info)
			info->result = 1;
		return fail(cudaErrorGraphExecUpdateFailure);
	}
	exec->nodes = g->nodes;
	return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s)
{
	STICKY();
	if (!exec)
		return fail(cudaErrorInvalidValue);
	cudasim_stream *st = S(s);
	for (const node &n : exec->nodes)
		record_or_run(st, node(n));
	return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t g)
{
	delete g;
	return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
	delete exec;
	return cudaSuccess;
}
