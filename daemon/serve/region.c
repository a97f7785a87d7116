/* region.c — the daemon's half of the ring protocol: shared memfd, SQ/CQ, arena, doorbells, overflow list. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/mman.h>
#include <unistd.h>
#include "daemon/log.h"
#include "daemon/serve/region.h"
#include "shm/kvring.h"

void region_init(struct region *rg)
{
	memset(rg, 0, sizeof(*rg));
	rg->memfd = rg->kick_fd = rg->call_fd = rg->peer_kick_fd = rg->peer_call_fd = -1;
}

static int is_pow2(uint32_t x)
{
	return x && !(x & (x - 1));
}

static size_t align64(size_t x)
{
	return (x + 63) & ~(size_t)63;
}

int region_create(struct region *rg, uint32_t sq, uint32_t cq, uint32_t arena)
{
	region_init(rg);
	if (!is_pow2(sq) || !is_pow2(cq) || sq > REGION_MAX_SQ || cq > REGION_MAX_CQ || arena % 4)
		return -EINVAL;
	size_t sq_off = 0, cq_off = align64(sizeof(struct kvd_ring_hdr));
	size_t sqes_off = cq_off + align64(sizeof(struct kvd_ring_hdr));
	size_t cqes_off = sqes_off + align64((size_t)sq * sizeof(struct kvd_sqe));
	size_t arena_off = cqes_off + align64((size_t)cq * sizeof(struct kvd_cqe));
	long page = sysconf(_SC_PAGESIZE);
	size_t total = (arena_off + arena + (size_t)page - 1) & ~((size_t)page - 1);
	int rc = 0;
	uint8_t *p = MAP_FAILED;
	rg->memfd = memfd_create("kvd-session", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (rg->memfd < 0)
		goto err_errno;
	if (ftruncate(rg->memfd, (off_t)total) ||
	    (p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, rg->memfd, 0)) == MAP_FAILED ||
	    /* A client must not shrink the region under the daemon (SIGBUS). */
	    fcntl(rg->memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL))
		goto err_errno;
	int kick[2], call[2];
	if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, kick))
		goto err_errno;
	rg->kick_fd = kick[0];
	rg->peer_kick_fd = kick[1];
	if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, call))
		goto err_errno;
	rg->call_fd = call[0];
	rg->peer_call_fd = call[1];
	/* One way each: the daemon only reads kicks and only writes calls. */
	shutdown(rg->kick_fd, SHUT_WR);
	shutdown(rg->call_fd, SHUT_RD);
	rg->base = p;
	rg->bytes = total;
	rg->sq = (struct kvd_ring_hdr *)(p + sq_off);
	rg->cq = (struct kvd_ring_hdr *)(p + cq_off);
	rg->sqes = (struct kvd_sqe *)(p + sqes_off);
	rg->cqes = (struct kvd_cqe *)(p + cqes_off);
	rg->arena = p + arena_off;
	rg->arena_bytes = arena;
	rg->sq_entries = sq;
	rg->cq_entries = cq;
	kvring_init(rg->sq, sq);
	kvring_init(rg->cq, cq);
	/* The engine thread may be asleep already: the first SQE must kick it. */
	kvring_set_need_wakeup(rg->sq);
	return 0;
err_errno:
	rc = -errno;
	if (p != MAP_FAILED)
		munmap(p, total);
	region_destroy(rg);
	return rc;
}

void region_destroy(struct region *rg)
{
	if (rg->base)
		munmap(rg->base, rg->bytes);
	if (rg->memfd >= 0)
		close(rg->memfd);
	if (rg->kick_fd >= 0)
		close(rg->kick_fd);
	if (rg->call_fd >= 0)
		close(rg->call_fd);
	region_peer_fds_sent(rg);
	while (rg->ovf_head) {
		struct cqe_node *n = rg->ovf_head;
		rg->ovf_head = n->next;
		free(n);
	}
	region_init(rg);
}

/* ---- submissions ---- */

int region_next_sqe(struct region *rg, struct kvd_sqe *out)
{
	/* Acquire pairs with the client's release of tail: the SQEs before it are written. */
	uint32_t tail = kvring_load_tail(rg->sq);
	if (tail - rg->sq_head > rg->sq_entries) {
		/* A tail no producer could have written: skip to it. */
		rg->sq_head = tail;
		region_sq_done(rg);
		return -EINVAL;
	}
	if (rg->sq_head == tail)
		return 0;
	/* One copy out of shared memory; every check and use reads the copy. */
	memcpy(out, &rg->sqes[rg->sq_head & (rg->sq_entries - 1)], sizeof(*out));
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	rg->sq_head++;
	return 1;
}

void region_sq_done(struct region *rg)
{
	/* Release pairs with the client's acquire of head: those slots may be reused. */
	kvring_consume(rg->sq, rg->sq_head);
}

int region_sq_ready(const struct region *rg)
{
	return rg->base && kvring_ready(rg->sq, rg->sq_head);
}

/* ---- the arena ---- */

void region_read(const struct region *rg, uint32_t off, void *dst, size_t n)
{
	memcpy(dst, rg->arena + off, n);
}

void region_put_token(struct region *rg, uint32_t off, uint32_t i, uint32_t tok)
{
	((uint32_t *)(rg->arena + off))[i] = tok;
}

void region_write(struct region *rg, uint32_t off, const void *src, size_t n)
{
	memcpy(rg->arena + off, src, n);
}

/* ---- completions ---- */

static int cq_push(struct region *rg, const struct kvd_cqe *cqe)
{
	/* Acquire pairs with the client's release of head: its slots are free to reuse. */
	uint32_t head = kvring_load_head(rg->cq);
	if (rg->cq_tail - head >= rg->cq_entries)
		return -ENOSPC;
	rg->cqes[rg->cq_tail & (rg->cq_entries - 1)] = *cqe;
	rg->cq_tail++;
	/* Release pairs with the client's acquire of tail: the entry (and tokens) are visible. */
	kvring_publish(rg->cq, rg->cq_tail);
	rg->posted = 1;
	return 0;
}

void region_post(struct region *rg, const struct kvd_cqe *cqe)
{
	if (rg->closed || !rg->base)
		return;
	if (!rg->ovf_head && !cq_push(rg, cqe))
		return;
	/* A full CQ loses nothing: completions wait here in order, like io_uring's overflow list. */
	struct cqe_node *n = malloc(sizeof(*n));
	if (!n) {
		log_msg(LOG_ERR, "out of memory holding a completion");
		return;
	}
	n->next = NULL;
	n->cqe = *cqe;
	if (rg->ovf_tail)
		rg->ovf_tail->next = n;
	else
		rg->ovf_head = n;
	rg->ovf_tail = n;
	rg->n_ovf++;
	__atomic_store_n(&rg->cq->overflow, rg->n_ovf, __ATOMIC_RELAXED);
	__atomic_fetch_or(&rg->cq->flags, KVD_RING_CQ_OVERFLOW, __ATOMIC_RELEASE);
}

void region_flush_overflow(struct region *rg)
{
	while (rg->ovf_head && !cq_push(rg, &rg->ovf_head->cqe)) {
		struct cqe_node *n = rg->ovf_head;
		rg->ovf_head = n->next;
		if (!rg->ovf_head)
			rg->ovf_tail = NULL;
		free(n);
		rg->n_ovf--;
	}
	if (rg->base) {
		__atomic_store_n(&rg->cq->overflow, rg->n_ovf, __ATOMIC_RELAXED);
		if (!rg->n_ovf)
			__atomic_fetch_and(&rg->cq->flags, ~KVD_RING_CQ_OVERFLOW, __ATOMIC_RELEASE);
	}
}

int region_backpressured(const struct region *rg)
{
	return rg->n_ovf >= rg->cq_entries && rg->base;
}

int region_overflow_fits(const struct region *rg)
{
	return rg->n_ovf && rg->cq_tail - kvring_load_head(rg->cq) < rg->cq_entries;
}

/* ---- doorbells ---- */

void region_need_kick(struct region *rg, int on)
{
	if (!rg->base || rg->closed)
		return;
	if (on)
		kvring_set_need_wakeup(rg->sq);
	else
		kvring_clear_need_wakeup(rg->sq);
}

void region_peer_fds_sent(struct region *rg)
{
	if (rg->peer_kick_fd >= 0)
		close(rg->peer_kick_fd);
	if (rg->peer_call_fd >= 0)
		close(rg->peer_call_fd);
	rg->peer_kick_fd = rg->peer_call_fd = -1;
}

/* Kicks read per poll event: a client that floods its doorbell waits for the next one. */
#define REGION_KICKS_PER_ACK 64

void region_ack_kick(struct region *rg)
{
	uint64_t v;
	for (int i = 0; i < REGION_KICKS_PER_ACK; i++)
		if (recv(rg->kick_fd, &v, sizeof(v), MSG_DONTWAIT) < 0)
			break;
}

int region_wake(struct region *rg)
{
	if (!rg->posted || rg->closed)
		return 0;
	rg->posted = 0;
	/* At most one eventfd write per step per connection, and only to a sleeper. */
	if (!kvring_needs_wakeup(rg->cq))
		return 0;
	uint64_t one = 1;
	/*
	 * A full queue means calls are waiting unread: the client is woken
	 * already. A client that closed its end cannot be woken and is not
	 * the daemon's concern.
	 */
	if (send(rg->call_fd, &one, sizeof(one), MSG_DONTWAIT | MSG_NOSIGNAL) < 0 &&
	    errno != EAGAIN && errno != ECONNREFUSED && errno != EPIPE)
		return -errno;
	return 0;
}
