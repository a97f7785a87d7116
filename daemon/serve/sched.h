/*
 * sched.h — continuous batching policy over the
 * server's requests (which rows each step runs, who is preempted when the
 * pool is full, how prefill rows are shared between clients, the per-uid
 * KV quota). It reaches clients only through release.c and the region API,
 * so tests can drive it over connections that have no region at all.
 */
#ifndef KVD_SCHED_H
#define KVD_SCHED_H

#include <stdint.h>

struct engine_row;
struct request;
struct server;
struct sched;

/* Scratch for srv->cfg.max_batch_rows rows; 0 or -ENOMEM. */
int sched_create(struct sched **out, struct server *srv);
void sched_destroy(struct sched *sc);

/*
 * srv->lock held. The step boundary (hang-ups released, closed sessions
 * freed, held completions flushed, SQs drained), then the next step's rows
 * chosen and their KV blocks reserved, preempting where the pool or a
 * quota is full. Returns the number of rows.
 */
uint32_t sched_plan(struct sched *sc);
/* The planned step: *rows (n,) and the request each row serves, *reqs (n,). Returns n. */
uint32_t sched_rows(const struct sched *sc, const struct engine_row **rows,
		    struct request *const **reqs);
/*
 * srv->lock held on entry and on return, dropped for the forward pass: run
 * the planned step, sample, post tokens and completions.
 */
void sched_run(struct sched *sc);

/*
 * srv->lock held. The step boundary alone: hang-ups released, closed
 * sessions freed, held completions flushed, SQs drained (sched_plan does
 * this first).
 */
void sched_housekeeping(struct server *srv);

#endif
