/* threadpool.c — workers spin briefly between runs (decode issues hundreds per token), then sleep on a futex. */
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
 * futex calls. A caller waiting for workers yields its core only after
 * YIELD_NS, so an oversubscribed machine still makes progress. Time comes
 * from the vDSO clock, no system call.
 */
#define SPIN_NS 2000000ull
#define YIELD_NS 1000000ull

struct threadpool {
	uint32_t n_threads;
	pthread_t *threads;		/* (n_threads - 1,) */
	/* Bumped (release) by the caller to publish a run; workers acquire it. */
	uint32_t generation;
	uint32_t sleepers;		/* workers that may be in futex_wait */
	int stop;
	tp_task_fn fn;
	void *ctx;
	uint32_t n_tasks;
	uint32_t next_task;		/* claimed with fetch_add */
	uint32_t busy;			/* workers still inside the current run */
};

static long futex(uint32_t *addr, int op, uint32_t val)
{
	return syscall(SYS_futex, addr, op, val, NULL, NULL, 0);
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

static void run_tasks(struct threadpool *tp)
{
	uint32_t t;
	while ((t = __atomic_fetch_add(&tp->next_task, 1, __ATOMIC_RELAXED)) < tp->n_tasks)
		tp->fn(tp->ctx, t);
}

static void *worker(void *arg)
{
	struct threadpool *tp = arg;
	uint32_t seen = 0;
	for (;;) {
		uint32_t gen;
		uint32_t spins = 0;
		uint64_t until = 0;
		/* Acquire pairs with the release increment in threadpool_run(). */
		while ((gen = __atomic_load_n(&tp->generation, __ATOMIC_ACQUIRE)) == seen) {
			cpu_relax();
			if (++spins % 64)
				continue;
			uint64_t t = now_ns();
			if (!until)
				until = t + SPIN_NS;
			if (t < until)
				continue;
			__atomic_fetch_add(&tp->sleepers, 1, __ATOMIC_SEQ_CST);
			futex(&tp->generation, FUTEX_WAIT_PRIVATE, seen);
			__atomic_fetch_sub(&tp->sleepers, 1, __ATOMIC_SEQ_CST);
			until = 0;
		}
		seen = gen;
		if (__atomic_load_n(&tp->stop, __ATOMIC_ACQUIRE))
			return NULL;
		run_tasks(tp);
		/* Release pairs with the caller's acquire wait on busy. */
		__atomic_fetch_sub(&tp->busy, 1, __ATOMIC_RELEASE);
	}
}

static void publish(struct threadpool *tp)
{
	__atomic_fetch_add(&tp->generation, 1, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&tp->sleepers, __ATOMIC_SEQ_CST))
		futex(&tp->generation, FUTEX_WAKE_PRIVATE, INT32_MAX);
}

int threadpool_create(struct threadpool **out, uint32_t n_threads)
{
	if (n_threads == 0)
		return -EINVAL;
	struct threadpool *tp = calloc(1, sizeof(*tp));
	if (!tp)
		return -ENOMEM;
	tp->n_threads = n_threads;
	if (n_threads > 1) {
		tp->threads = calloc(n_threads - 1, sizeof(pthread_t));
		if (!tp->threads) {
			free(tp);
			return -ENOMEM;
		}
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
	publish(tp);
	for (uint32_t i = 0; i + 1 < tp->n_threads; i++)
		pthread_join(tp->threads[i], NULL);
	free(tp->threads);
	free(tp);
}

uint32_t threadpool_size(const struct threadpool *tp)
{
	return tp->n_threads;
}

void threadpool_run(struct threadpool *tp, tp_task_fn fn, void *ctx, uint32_t n_tasks)
{
	if (tp->n_threads == 1 || n_tasks <= 1) {
		for (uint32_t t = 0; t < n_tasks; t++)
			fn(ctx, t);
		return;
	}
	tp->fn = fn;
	tp->ctx = ctx;
	tp->n_tasks = n_tasks;
	__atomic_store_n(&tp->next_task, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&tp->busy, tp->n_threads - 1, __ATOMIC_RELAXED);
	publish(tp);
	run_tasks(tp);
	/* Acquire pairs with each worker's release decrement: their writes are visible after. */
	uint64_t start = 0;
	for (uint32_t spins = 1; __atomic_load_n(&tp->busy, __ATOMIC_ACQUIRE) != 0; spins++) {
		cpu_relax();
		if (spins % 64)
			continue;
		uint64_t t = now_ns();
		if (!start)
			start = t;
		else if (t - start > YIELD_NS)
			sched_yield();
	}
}
