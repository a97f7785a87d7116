/* threadpool.h — a persistent pool of spinning-then-sleeping worker threads. */
#ifndef KVD_CPU_THREADPOOL_H
#define KVD_CPU_THREADPOOL_H

#include <stdint.h>

struct threadpool;

/* Called once per task index; tasks of one run may execute in any order and thread. */
typedef void (*tp_task_fn)(void *ctx, uint32_t task);

/* n_threads counts the caller: n_threads - 1 workers are started. Returns 0 or -errno. */
int threadpool_create(struct threadpool **out, uint32_t n_threads);
void threadpool_destroy(struct threadpool *tp);
uint32_t threadpool_size(const struct threadpool *tp);

/*
 * Run fn(ctx, 0..n_tasks-1) across the pool and the calling thread; returns
 * when all are done. Workers join while tasks are left to claim, and the
 * caller waits only for those that joined: one that is descheduled or
 * asleep is not waited for. Not reentrant: one run at a time per pool.
 */
void threadpool_run(struct threadpool *tp, tp_task_fn fn, void *ctx, uint32_t n_tasks);

#endif
