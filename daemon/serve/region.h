/*
 * region.h — the daemon's half of the ring protocol: one connection's shared
 * memfd (SQ, CQ, token arena), its kick and call eventfds, and the overflow
 * list of completions the CQ had no room for. Read it against
 * shm/kvclient.c, the client's half. Everything here runs on the engine
 * thread except region_create() and region_destroy() (loop thread).
 */
#ifndef KVD_REGION_H
#define KVD_REGION_H

#include <stddef.h>
#include <stdint.h>
#include "uapi/kvd.h"

struct cqe_node {
	struct cqe_node *next;
	struct kvd_cqe cqe;
};

/*
 * The doorbells are datagram socketpairs, not eventfds: the daemon keeps
 * one end of each and hands the client the other. Ends of a socketpair are
 * separate open file descriptions, so nothing a client does to its ends
 * (clearing O_NONBLOCK, filling a counter, never reading) can make the
 * daemon's own reads and writes block, and those pass MSG_DONTWAIT anyway.
 */
struct region {
	int memfd;
	int kick_fd;			/* client -> daemon doorbell, the daemon's end */
	int call_fd;			/* daemon -> client doorbell, the daemon's end */
	int peer_kick_fd;		/* the client's ends, until the reply hands them over */
	int peer_call_fd;
	uint8_t *base;			/* NULL until the first session opens */
	size_t bytes;
	struct kvd_ring_hdr *sq;
	struct kvd_ring_hdr *cq;
	struct kvd_sqe *sqes;		/* (sq_entries,) */
	struct kvd_cqe *cqes;		/* (cq_entries,) */
	uint8_t *arena;			/* (arena_bytes,) token ids and text, client-written */
	uint32_t arena_bytes;
	uint32_t sq_entries;
	uint32_t cq_entries;
	uint32_t sq_head;		/* the daemon's head, published to sq->head */
	uint32_t cq_tail;		/* the daemon's tail, published to cq->tail */
	struct cqe_node *ovf_head, *ovf_tail;	/* completions the CQ had no room for */
	uint32_t n_ovf;
	int posted;			/* CQEs posted since the last region_wake() */
	int closed;			/* the client hung up: posts are dropped */
};

/* Limits a client's SESSION_OPEN may ask for. */
#define REGION_MAX_SQ	4096
#define REGION_MAX_CQ	16384

/* An empty region (no memory, fds -1). */
void region_init(struct region *rg);

/*
 * Make the memfd (sealed against shrink and grow), map it, lay out the
 * rings and arena, and open the two eventfds. sq and cq must be powers of
 * two within the limits above, arena a multiple of 4. 0 or -errno; on
 * failure rg is left empty.
 */
int region_create(struct region *rg, uint32_t sq, uint32_t cq, uint32_t arena);
/* Unmap, close the fds, free held completions; rg is empty after. */
void region_destroy(struct region *rg);

static inline int region_live(const struct region *rg)
{
	return rg->base != NULL;
}

/*
 * Copy the next SQE out of shared memory into *out (every later check reads
 * the copy). Returns 1 with an SQE, 0 when the SQ is empty, -EINVAL once
 * when the client published a tail no producer could have written (the
 * ring is skipped to it).
 */
int region_next_sqe(struct region *rg, struct kvd_sqe *out);
/* Publish the head after a run of region_next_sqe(): those SQ slots may be reused. */
void region_sq_done(struct region *rg);
/* SQEs waiting in the SQ. */
int region_sq_ready(const struct region *rg);

/* Copy n bytes at arena offset off (checked by validate_sqe()) out of shared memory. */
void region_read(const struct region *rg, uint32_t off, void *dst, size_t n);
/* Write token tok as the i-th __u32 of the output buffer at arena offset off. */
void region_put_token(struct region *rg, uint32_t off, uint32_t i, uint32_t tok);
/* n bytes of src at arena offset off (checked by the caller). */
void region_write(struct region *rg, uint32_t off, const void *src, size_t n);

/* Post a completion: into the CQ, or onto the overflow list while the CQ is full. */
void region_post(struct region *rg, const struct kvd_cqe *cqe);
/* Move held completions into the CQ as far as it has room. */
void region_flush_overflow(struct region *rg);
/* Back-pressure: as many completions are held as the CQ has entries. */
int region_backpressured(const struct region *rg);
/* Completions are held and the CQ has room for some of them now. */
int region_overflow_fits(const struct region *rg);

/* Arm (on) or clear the SQ's need-wakeup flag: whether the client must kick. */
void region_need_kick(struct region *rg, int on);
/* Consume the kicks waiting (the loop thread, after its poll fired); never blocks. */
void region_ack_kick(struct region *rg);
/* After posting: one call doorbell, and only when the client sleeps on it; never blocks. */
int region_wake(struct region *rg);
/* The client's ends were sent (or could not be): the daemon closes its copies. */
void region_peer_fds_sent(struct region *rg);

#endif
