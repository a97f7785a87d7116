/* sched.cc — the cudasim's threads: each CUDA thread of a block a fiber, __syncthreads() and warp shuffles under the hardware's rules. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <mutex>
#include <string>
#include <vector>
#include <cuda_runtime.h>
#include "tests/cudasim/sim.h"

#if defined(__SANITIZE_ADDRESS__)
#define SIM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SIM_ASAN 1
#endif
#endif
#ifdef SIM_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
/* Fake stacks and redzones need room: a sanitized kernel's frames are several times larger. */
#define STACK_BYTES (1u << 20)
#else
#define STACK_BYTES (128u << 10)
#endif

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace cudasim {

/*
 * One grid runs at a time in the process (run_grid holds grid_mu), as on
 * one device queue: the running thread's indices and the block's state are
 * plain globals, which the kernels read far more often than anything else.
 */
const uint3 *cur_tid;
uint3 cur_block;
dim3 cur_bdim, cur_gdim;

namespace {

enum fstate { F_READY, F_WAIT, F_DONE };
enum fwait { W_NONE, W_SYNC, W_SHFL };

struct fiber {
	void *sp;		/* saved stack pointer while switched out */
	char *stack;		/* mmap'ed, a guard page below */
	size_t stack_bytes;
	uint3 tid;
	unsigned lane, warp;
	fstate state;
	fwait wait;
	uint64_t gen;		/* the barrier generation it waits on */
	void *fake_stack;	/* AddressSanitizer's, while switched out */
#if !defined(__x86_64__)
	ucontext_t uc;
#endif
};

/* One warp's exchange: values are written into the generation's half, read after all lanes arrive. */
struct warp_x {
	unsigned live;		/* lanes this block has in the warp */
	unsigned arrived;	/* lanes at the current shuffle */
	unsigned mask;		/* its mask, as the first lane gave it */
	uint64_t gen;
	uint64_t val[2][32];
};

struct block_run {
	const launch_cfg *cfg;
	const std::function<void()> *body;
	std::vector<fiber> f;	/* kept across launches: the stacks are reused */
	std::vector<warp_x> w;
	unsigned n;		/* threads of the block */
	unsigned done;
	unsigned sync_arrived;
	uint64_t sync_gen;
	std::vector<unsigned> rq;	/* ready fibers, a ring of n + 1 */
	size_t rq_head, rq_tail;
	fiber *cur;		/* NULL on the launching thread's own stack */
	void *main_sp;
	void *main_fake;
	const void *main_bottom;
	size_t main_size;
	bool abort;
	std::string fault;
	std::vector<unsigned char> smem;
#if !defined(__x86_64__)
	ucontext_t main_uc;
#endif
	~block_run()
	{
		for (fiber &x : f)
			if (x.stack)
				munmap(x.stack - 4096, x.stack_bytes + 4096);
	}
};

block_run RUN;
std::mutex grid_mu;

#if defined(__x86_64__)
/*
 * swap(save, load): push the callee-saved registers, store rsp in *save,
 * load rsp from load, pop the same. MXCSR and the x87 control word are
 * the launching thread's throughout: no kernel changes them.
 */
extern "C" void cudasim_swap(void **save, void *load);
__asm__(".text\n"
	".globl cudasim_swap\n"
	".type cudasim_swap,@function\n"
	"cudasim_swap:\n"
	"	pushq %rbp\n"
	"	pushq %rbx\n"
	"	pushq %r12\n"
	"	pushq %r13\n"
	"	pushq %r14\n"
	"	pushq %r15\n"
	"	movq %rsp, (%rdi)\n"
	"	movq %rsi, %rsp\n"
	"	popq %r15\n"
	"	popq %r14\n"
	"	popq %r13\n"
	"	popq %r12\n"
	"	popq %rbx\n"
	"	popq %rbp\n"
	"	ret\n"
	".size cudasim_swap, .-cudasim_swap\n");
#endif

void fiber_entry(void);

/* Go from the running context (a fiber, or the launcher when from is NULL) to another. */
void jump(fiber *from, fiber *to)
{
	block_run &R = RUN;
	void **save = from ? &from->sp : &R.main_sp;
	R.cur = to;
	cur_tid = to ? &to->tid : nullptr;
#ifdef SIM_ASAN
	void **fake = from ? (from->state == F_DONE ? nullptr : &from->fake_stack) : &R.main_fake;
	__sanitizer_start_switch_fiber(fake, to ? (const void *)to->stack : R.main_bottom,
				       to ? to->stack_bytes : R.main_size);
#endif
#if defined(__x86_64__)
	cudasim_swap(save, to ? to->sp : R.main_sp);
	(void)save;
#else
	(void)save;
	swapcontext(from ? &from->uc : &R.main_uc, to ? &to->uc : &R.main_uc);
#endif
#ifdef SIM_ASAN
	__sanitizer_finish_switch_fiber(from ? from->fake_stack : R.main_fake, nullptr, nullptr);
#endif
}

fiber *rq_pop(void)
{
	block_run &R = RUN;
	if (R.rq_head == R.rq_tail)
		return nullptr;
	fiber *x = &R.f[R.rq[R.rq_head]];
	if (++R.rq_head == R.rq.size())
		R.rq_head = 0;
	return x;
}

void rq_push(fiber *x)
{
	block_run &R = RUN;
	R.rq[R.rq_tail] = (unsigned)(x - R.f.data());
	if (++R.rq_tail == R.rq.size())
		R.rq_tail = 0;
}

/* The running fiber has stopped (waits, returned or was killed): run the next ready one, else the launcher. */
void leave(fiber *me)
{
	jump(me, rq_pop());
}

/* A rule broken: the launch fails with the first such message, and the thread that broke it never resumes. */
[[noreturn]] void fault_here(const std::string &msg)
{
	block_run &R = RUN;
	if (!R.abort) {
		R.abort = true;
		R.fault = msg;
	}
	fiber *me = R.cur;
	if (!me) {
		fprintf(stderr, "cudasim: %s (outside any kernel)\n", msg.c_str());
		abort();
	}
	me->state = F_DONE;
	jump(me, nullptr);
	abort();	/* never resumed */
}

std::string thread_name(const fiber *x)
{
	char b[96];
	snprintf(b, sizeof(b), "thread (%u,%u,%u) (warp %u lane %u)", x->tid.x, x->tid.y, x->tid.z,
		 x->warp, x->lane);
	return b;
}

void fiber_entry(void)
{
#ifdef SIM_ASAN
	__sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
	block_run &R = RUN;
	fiber *me = R.cur;
	(*R.body)();
	me->state = F_DONE;
	R.done++;
	leave(me);
	abort();	/* a finished fiber is never resumed */
}

/* The first frame of a fiber: cudasim_swap's (or swapcontext's) way into fiber_entry. */
void fiber_reset(fiber *x)
{
#ifdef SIM_ASAN
	/* A kernel that faulted left its frames' redzones poisoned on this stack. */
	ASAN_UNPOISON_MEMORY_REGION(x->stack, x->stack_bytes);
#endif
#if defined(__x86_64__)
	/*
	 * The stacks are a power of two apart, so their tops would share the
	 * same cache sets and every switch would miss: each starts 9 lines
	 * (coprime to the 64 sets of a 4 KiB way) further down than the last.
	 */
	const uintptr_t color = (uintptr_t)(x - RUN.f.data()) % 64 * 9 * 64;
	uintptr_t top = ((uintptr_t)x->stack + x->stack_bytes - color) & ~(uintptr_t)15;
	uint64_t *sp = (uint64_t *)top;
	*--sp = 0;				/* fiber_entry's return address: it never returns */
	*--sp = (uint64_t)(uintptr_t)&fiber_entry;	/* where the first swap's ret goes */
	for (int i = 0; i < 6; i++)
		*--sp = 0;			/* rbp rbx r12 r13 r14 r15 */
	x->sp = sp;
#else
	getcontext(&x->uc);
	x->uc.uc_stack.ss_sp = x->stack;
	x->uc.uc_stack.ss_size = x->stack_bytes;
	x->uc.uc_link = nullptr;
	makecontext(&x->uc, fiber_entry, 0);
#endif
	x->state = F_READY;
	x->wait = W_NONE;
	x->fake_stack = nullptr;
}

int fiber_stack(fiber *x)
{
	if (x->stack)
		return 0;
	size_t bytes = STACK_BYTES;
	void *p = mmap(nullptr, bytes + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
		       -1, 0);
	if (p == MAP_FAILED)
		return -ENOMEM;
	mprotect(p, 4096, PROT_NONE);	/* a kernel that overflows its stack faults at once */
	x->stack = (char *)p + 4096;
	x->stack_bytes = bytes;
	return 0;
}

void ready(fiber *x)
{
	x->state = F_READY;
	x->wait = W_NONE;
	rq_push(x);
}

/* Everyone in __syncthreads() goes on. */
void wake_block(void)
{
	block_run &R = RUN;
	for (unsigned i = 0; i < R.n; i++)
		if (R.f[i].state == F_WAIT)
			ready(&R.f[i]);
}

/* The lanes of warp in waiting (all at its shuffle) go on. */
void wake_lanes(unsigned warp, unsigned waiting)
{
	fiber *lane0 = &RUN.f[(size_t)warp * 32];
	for (; waiting; waiting &= waiting - 1)
		ready(lane0 + __builtin_ctz(waiting));
}

/* Why no thread can go on: who waits where, who has returned. */
std::string deadlock(void)
{
	block_run &R = RUN;
	unsigned at_sync = 0, returned = 0;
	std::string warps;
	for (unsigned i = 0; i < R.n; i++) {
		const fiber &x = R.f[i];
		if (x.state == F_DONE)
			returned++;
		else if (x.wait == W_SYNC)
			at_sync++;
	}
	for (unsigned wi = 0; wi < R.w.size(); wi++) {
		const warp_x &W = R.w[wi];
		unsigned waiting = 0, gone = 0;
		for (unsigned i = wi * 32; i < R.n && i < wi * 32 + 32; i++) {
			const fiber &x = R.f[i];
			if (x.state == F_WAIT && x.wait == W_SHFL)
				waiting |= 1u << x.lane;
			if (x.state == F_DONE)
				gone |= 1u << x.lane;
		}
		if (!waiting)
			continue;
		char b[200];
		snprintf(b, sizeof(b),
			 "; warp %u: lanes 0x%08x wait in a shuffle over mask 0x%08x, lanes 0x%08x of it have returned",
			 wi, waiting, W.mask, W.mask & gone);
		warps += b;
	}
	char b[200];
	snprintf(b, sizeof(b), "deadlock: %u of %u threads wait in __syncthreads(), %u have returned",
		 at_sync, R.n, returned);
	std::string s = b;
	if (at_sync && returned)
		s += " (every thread of a block must reach each __syncthreads(); on a device that is undefined)";
	return s + warps;
}

}	/* namespace */

void *dyn_smem(void)
{
	block_run &R = RUN;
	if (!R.cur)
		fault_here("dynamic shared memory asked for outside a kernel");
	return R.smem.empty() ? nullptr : R.smem.data();
}

void syncthreads(void)
{
	block_run &R = RUN;
	fiber *me = R.cur;
	if (!me)
		fault_here("__syncthreads() outside a kernel");
	uint64_t gen = R.sync_gen;
	if (++R.sync_arrived == R.n) {
		/* The last to arrive releases the others and goes straight on. */
		R.sync_arrived = 0;
		R.sync_gen++;
		wake_block();
		return;
	}
	me->state = F_WAIT;
	me->wait = W_SYNC;
	me->gen = gen;
	leave(me);
}

namespace {

/* The rules of a shuffle, each broken one a fault (out of line: the shuffle is the hot path). */
[[noreturn]] __attribute__((noinline, cold)) void shfl_fault(const fiber *me, const warp_x &W,
							     unsigned mask, int width, unsigned src)
{
	char b[256];
	const std::string t = thread_name(me);
	if (width <= 0 || width > 32 || (width & (width - 1)))
		snprintf(b, sizeof(b), "%s: shuffle width %d is not a power of two up to 32", t.c_str(),
			 width);
	else if (!(mask >> me->lane & 1))
		snprintf(b, sizeof(b), "%s: calls a shuffle whose mask 0x%08x leaves it out", t.c_str(),
			 mask);
	else if (mask & ~W.live)
		snprintf(b, sizeof(b), "%s: shuffle mask 0x%08x names lanes the block does not have (0x%08x)",
			 t.c_str(), mask, W.live);
	else if (W.arrived && W.mask != mask)
		snprintf(b, sizeof(b),
			 "%s: shuffle mask 0x%08x while lanes 0x%08x of its warp wait in one over 0x%08x "
			 "(the cudasim takes one shuffle per warp at a time)",
			 t.c_str(), mask, W.arrived, W.mask);
	else
		snprintf(b, sizeof(b), "%s: reads lane %u, which is not in the shuffle's mask 0x%08x "
			 "(undefined on a device)", t.c_str(), src, mask);
	fault_here(b);
}

}	/* namespace */

uint64_t shfl(unsigned mask, uint64_t v, int arg, int xor_mode, int width)
{
	block_run &R = RUN;
	fiber *me = R.cur;
	if (!me)
		fault_here("a warp shuffle outside a kernel");
	warp_x &W = R.w[me->warp];
	const unsigned bit = 1u << me->lane;
	if (width <= 0 || width > 32 || (width & (width - 1)) || !(mask & bit) || (mask & ~W.live) ||
	    (W.arrived && W.mask != mask))
		shfl_fault(me, W, mask, width, 0);
	W.mask = mask;
	const uint64_t gen = W.gen;
	W.val[gen & 1][me->lane] = v;
	W.arrived |= bit;
	if (W.arrived == mask) {
		/* The last lane to arrive lets the others go on and goes on itself. */
		W.arrived = 0;
		W.gen++;
		wake_lanes(me->warp, mask & ~bit);
	} else {
		me->state = F_WAIT;
		me->wait = W_SHFL;
		me->gen = gen;
		leave(me);
	}
	const unsigned base = me->lane & ~(unsigned)(width - 1);
	unsigned src;
	if (xor_mode) {
		src = me->lane ^ (unsigned)arg;
		if (src >= base + (unsigned)width || src < base)
			src = me->lane;	/* outside its segment: a lane keeps its own value */
	} else {
		src = base + ((unsigned)arg & (unsigned)(width - 1));
	}
	if (!(mask >> src & 1))
		shfl_fault(me, W, mask, width, src);
	return W.val[gen & 1][src];
}

int run_grid(const launch_cfg &c, const std::function<void()> &body, std::string *why)
{
	std::lock_guard<std::mutex> lock(grid_mu);
	block_run &R = RUN;
	if (R.cur) {
		*why = "a kernel launched from inside a kernel";
		return -EINVAL;
	}
	const unsigned n = c.block.x * c.block.y * c.block.z;
	if (R.f.size() < n) {
		size_t old = R.f.size();
		R.f.resize(n);
		for (size_t i = old; i < n; i++)
			R.f[i] = fiber();
	}
	for (unsigned i = 0; i < n; i++) {
		if (fiber_stack(&R.f[i])) {
			*why = "no memory for the threads' stacks";
			return -ENOMEM;
		}
	}
#ifdef SIM_ASAN
	if (!R.main_bottom) {
		pthread_attr_t a;
		void *addr;
		size_t sz;
		if (!pthread_getattr_np(pthread_self(), &a)) {
			pthread_attr_getstack(&a, &addr, &sz);
			pthread_attr_destroy(&a);
			R.main_bottom = addr;
			R.main_size = sz;
		}
	}
#endif
	R.cfg = &c;
	R.body = &body;
	R.n = n;
	R.abort = false;
	R.fault.clear();
	R.rq.assign(n + 1, 0);
	R.w.assign((n + 31) / 32, warp_x());
	for (unsigned i = 0; i < n; i++)
		R.w[i / 32].live |= 1u << (i % 32);
	R.smem.resize(c.smem);
	cur_bdim = c.block;
	cur_gdim = c.grid;
	for (unsigned bz = 0; bz < c.grid.z; bz++)
		for (unsigned by = 0; by < c.grid.y; by++)
			for (unsigned bx = 0; bx < c.grid.x; bx++) {
				cur_block = uint3{ bx, by, bz };
				/* Shared memory starts as whatever the last block left: NaNs here. */
				if (!R.smem.empty())
					memset(R.smem.data(), 0xff, R.smem.size());
				R.done = 0;
				R.sync_arrived = 0;
				R.sync_gen = 0;
				R.rq_head = R.rq_tail = 0;
				for (warp_x &W : R.w) {
					W.arrived = 0;
					W.gen = 0;
				}
				for (unsigned i = 0; i < n; i++) {
					fiber &x = R.f[i];
					fiber_reset(&x);
					x.tid = uint3{ i % c.block.x, i / c.block.x % c.block.y,
						       i / (c.block.x * c.block.y) };
					x.lane = i % 32;
					x.warp = i / 32;
					rq_push(&x);
				}
				for (fiber *x; !R.abort && (x = rq_pop());)
					jump(nullptr, x);
				if (!R.abort && R.done != n) {
					R.abort = true;
					R.fault = deadlock();
				}
				if (R.abort) {
					char b[128];
					snprintf(b, sizeof(b), "block (%u,%u,%u): ", bx, by, bz);
					*why = b + R.fault;
					R.cur = nullptr;
					cur_tid = nullptr;
					return -EFAULT;
				}
			}
	R.cur = nullptr;
	cur_tid = nullptr;
	return 0;
}

}	/* namespace cudasim */
