/*
 * worker.c — the engine thread's life: a step boundary, the step the
 * scheduler plans, sleeping when nothing can run (kicks armed, like
 * io_uring's NEED_WAKEUP), waking clients once per step, and the drain on
 * SIGTERM. What runs in a step is sched.c's policy.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "daemon/log.h"
#include "daemon/serve/sched.h"
#include "daemon/serve/server.h"
#include "daemon/serve/worker.h"

static int any_work(struct server *srv)
{
	struct slot *sl;
	srv_for_each_slot(srv, it, sl)
		if (it.s->closing || sl->head)
			return 1;
	for (struct conn *c = srv->conns; c; c = c->next) {
		if (c->released)
			continue;	/* the loop thread frees it */
		if (c->dead)
			return 1;	/* to release */
		if (region_sq_ready(&c->rg) && !region_backpressured(&c->rg))
			return 1;
		/* Held completions for a CQ with room again. */
		if (region_overflow_fits(&c->rg))
			return 1;
	}
	return 0;
}

/* Completions held for a full CQ: the client may free room without a kick, so look again soon. */
static int any_overflow(struct server *srv)
{
	for (struct conn *c = srv->conns; c; c = c->next)
		if (!c->dead && c->rg.n_ovf)
			return 1;
	return 0;
}

/* SQEs the next step boundary will take: a back-pressured client's wait in its ring. */
static int any_new_sqe(struct server *srv)
{
	for (struct conn *c = srv->conns; c; c = c->next)
		if (!c->dead && region_sq_ready(&c->rg) && !region_backpressured(&c->rg))
			return 1;
	return 0;
}

static void set_need_wakeup(struct server *srv, int on)
{
	for (struct conn *c = srv->conns; c; c = c->next)
		region_need_kick(&c->rg, on);
}

/* The drain's end: what still runs is cancelled, marked so its client knows it did not ask. */
static void cancel_everything(struct server *srv)
{
	for (struct conn *c = srv->conns; c; c = c->next)
		for (uint32_t i = 0; !c->dead && i < SRV_MAX_SESSIONS; i++)
			if (c->sessions[i])
				release_session(srv, c, c->sessions[i], KVD_CQE_CANCELLED | KVD_CQE_SHUTDOWN);
}

static void wake_clients(struct server *srv)
{
	for (struct conn *c = srv->conns; c; c = c->next) {
		int rc = region_wake(&c->rg);
		if (rc)
			log_msg(LOG_WARNING, "call eventfd of pid %d: %s", (int)c->pid, strerror(-rc));
	}
}

/*
 * Nothing could run: idle, or waiting for KV blocks. Ask for kicks, look
 * once more, then sleep until a client or the loop thread signals; work
 * that waits for blocks is looked at again after a short while in any case.
 */
static void idle_wait(struct server *srv)
{
	int waiting = any_work(srv) || any_overflow(srv);
	set_need_wakeup(srv, 1);
	if (!waiting || !any_new_sqe(srv)) {
		if (srv->stopping || waiting) {
			struct timespec ts = { 0, 0 };
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += waiting ? 2000000 : 50000000;
			if (ts.tv_nsec >= 1000000000) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000;
			}
			pthread_cond_timedwait(&srv->work, &srv->lock, &ts);
		} else if (!any_new_sqe(srv)) {
			pthread_cond_wait(&srv->work, &srv->lock);
		}
	}
	set_need_wakeup(srv, 0);
}

#define DRAIN_GRACE_NS	500000000ull	/* 0.5 s */

/*
 * The last completions, to clients whose CQ is full: the drain waits (up
 * to its deadline) for them to make room, so every request in flight gets
 * its final CQE; what still cannot be delivered is logged, per client.
 */
static void drain_held(struct server *srv)
{
	for (;;) {
		int held = 0;
		for (struct conn *c = srv->conns; c; c = c->next)
			if (!c->dead) {
				region_flush_overflow(&c->rg);
				held += c->rg.n_ovf != 0;
			}
		wake_clients(srv);
		if (!held || log_now_ns() >= srv->drain_deadline_ns)
			break;
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 2000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&srv->work, &srv->lock, &ts);
	}
	for (struct conn *c = srv->conns; c; c = c->next)
		if (!c->dead && c->rg.n_ovf)
			log_msg(LOG_WARNING, "drain: %u completions for pid %d undelivered: its CQ stayed full",
				c->rg.n_ovf, (int)c->pid);
}

/*
 * SIGTERM with the KV kept: the step in flight is over and every slot's
 * record holds its last request's end, so nothing is drained. Requests in
 * flight end with the connection (a client that resumes learns they were
 * not applied and sends them again); only this process's memory is freed.
 */
static void keep_for_restart(struct server *srv)
{
	uint32_t n = srv->n_sessions, inflight = 0;
	for (struct conn *c = srv->conns; c; c = c->next) {
		inflight += c->dead ? 0 : c->inflight;
		for (uint32_t i = 0; i < SRV_MAX_SESSIONS; i++)
			if (c->sessions[i] && !c->dead)
				release_session(srv, c, c->sessions[i], 0);
	}
	log_msg(LOG_NOTICE, "stopping: %u sessions kept for the next start (%u requests in flight "
		"were not applied: resuming clients send them again)", n, inflight);
}

/* seqs grown by one; 0 or -ENOMEM. */
static int seq_push(const struct kvseq ***seqs, size_t *n, size_t *cap, const struct kvseq *s)
{
	if (*n == *cap) {
		size_t c = *cap ? 2 * *cap : 64;
		const struct kvseq **p = realloc(*seqs, c * sizeof(*p));
		if (!p)
			return -ENOMEM;
		*seqs = p;
		*cap = c;
	}
	(*seqs)[(*n)++] = s;
	return 0;
}

/* $KVD_POOL_CHECK: every block held exactly by the sequences that hold it, at each idle point. */
static void check_pool(struct server *srv)
{
	const struct kvseq **seqs = NULL;
	size_t n = 0, cap = 0;
	int rc = 0;
	struct slot *sl;
	srv_for_each_slot(srv, it, sl)
		rc |= seq_push(&seqs, &n, &cap, &sl->seq.kv);
	/* Hung up, not yet released: their sequences still hold blocks. */
	for (struct conn *c = srv->conns; c; c = c->next)
		for (uint32_t i = 0; c->dead && !c->released && i < SRV_MAX_SESSIONS; i++)
			for (uint32_t k = 0; c->sessions[i] && k < c->sessions[i]->n_slots; k++)
				rc |= seq_push(&seqs, &n, &cap, &c->sessions[i]->slots[k].seq.kv);
	for (struct session *o = srv->orphans; o; o = o->next_orphan)
		for (uint32_t k = 0; k < o->n_slots; k++)
			rc |= seq_push(&seqs, &n, &cap, &o->slots[k].seq.kv);
	char err[256] = "out of memory";
	if (!rc)
		rc = engine_pool_check(srv->eng, seqs, n, err, sizeof(err));
	if (rc)
		log_msg(LOG_ERR, "pool check failed: %s", err);
	else
		log_msg(LOG_INFO, "pool check: ok (%zu sequences)", n);
	free(seqs);
}

void *worker_main(void *arg)
{
	struct server *srv = arg;
	struct sched *sc = NULL;
	int rc = sched_create(&sc, srv);
	pthread_mutex_lock(&srv->lock);
	engine_pool_stats(srv->eng, &srv->pool_stats);	/* admission reads the pool's size */
	if (rc) {
		log_msg(LOG_ERR, "engine thread: out of memory");
		srv->stopping = 1;
	}
	for (;;) {
		uint32_t n = 0;
		if (sc)
			n = sched_plan(sc);
		else
			sched_housekeeping(srv);
		wake_clients(srv);
		engine_pool_stats(srv->eng, &srv->pool_stats);
		if (srv->stopping && srv->ps) {
			keep_for_restart(srv);
			break;
		}
		if (srv->stopping && (!any_work(srv) || log_now_ns() >= srv->drain_deadline_ns || !sc)) {
			cancel_everything(srv);
			/* The cancel just posted final CQEs: a client with a full CQ gets a
			 * moment to take them even when the deadline ended the drain. */
			uint64_t grace = log_now_ns() + DRAIN_GRACE_NS;
			if (srv->drain_deadline_ns < grace)
				srv->drain_deadline_ns = grace;
			drain_held(srv);
			break;
		}
		if (n == 0 && srv->pool_check)
			check_pool(srv);
		if (n == 0)
			idle_wait(srv);
		else
			sched_run(sc);
	}
	srv->engine_exited = 1;
	pthread_mutex_unlock(&srv->lock);
	server_kick_reaper(srv);
	sched_destroy(sc);
	return NULL;
}
