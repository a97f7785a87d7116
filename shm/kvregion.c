/* kvregion.c — libkvclient's shared region: mapping it, the arena, SQEs in and CQEs out, waiting. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "shm/kvclient.h"
#include "shm/kvclient_priv.h"
#include "shm/kvring.h"

#define KVC_ARENA_ALIGN 64
#define KVC_LOOK_NS 1000000u	/* kvc_peek() looks at the socket at most this often */

static int is_pow2(uint32_t x)
{
	return x && !(x & (x - 1));
}

/* The cached ring indices, the headers': a fresh region starts at 0, but take what is there. */
static void region_indices(struct kvc_conn *c)
{
	c->sq_tail = __atomic_load_n(&c->sq->tail, __ATOMIC_RELAXED);
	__atomic_store_n(&c->cq_head, __atomic_load_n(&c->cq->head, __ATOMIC_RELAXED),
			 __ATOMIC_RELAXED);
}

/* Find the parts of the region at p, r's layout. */
static void region_use(struct kvc_conn *c, uint8_t *p, const struct kvd_session_open_rep *r)
{
	c->region = p;
	c->region_len = r->region_bytes;
	c->layout = *r;
	c->sq = (void *)(p + r->sq_off);
	c->cq = (void *)(p + r->cq_off);
	c->sqes = (void *)(p + r->sqes_off);
	c->cqes = (void *)(p + r->cqes_off);
	c->sq_mask = r->sq_entries - 1;
	c->cq_mask = r->cq_entries - 1;
	region_indices(c);
	c->arena = p + r->arena_off;
	c->arena_len = r->arena_bytes;
}

/* Map fd (r's region) and check its rings say the sizes r does. */
static uint8_t *region_map(const struct kvd_session_open_rep *r, int fd, int *err)
{
	uint8_t *p = kvc__map_fd(fd, r->region_bytes, PROT_READ | PROT_WRITE, err);
	if (!p)
		return NULL;
	struct kvd_ring_hdr *sq = (void *)(p + r->sq_off), *cq = (void *)(p + r->cq_off);
	if (sq->ring_entries != r->sq_entries || cq->ring_entries != r->cq_entries) {
		munmap(p, r->region_bytes);
		*err = -EPROTO;
		return NULL;
	}
	return p;
}

/*
 * Map the region the first SESSION_OPEN passed and find its parts, refusing
 * a layout that does not fit region_bytes: a bad reply must not make us
 * touch memory outside the mapping.
 */
static int kvc_map_region(struct kvc_conn *c, const struct kvd_session_open_rep *r, int fd)
{
	const uint64_t size = r->region_bytes;
	const uint64_t hdr = sizeof(struct kvd_ring_hdr);

	if (!is_pow2(r->sq_entries) || !is_pow2(r->cq_entries) || r->arena_bytes % 4 ||
	    size > SIZE_MAX ||
	    !kvc__in_bounds(r->sq_off, hdr, size) || !kvc__in_bounds(r->cq_off, hdr, size) ||
	    !kvc__in_bounds(r->sqes_off, (uint64_t)r->sq_entries * sizeof(struct kvd_sqe), size) ||
	    !kvc__in_bounds(r->cqes_off, (uint64_t)r->cq_entries * sizeof(struct kvd_cqe), size) ||
	    !kvc__in_bounds(r->arena_off, r->arena_bytes, size) ||
	    (r->sq_off | r->cq_off | r->sqes_off | r->cqes_off | r->arena_off) % 64)
		return -EPROTO;

	int err = 0;
	uint8_t *p = region_map(r, fd, &err);
	if (!p)
		return err;
	region_use(c, p, r);
	c->arena_used = 0;
	return 0;
}

/* Two SESSION_OPEN replies lay their regions out alike: one's pointers serve the other. */
static int same_layout(const struct kvd_session_open_rep *a, const struct kvd_session_open_rep *b)
{
	return a->region_bytes == b->region_bytes && a->sq_entries == b->sq_entries &&
	       a->cq_entries == b->cq_entries && a->arena_bytes == b->arena_bytes &&
	       a->sq_off == b->sq_off && a->sqes_off == b->sqes_off && a->cq_off == b->cq_off &&
	       a->cqes_off == b->cqes_off && a->arena_off == b->arena_off;
}

/*
 * A new connection's region in place of the old, at the same address, so
 * that kvc_arena() pointers callers hold stay valid: mapped aside first,
 * the old arena's bytes (prompts about to be resubmitted) copied in, then
 * mapped over the old one, which replaces it in one step.
 */
static int region_remap(struct kvc_conn *c, const struct kvd_session_open_rep *r, int fd)
{
	int err = 0;
	uint8_t *p = region_map(r, fd, &err);
	if (!p)
		return err;
	memcpy(p + r->arena_off, c->arena, c->arena_len);
	if (mmap(c->region, c->region_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) ==
	    MAP_FAILED) {
		/* The old range may be gone: live on at the new address. */
		region_use(c, p, r);
		return 0;
	}
	/* The same layout at the same address: every pointer stands (the other thread reads them). */
	munmap(p, r->region_bytes);
	region_indices(c);
	return 0;
}

int kvc__opened(struct kvc_conn *c, const struct kvd_session_open_rep *rep, int *fds, int n_fds,
		int must_match)
{
	/* The first open passes exactly the region, kick and call fds; later ones nothing. */
	int first = !c->region_live, err = 0;
	if (!!(rep->flags & KVD_OPENF_FDS) != first || n_fds != (first ? 3 : 0)) {
		kvc__close_fds(fds, n_fds);
		return -EPROTO;
	}
	if (!first)
		return 0;
	if (c->region && same_layout(rep, &c->layout)) {
		err = region_remap(c, rep, fds[0]);
	} else if (c->region && must_match) {
		err = -EPROTO;
	} else {
		/* Other sizes than the lost region's: the caller asked for them. */
		if (c->region)
			munmap(c->region, c->region_len);
		c->region = NULL;
		err = kvc_map_region(c, rep, fds[0]);
	}
	if (err) {
		kvc__close_fds(fds, n_fds);
		return err;
	}
	close(fds[0]);
	kvc__install_fd(&c->kick_fd, fds[1]);
	kvc__install_fd(&c->call_fd, fds[2]);
	c->region_live = 1;
	return 0;
}

uint8_t *kvc_arena(const struct kvc_conn *c, uint32_t *bytes)
{
	if (bytes)
		*bytes = c->arena_len;
	return c->arena;
}

int kvc_arena_alloc(struct kvc_conn *c, uint32_t bytes, uint32_t *off)
{
	if (!c->arena)
		return -ENOTCONN;
	uint64_t len = ((uint64_t)bytes + KVC_ARENA_ALIGN - 1) & ~(uint64_t)(KVC_ARENA_ALIGN - 1);
	if (len > c->arena_len - c->arena_used)
		return -ENOSPC;
	*off = c->arena_used;
	c->arena_used += (uint32_t)len;
	return 0;
}

void kvc_arena_reset(struct kvc_conn *c)
{
	c->arena_used = 0;
}

void kvc__arena_release(struct kvc_conn *c, uint32_t mark)
{
	if (mark <= c->arena_used)
		c->arena_used = mark;
}

int kvc__kick(struct kvc_conn *c)
{
	uint64_t one = 1;
	ssize_t n;
	do
		n = send(c->kick_fd, &one, sizeof(one), MSG_DONTWAIT | MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	/* A full queue (-EAGAIN) has rung already; a refusal means nobody holds the other end. */
	return n < 0 && (errno == ECONNREFUSED || errno == ENOTCONN || errno == EPIPE ||
			 errno == ECONNRESET) ? -EPIPE : 0;
}

int kvc__push(struct kvc_conn *c, const struct kvd_sqe *sqe)
{
	if (!c->region_live)
		return -ENOTCONN;
	uint32_t tail = c->sq_tail;
	if (kvring_space(c->sq, tail) == 0)
		return -EAGAIN;
	if (kvc__flight_add(c, sqe))
		return -ENOMEM;
	c->sqes[tail & c->sq_mask] = *sqe;
	c->sq_tail = ++tail;
	kvring_publish(c->sq, tail);
	return 0;
}

int kvc_submit(struct kvc_conn *c, const struct kvd_sqe *sqe)
{
	pthread_mutex_lock(&c->lock);
	int err = kvc__push(c, sqe);
	/* The fence in kvring_needs_wakeup() orders the tail store before the
	 * flag load; it pairs with the daemon's kvring_set_need_wakeup(). */
	if (!err && kvring_needs_wakeup(c->sq) && kvc__kick(c))
		err = kvc__submit_lost(c, sqe);
	pthread_mutex_unlock(&c->lock);
	return err;
}

int kvc__ring_take(struct kvc_conn *c, struct kvd_cqe *out)
{
	uint32_t head = c->cq_head;
	/* Acquire on the tail pairs with the daemon's release in kvring_publish(),
	 * so the CQE and the arena tokens it names are visible. */
	if (kvring_ready(c->cq, head) == 0)
		return -EAGAIN;
	*out = c->cqes[head & c->cq_mask];
	__atomic_store_n(&c->cq_head, head + 1, __ATOMIC_RELAXED);
	kvring_consume(c->cq, head + 1);
	/* A replay completes nothing sent on this connection. */
	if (!(out->flags & (KVD_CQE_MORE | KVD_CQE_REPLAY)))
		kvc__flight_done(c, out);
	return 0;
}

/* With c->lock held: the next CQE, the pending ones a reconnect made first. 0 or -EAGAIN. */
static int kvc_take(struct kvc_conn *c, struct kvd_cqe *out)
{
	return kvc__pend_take(c, out) ? kvc__ring_take(c, out) : 0;
}

/* The next CQE without blocking or looking at the socket: 0 or -EAGAIN. */
static int peek_once(struct kvc_conn *c, struct kvd_cqe *out)
{
	/* An empty CQ costs no lock: a spinning kvc_wait() leaves the submitter alone. */
	if (__atomic_load_n(&c->pend_head, __ATOMIC_RELAXED) ==
	    __atomic_load_n(&c->pend_tail, __ATOMIC_RELAXED) &&
	    kvring_ready(c->cq, __atomic_load_n(&c->cq_head, __ATOMIC_RELAXED)) == 0)
		return -EAGAIN;
	pthread_mutex_lock(&c->lock);
	int err = kvc_take(c, out);
	pthread_mutex_unlock(&c->lock);
	/*
	 * Completions the CQ could not hold wait in the daemon, which flushes
	 * them when it next runs. Should it be asleep meanwhile, our consuming
	 * alone would not wake it: ring the doorbell then, as a submit would.
	 */
	if (!err && (__atomic_load_n(&c->cq->flags, __ATOMIC_RELAXED) & KVD_RING_CQ_OVERFLOW ||
		     __atomic_load_n(&c->cq->overflow, __ATOMIC_RELAXED)) && kvring_needs_wakeup(c->sq))
		kvc__kick(c);
	return err;
}

/* The socket says the daemon hung up (not merely that it is quiet). */
int kvc__hung_up(struct kvc_conn *c)
{
	struct pollfd p = { .fd = c->sock, .events = POLLIN };
	char b;
	if (poll(&p, 1, 0) <= 0)
		return 0;
	return (p.revents & (POLLHUP | POLLERR)) ||
	       recv(c->sock, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

/* Reconnecting is on: look whether the daemon went, at most every KVC_LOOK_NS. */
static int peek_look(struct kvc_conn *c, struct kvd_cqe *out)
{
	uint64_t t = kvc__now_ns();
	if (t < c->next_look)
		return -EAGAIN;
	c->next_look = t + KVC_LOOK_NS;
	uint32_t gen = __atomic_load_n(&c->gen, __ATOMIC_RELAXED);
	if (!kvc__hung_up(c))
		return -EAGAIN;
	int err = kvc__reconnect_gen(c, gen);
	return err ? err : peek_once(c, out);
}

int kvc_peek(struct kvc_conn *c, struct kvd_cqe *out)
{
	if (!c->cq)
		return -ENOTCONN;
	int err = peek_once(c, out);
	/* (Set under the lock by another thread, maybe: a stale look costs one more try.) */
	if (err == -EAGAIN && __atomic_load_n(&c->reconnect_ms, __ATOMIC_RELAXED) &&
	    !__atomic_load_n(&c->gone, __ATOMIC_RELAXED))
		err = peek_look(c, out);
	return err;
}

void kvc_set_spin(struct kvc_conn *c, unsigned int usec)
{
	c->spin_us = usec;
}

uint64_t kvc__now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

/* The socket became readable or hung up while we waited: the daemon left (or broke protocol). */
static int kvc_sock_event(struct kvc_conn *c)
{
	char b;
	ssize_t n = recv(c->sock, &b, 1, MSG_PEEK | MSG_DONTWAIT);
	return n > 0 ? -EPROTO : -ECONNRESET;
}

int kvc_arm(struct kvc_conn *c)
{
	if (!c->cq)
		return -ENOTCONN;
	/* The fence in kvring_set_need_wakeup() orders the flag store before
	 * the re-check; it pairs with the daemon's kvring_needs_wakeup(). */
	kvring_set_need_wakeup(c->cq);
	if (kvring_ready(c->cq, __atomic_load_n(&c->cq_head, __ATOMIC_RELAXED)) ||
	    __atomic_load_n(&c->pend_head, __ATOMIC_RELAXED) !=
	    __atomic_load_n(&c->pend_tail, __ATOMIC_RELAXED)) {
		kvring_clear_need_wakeup(c->cq);
		return 1;
	}
	return 0;
}

int kvc_ack(struct kvc_conn *c)
{
	if (!c->cq)
		return -ENOTCONN;
	kvring_clear_need_wakeup(c->cq);
	uint64_t v;
	while (recv(c->call_fd, &v, sizeof(v), MSG_DONTWAIT) > 0)
		;
	return 0;
}

/*
 * The socket woke kvc_wait(): hand out what the daemon posted before it
 * left (a drain posts its last CQEs, then hangs up), then reconnect if
 * that is on. 0 with *out, 1 when a reconnect leaves more to wait for, or
 * -errno.
 */
static int wait_sock(struct kvc_conn *c, struct kvd_cqe *out, uint32_t gen)
{
	int err = peek_once(c, out);
	if (err != -EAGAIN)
		return err;
	/* Under the lock: another thread's reconnect may be reading replies off the new socket. */
	pthread_mutex_lock(&c->lock);
	err = c->gen != gen ? 0 : kvc_sock_event(c);
	if (err == -ECONNRESET)
		err = kvc__reconnect_locked(c, gen);
	pthread_mutex_unlock(&c->lock);
	return err ? err : 1;
}

int kvc_wait(struct kvc_conn *c, struct kvd_cqe *out, int timeout_ms)
{
	const uint64_t start = kvc__now_ns();
	const uint64_t deadline = timeout_ms < 0 ? UINT64_MAX :
				  start + (uint64_t)timeout_ms * 1000000u;
	const uint64_t spin_end = start + (uint64_t)c->spin_us * 1000u;

	if (!c->cq)
		return -ENOTCONN;
	for (;;) {
		uint32_t gen = __atomic_load_n(&c->gen, __ATOMIC_RELAXED);
		int err = peek_once(c, out);
		if (err != -EAGAIN)
			return err;
		uint64_t t = kvc__now_ns();
		if (t >= deadline)
			return -ETIMEDOUT;
		if (t < spin_end) {
			cpu_relax();
			continue;
		}
		if (kvc_arm(c) == 1)
			continue;
		int ms = -1;
		if (deadline != UINT64_MAX)
			ms = (int)((deadline - t + 999999u) / 1000000u);
		struct pollfd p[3] = {
			{ .fd = c->call_fd, .events = POLLIN },
			{ .fd = c->sock, .events = POLLIN },
			{ .fd = c->wake_fd, .events = POLLIN },
		};
		int n = poll(p, 3, ms);
		err = n < 0 ? -errno : 0;
		kvc_ack(c);
		if (err)
			return err;
		uint64_t woken;
		if (p[2].revents && read(c->wake_fd, &woken, sizeof(woken)) < 0 && errno != EAGAIN)
			return -errno;
		if (p[0].revents & (POLLERR | POLLNVAL))
			return -EIO;
		if (p[1].revents && (err = wait_sock(c, out, gen)) != 1)
			return err;
	}
}
