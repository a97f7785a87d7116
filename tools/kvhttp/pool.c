/* pool.c — kvhttp's kvd connection: its sessions' slots leased to requests, one reader thread routing completions. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/eventfd.h>
#include "tools/common.h"
#include "tools/kvhttp/kvhttp.h"

#define MAX_SESSIONS	64
#define ARENA_WANT	(64u << 20)	/* shared by every slot; a part each */
#define WAIT_SLICE_MS	1000	/* the reader looks at the stop flag this often */

/*
 * One kvd connection. Its rings are shared by all sessions, so one thread
 * (the reader) consumes the CQ and hands each completion to the lease that
 * owns its slot, and submissions take a lock: libkvclient allows exactly
 * one submitter and one consumer at a time.
 */
struct kvh_conn {
	struct kvc_conn		*c;
	pthread_mutex_t		submit_mu;
	pthread_t		reader;
	int			reader_up;
	volatile int		dead;
	volatile int		stop;
	int			refs;		/* under g_mu: leases + being current */
	uint32_t		n_sessions, slots_per, part_bytes;
	uint32_t		sess[MAX_SESSIONS];
	struct kvh_lease	**owner;	/* (n_sessions * slots_per,) under g_mu */
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static struct kvh_conn *g_cur;
static const struct kvh_opts *g_o;
static uint64_t g_tag;

static void conn_free(struct kvh_conn *k)
{
	if (k->reader_up) {
		k->stop = 1;
		pthread_join(k->reader, NULL);
	}
	kvc_close(k->c);
	free(k->owner);
	pthread_mutex_destroy(&k->submit_mu);
	free(k);
}

/*
 * Under g_mu. The last reference puts k on the grave list, freed by
 * reap() once g_mu is released: joining the reader under g_mu would
 * deadlock with its route().
 */
static struct kvh_conn *g_grave[64];
static unsigned int g_n_grave;

static void conn_unref(struct kvh_conn *k)
{
	if (--k->refs == 0) {
		k->stop = 1;
		if (g_n_grave < sizeof(g_grave) / sizeof(g_grave[0]))
			g_grave[g_n_grave++] = k;
	}
}

/* Free what conn_unref() buried; call without g_mu. */
static void reap(void)
{
	for (;;) {
		pthread_mutex_lock(&g_mu);
		struct kvh_conn *k = g_n_grave ? g_grave[--g_n_grave] : NULL;
		pthread_mutex_unlock(&g_mu);
		if (!k)
			return;
		conn_free(k);
	}
}

static void lease_push(struct kvh_lease *l, const struct kvd_cqe *cqe)
{
	struct kvh_cqe_node *n = malloc(sizeof(*n));
	if (!n)
		return;	/* the waiter times out and gives up the request */
	n->cqe = *cqe;
	n->next = NULL;
	pthread_mutex_lock(&l->mu);
	*l->tailp = n;
	l->tailp = &n->next;
	pthread_mutex_unlock(&l->mu);
	uint64_t one = 1;
	if (write(l->efd, &one, sizeof(one)) < 0) {
		/* the counter is full: the waiter is woken already */
	}
}

static void route(struct kvh_conn *k, const struct kvd_cqe *cqe)
{
	uint32_t gs = (uint32_t)(cqe->user_data >> 10) & 0x3fff;
	uint64_t tag = cqe->user_data >> 24;
	pthread_mutex_lock(&g_mu);
	struct kvh_lease *l = gs < k->n_sessions * k->slots_per ? k->owner[gs] : NULL;
	if (l && l->tag == tag)
		lease_push(l, cqe);
	pthread_mutex_unlock(&g_mu);
}

/* Wake every lease of k: the daemon went away. */
static void wake_all(struct kvh_conn *k)
{
	uint64_t one = 1;
	pthread_mutex_lock(&g_mu);
	for (uint32_t i = 0; i < k->n_sessions * k->slots_per; i++)
		if (k->owner[i] && write(k->owner[i]->efd, &one, sizeof(one)) < 0) {
			/* already readable */
		}
	pthread_cond_broadcast(&g_cv);
	pthread_mutex_unlock(&g_mu);
}

static void *reader_main(void *arg)
{
	struct kvh_conn *k = arg;
	struct kvd_cqe cqe;
	while (!k->stop) {
		int rc = kvc_wait(k->c, &cqe, WAIT_SLICE_MS);
		if (rc == 0) {
			route(k, &cqe);
			while (kvc_peek(k->c, &cqe) == 0)
				route(k, &cqe);
		} else if (rc != -ETIMEDOUT && rc != -EINTR) {
			if (g_o->verbose)
				fprintf(stderr, "kvhttp: kvd connection lost: %s\n", tool_conn_error(rc));
			k->dead = 1;
			wake_all(k);
			break;
		}
	}
	return NULL;
}

static int conn_sessions(struct kvh_conn *k, const struct kvd_hello_rep *h)
{
	uint32_t want = g_o->sessions ? g_o->sessions : 8;
	if (want > h->max_sessions)
		want = h->max_sessions;
	if (want > MAX_SESSIONS)
		want = MAX_SESSIONS;
	uint32_t arena = h->max_arena_bytes < ARENA_WANT ? h->max_arena_bytes : ARENA_WANT;
	uint32_t cq = h->max_cq_entries < 4096 ? h->max_cq_entries : 4096;
	for (uint32_t i = 0; i < want; i++) {
		int rc = kvc_session_open_ex(k->c, 0, cq, i ? 0 : arena, &k->sess[i]);
		if (rc == -EMFILE && i > 0)
			break;	/* the uid's session quota: serve with fewer */
		if (rc)
			return rc;
		k->n_sessions = i + 1;
	}
	uint32_t got;
	kvc_arena(k->c, &got);
	k->slots_per = h->max_slots < KVH_MAX_CHOICES ? h->max_slots : KVH_MAX_CHOICES;
	k->part_bytes = (got / (k->n_sessions * k->slots_per)) & ~63u;
	k->owner = calloc((size_t)k->n_sessions * k->slots_per, sizeof(*k->owner));
	return k->owner ? 0 : -ENOMEM;
}

/* A new connection with its sessions open and its reader running; under g_mu. */
static int conn_new(struct kvh_conn **out)
{
	struct kvh_conn *k = calloc(1, sizeof(*k));
	if (!k)
		return -ENOMEM;
	pthread_mutex_init(&k->submit_mu, NULL);
	int rc = kvc_connect(&k->c, g_o->socket);
	if (rc)
		goto fail;
	kvc_set_spin(k->c, 20);
	rc = conn_sessions(k, kvc_info(k->c));
	if (rc)
		goto fail;
	rc = -pthread_create(&k->reader, NULL, reader_main, k);
	if (rc)
		goto fail;
	k->reader_up = 1;
	k->refs = 1;
	*out = k;
	return 0;
fail:
	conn_free(k);
	return rc;
}

int kvh_pool_init(const struct kvh_opts *o)
{
	g_o = o;
	return 0;
}

void kvh_pool_fini(void)
{
	pthread_mutex_lock(&g_mu);
	if (g_cur)
		conn_unref(g_cur);
	g_cur = NULL;
	pthread_mutex_unlock(&g_mu);
	reap();
}

/* The current connection, (re)connecting when there is none or it died; under g_mu. */
static int current(struct kvh_conn **out)
{
	if (g_cur && g_cur->dead) {
		conn_unref(g_cur);
		g_cur = NULL;
	}
	if (!g_cur) {
		int rc = conn_new(&g_cur);
		if (rc)
			return rc;
	}
	*out = g_cur;
	return 0;
}

/* n free slots of one session of k into l; 1 when found. Under g_mu. */
static int take_slots(struct kvh_conn *k, struct kvh_lease *l, uint32_t n)
{
	for (uint32_t s = 0; s < k->n_sessions; s++) {
		uint32_t got = 0;
		for (uint32_t j = 0; j < k->slots_per && got < n; j++)
			if (!k->owner[s * k->slots_per + j])
				l->gslot[got++] = s * k->slots_per + j;
		if (got < n)
			continue;
		l->conn = k;
		l->session_id = k->sess[s];
		l->n = n;
		l->tag = ++g_tag & ((1ull << 40) - 1);
		l->part_bytes = k->part_bytes;
		for (uint32_t i = 0; i < n; i++) {
			k->owner[l->gslot[i]] = l;
			l->slot[i] = l->gslot[i] % k->slots_per;
			l->off[i] = l->gslot[i] * k->part_bytes;
		}
		k->refs++;
		return 1;
	}
	return 0;
}

int kvh_lease_get(struct kvh_lease *l, uint32_t n)
{
	memset(l, 0, sizeof(*l));
	l->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (l->efd < 0)
		return -errno;
	pthread_mutex_init(&l->mu, NULL);
	l->tailp = &l->head;
	struct timespec dl;
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += g_o->queue_s;
	int rc;
	pthread_mutex_lock(&g_mu);
	for (;;) {
		struct kvh_conn *k;
		rc = current(&k);
		if (rc)
			break;
		if (n > k->slots_per) {
			rc = -E2BIG;
			break;
		}
		if (take_slots(k, l, n))
			break;
		if (pthread_cond_timedwait(&g_cv, &g_mu, &dl) == ETIMEDOUT) {
			rc = -EAGAIN;
			break;
		}
	}
	pthread_mutex_unlock(&g_mu);
	reap();
	if (rc) {
		close(l->efd);
		pthread_mutex_destroy(&l->mu);
	}
	return rc;
}

void kvh_lease_put(struct kvh_lease *l)
{
	pthread_mutex_lock(&g_mu);
	for (uint32_t i = 0; i < l->n; i++)
		l->conn->owner[l->gslot[i]] = NULL;
	conn_unref(l->conn);
	pthread_cond_broadcast(&g_cv);
	pthread_mutex_unlock(&g_mu);
	reap();
	for (struct kvh_cqe_node *n = l->head, *nx; n; n = nx) {
		nx = n->next;
		free(n);
	}
	close(l->efd);
	pthread_mutex_destroy(&l->mu);
}

const struct kvd_hello_rep *kvh_lease_info(const struct kvh_lease *l) { return kvc_info(l->conn->c); }
struct kvc_conn *kvh_lease_kvc(const struct kvh_lease *l) { return l->conn->c; }
uint8_t *kvh_lease_arena(const struct kvh_lease *l) { return kvc_arena(l->conn->c, NULL); }

/* Bits 0-1 kind, 2-9 choice, 10-23 the slot's index in the table, 24-63 the lease's tag. */
uint64_t kvh_lease_ud(const struct kvh_lease *l, uint32_t i, int kind)
{
	return (l->tag << 24) | ((uint64_t)l->gslot[i] << 10) | ((uint64_t)i << 2) | (uint64_t)kind;
}

int kvh_lease_submit(struct kvh_lease *l, const struct kvd_sqe *sqe)
{
	for (int tries = 0;; tries++) {
		if (l->conn->dead)
			return -ECONNRESET;
		pthread_mutex_lock(&l->conn->submit_mu);
		int rc = kvc_submit(l->conn->c, sqe);
		pthread_mutex_unlock(&l->conn->submit_mu);
		if (rc != -EAGAIN)
			return rc;
		/* A full SQ drains as the daemon's loop runs; the reader keeps the CQ moving. */
		tool_sleep_s(0.001);
	}
}

static int lease_pop(struct kvh_lease *l, struct kvd_cqe *out)
{
	pthread_mutex_lock(&l->mu);
	struct kvh_cqe_node *n = l->head;
	if (n) {
		l->head = n->next;
		if (!l->head)
			l->tailp = &l->head;
	}
	pthread_mutex_unlock(&l->mu);
	if (!n)
		return 0;
	*out = n->cqe;
	free(n);
	return 1;
}

int kvh_lease_wait(struct kvh_lease *l, struct kvd_cqe *out, int client_fd, int timeout_ms)
{
	for (;;) {
		if (lease_pop(l, out))
			return 0;
		if (l->conn->dead)
			return -ECONNRESET;
		struct pollfd p[2] = { { l->efd, POLLIN, 0 }, { client_fd, POLLRDHUP, 0 } };
		int rc = poll(p, client_fd >= 0 ? 2 : 1, timeout_ms);
		if (rc < 0 && errno != EINTR)
			return -errno;
		if (rc == 0)
			return -ETIMEDOUT;
		if (client_fd >= 0 && (p[1].revents & (POLLRDHUP | POLLHUP | POLLERR)))
			return -EPIPE;
		uint64_t v;
		if (p[0].revents & POLLIN && read(l->efd, &v, sizeof(v)) < 0) {
			/* raced with another read: nothing lost, the queue is the truth */
		}
	}
}

int kvh_pool_stats(struct kvd_stats_rep *out, struct kvd_hello_rep *hello)
{
	/* A connection of its own: the control socket is not shared with the reader's waits. */
	struct kvc_conn *c;
	int rc = kvc_connect(&c, g_o->socket);
	if (rc)
		return rc;
	rc = kvc_stats(c, out);
	if (hello)
		*hello = *kvc_info(c);
	kvc_close(c);
	return rc;
}
