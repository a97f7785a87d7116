/* threadpool.c — workers join a run only while it is open, spin briefly between runs, then sleep on a futex. */
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "kernels/cpu/threadpool.h"

/*
 * Between two runs a worker spins for SPIN_NS before it sleeps: the gaps
 * inside and between engine steps are shorter, so a busy daemon makes no
 * futex calls. Past the first SPIN_YIELD_NS of a gap it yields while it
 * spins: when other processes load the cores, the spinning would take the
 * core from a thread that has work, and sched_yield() returns at once on an
 * idle core. A caller waiting for workers still inside its run spins for
 * WAIT_SPIN_NS, then sleeps until the last one leaves: a sleeper woken gets
 * the core back promptly, where a yielder would queue behind a busy loop
 * for a whole time slice. Time comes from the vDSO clock, no system call.
 */
#define SPIN_NS 2000000ull
#define SPIN_YIELD_NS 50000ull
#define WAIT_SPIN_NS 50000ull

/*
 * The run word: the generation in the high bits, RUN_OPEN while tasks are
 * left to claim, and the workers inside the run in the low bits. A worker
 * joins with a CAS that requires RUN_OPEN, so the caller waits only for
 * workers that joined: a worker descheduled by another process, or still
 * asleep, costs the caller nothing, and one that arrives after the run
 * closed does nothing. fn, ctx and the segments are read only after joining,
 * and the caller rewrites them only when no worker is inside.
 */
#define RUN_ACTIVE 0x7fffu
#define RUN_OPEN 0x8000u
#define RUN_GEN_SHIFT 16
#define RUN_GEN(s) ((s) >> RUN_GEN_SHIFT)
/* Idle workers and the waiting caller sleep on the run word, woken apart by futex bitset. */
#define WAKE_WORKERS 1u
#define WAKE_CALLER 2u

/*
 * A run's tasks are cut into one contiguous segment per thread. A thread
 * takes its own segment's tasks from the front, in order, then the others'
 * from the back, one at a time: each thread reads one stream of memory
 * (a matmul's weight rows: the prefetches ahead stay useful from one task
 * to the next, and the claims stay in the thread's own cache line) until
 * the ends meet, and a thread that was never scheduled costs the others at
 * most the task it holds, as with one shared counter. fb packs the
 * segment's next task (low half) and its end (high half).
 */
struct seg {
	uint64_t fb;
} __attribute__((aligned(64)));

struct threadpool {
	uint32_t n_threads;
	pthread_t *threads;		/* (n_threads - 1,) */
	uint32_t state;			/* the run word above, and the futex */
	uint32_t sleepers;		/* workers that may be in futex_wait */
	uint32_t caller_sleeps;		/* the caller may be in futex_wait */
	int stop;
	tp_task_fn fn;
	void *ctx;
	struct seg *seg;		/* (n_threads,) */
	uint32_t n_segs;		/* of this run */
};

static long futex(uint32_t *addr, int op, uint32_t val, uint32_t bits)
{
	return syscall(SYS_futex, addr, op, val, NULL, NULL, bits);
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

/* A task of g, its first left (front) or its last; 0 when none is left. */
static int claim(struct seg *g, int front, uint32_t *t)
{
	uint64_t v = __atomic_load_n(&g->fb, __ATOMIC_RELAXED);
	for (;;) {
		uint32_t f = (uint32_t)v, b = (uint32_t)(v >> 32);
		if (f >= b)
			return 0;
		uint64_t next = front ? v + 1 : (uint64_t)(b - 1) << 32 | f;
		if (__atomic_compare_exchange_n(&g->fb, &v, next, 1, __ATOMIC_RELAXED,
						__ATOMIC_RELAXED)) {
			*t = front ? f : b - 1;
			return 1;
		}
	}
}

/* Segment id's tasks in order, then every other segment's from its end. */
static void run_tasks(struct threadpool *tp, uint32_t id)
{
	const uint32_t n = tp->n_segs, me = id % n;
	uint32_t t;
	while (claim(&tp->seg[me], 1, &t))
		tp->fn(tp->ctx, t);
	for (uint32_t k = 1; k < n; k++)
		while (claim(&tp->seg[(me + k) % n], 0, &t))
			tp->fn(tp->ctx, t);
}

/* The run word once its generation differs from seen: spin, spin yielding, then sleep. */
static uint32_t wait_run(struct threadpool *tp, uint32_t seen)
{
	uint64_t start = 0;
	uint32_t s;
	/* Acquire pairs with the release store in publish(). */
	for (uint32_t spins = 1; RUN_GEN(s = __atomic_load_n(&tp->state, __ATOMIC_ACQUIRE)) == seen;
	     spins++) {
		cpu_relax();
		if (spins % 64)
			continue;
		uint64_t t = now_ns();
		if (!start)
			start = t;
		if (t - start < SPIN_YIELD_NS)
			continue;
		if (t - start < SPIN_NS) {
			sched_yield();
			continue;
		}
		__atomic_fetch_add(&tp->sleepers, 1, __ATOMIC_SEQ_CST);
		futex(&tp->state, FUTEX_WAIT_BITSET_PRIVATE, s, WAKE_WORKERS);
		__atomic_fetch_sub(&tp->sleepers, 1, __ATOMIC_SEQ_CST);
		start = 0;
	}
	return s;
}

/*
 * 1 if this worker is now inside the run s belongs to, 0 if that run is
 * closed or gone; *id: how many workers are inside with it (the segment it
 * starts on; two may share one, the claims keep each task to one thread).
 */
static int join(struct threadpool *tp, uint32_t s, uint32_t *id)
{
	uint32_t gen = RUN_GEN(s);
	/* Acquire: fn, ctx and the segments of this run are visible after. */
	while ((s & RUN_OPEN) && RUN_GEN(s) == gen)
		if (__atomic_compare_exchange_n(&tp->state, &s, s + 1, 1, __ATOMIC_ACQUIRE,
						__ATOMIC_ACQUIRE)) {
			*id = (s & RUN_ACTIVE) + 1;
			return 1;
		}
	return 0;
}

static void leave(struct threadpool *tp)
{
	/* Release pairs with the caller's acquire wait for no worker inside. */
	uint32_t s = __atomic_sub_fetch(&tp->state, 1, __ATOMIC_SEQ_CST);
	/* Seq_cst against close_run(): either it sees this decrement or this sees it asleep. */
	if (!(s & (RUN_ACTIVE | RUN_OPEN)) && __atomic_load_n(&tp->caller_sleeps, __ATOMIC_SEQ_CST))
		futex(&tp->state, FUTEX_WAKE_BITSET_PRIVATE, 1, WAKE_CALLER);
}

static void *worker(void *arg)
{
	struct threadpool *tp = arg;
	uint32_t seen = 0;
	for (;;) {
		uint32_t s = wait_run(tp, seen);
		seen = RUN_GEN(s);
		if (__atomic_load_n(&tp->stop, __ATOMIC_ACQUIRE))
			return NULL;
		uint32_t id;
		if (!join(tp, s, &id))
			continue;
		run_tasks(tp, id);
		leave(tp);
	}
}

/* A new generation, open or not, with no worker inside. */
static void publish(struct threadpool *tp, uint32_t open)
{
	uint32_t s = __atomic_load_n(&tp->state, __ATOMIC_RELAXED);
	uint32_t next = (RUN_GEN(s) + 1) << RUN_GEN_SHIFT | open;
	__atomic_store_n(&tp->state, next, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&tp->sleepers, __ATOMIC_SEQ_CST))
		futex(&tp->state, FUTEX_WAKE_BITSET_PRIVATE, INT32_MAX, WAKE_WORKERS);
}

int threadpool_create(struct threadpool **out, uint32_t n_threads)
{
	if (n_threads == 0 || n_threads - 1 > RUN_ACTIVE)
		return -EINVAL;
	struct threadpool *tp = calloc(1, sizeof(*tp));
	if (!tp)
		return -ENOMEM;
	tp->n_threads = n_threads;
	tp->seg = aligned_alloc(64, n_threads * sizeof(*tp->seg));
	if (n_threads > 1)
		tp->threads = calloc(n_threads - 1, sizeof(pthread_t));
	if (!tp->seg || (n_threads > 1 && !tp->threads)) {
		free(tp->seg);
		free(tp);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i + 1 < n_threads; i++) {
		int rc = pthread_create(&tp->threads[i], NULL, worker, tp);
		if (rc) {
			tp->n_threads = i + 1;
			threadpool_destroy(tp);
			return -rc;
		}
	}
	*out = tp;
	return 0;
}

void threadpool_destroy(struct threadpool *tp)
{
	if (!tp)
		return;
	__atomic_store_n(&tp->stop, 1, __ATOMIC_RELEASE);
	publish(tp, 0);
	for (uint32_t i = 0; i + 1 < tp->n_threads; i++)
		pthread_join(tp->threads[i], NULL);
	free(tp->threads);
	free(tp->seg);
	free(tp);
}

uint32_t threadpool_size(const struct threadpool *tp)
{
	return tp->n_threads;
}

/* Close the run and wait for the workers inside it; their writes are visible after. */
static void close_run(struct threadpool *tp)
{
	__atomic_fetch_and(&tp->state, ~RUN_OPEN, __ATOMIC_RELAXED);
	uint64_t start = 0;
	uint32_t s;
	/* Acquire pairs with each worker's release decrement. */
	for (uint32_t spins = 1; (s = __atomic_load_n(&tp->state, __ATOMIC_ACQUIRE)) & RUN_ACTIVE;
	     spins++) {
		cpu_relax();
		if (spins % 64)
			continue;
		uint64_t t = now_ns();
		if (!start)
			start = t;
		if (t - start < WAIT_SPIN_NS)
			continue;
		__atomic_store_n(&tp->caller_sleeps, 1, __ATOMIC_SEQ_CST);
		s = __atomic_load_n(&tp->state, __ATOMIC_SEQ_CST);
		if (s & RUN_ACTIVE)
			futex(&tp->state, FUTEX_WAIT_BITSET_PRIVATE, s, WAKE_CALLER);
		__atomic_store_n(&tp->caller_sleeps, 0, __ATOMIC_RELAXED);
	}
}

void threadpool_run(struct threadpool *tp, tp_task_fn fn, void *ctx, uint32_t n_tasks)
{
	if (tp->n_threads == 1 || n_tasks <= 1) {
		for (uint32_t t = 0; t < n_tasks; t++)
			fn(ctx, t);
		return;
	}
	/* No worker is inside: the last run's close_run() saw none, and none can join a closed run. */
	tp->fn = fn;
	tp->ctx = ctx;
	tp->n_segs = n_tasks < tp->n_threads ? n_tasks : tp->n_threads;
	for (uint32_t i = 0; i < tp->n_segs; i++) {
		uint64_t f = (uint64_t)n_tasks * i / tp->n_segs;
		uint64_t b = (uint64_t)n_tasks * (i + 1) / tp->n_segs;
		__atomic_store_n(&tp->seg[i].fb, b << 32 | f, __ATOMIC_RELAXED);
	}
	publish(tp, RUN_OPEN);
	/* The caller alone can do every task: it takes segment 0's, then the others'. */
	run_tasks(tp, 0);
	close_run(tp);
}
