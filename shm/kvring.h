/* kvring.h — single-producer single-consumer ring helpers over struct kvd_ring_hdr. */
#ifndef KVD_KVRING_H
#define KVD_KVRING_H

#include <stdint.h>
#include "uapi/kvd.h"

/*
 * Both the daemon and libkvclient drive the rings through these helpers.
 * Indices are free-running __u32s; the slot is index & ring_mask. A
 * producer never trusts the consumer's head to be sane: free space is
 * computed with unsigned wrap-around and clamped by the caller where it
 * matters (the daemon treats an SQ with tail - head > entries as corrupt).
 */

/* Consumer side: the producer's tail, acquire — pairs with kvring_publish()'s release. */
static inline uint32_t kvring_load_tail(const struct kvd_ring_hdr *r)
{
	return __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE);
}

/* Producer side: the consumer's head, acquire — pairs with kvring_consume()'s release. */
static inline uint32_t kvring_load_head(const struct kvd_ring_hdr *r)
{
	return __atomic_load_n(&r->head, __ATOMIC_ACQUIRE);
}

/* Producer: entries up to new_tail are written; release pairs with kvring_load_tail(). */
static inline void kvring_publish(struct kvd_ring_hdr *r, uint32_t new_tail)
{
	__atomic_store_n(&r->tail, new_tail, __ATOMIC_RELEASE);
}

/* Consumer: slots up to new_head may be reused; release pairs with kvring_load_head(). */
static inline void kvring_consume(struct kvd_ring_hdr *r, uint32_t new_head)
{
	__atomic_store_n(&r->head, new_head, __ATOMIC_RELEASE);
}

/* Entries ready for the consumer (producer's view may be stale, never too large). */
static inline uint32_t kvring_ready(const struct kvd_ring_hdr *r, uint32_t head)
{
	return kvring_load_tail(r) - head;
}

/* Free slots for the producer. */
static inline uint32_t kvring_space(const struct kvd_ring_hdr *r, uint32_t tail)
{
	return r->ring_entries - (tail - kvring_load_head(r));
}

/*
 * Wake-up flags: the consumer sets NEED_WAKEUP, then re-checks the ring
 * before sleeping; the full barrier orders its flag store before that
 * re-check, and pairs with the barrier in kvring_needs_wakeup() that orders
 * the producer's tail store before its flag load. Either the producer sees
 * the flag, or the consumer sees the new tail: no lost wake-up.
 */
static inline void kvring_set_need_wakeup(struct kvd_ring_hdr *r)
{
	__atomic_fetch_or(&r->flags, KVD_RING_NEED_WAKEUP, __ATOMIC_SEQ_CST);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
}

static inline void kvring_clear_need_wakeup(struct kvd_ring_hdr *r)
{
	__atomic_fetch_and(&r->flags, ~KVD_RING_NEED_WAKEUP, __ATOMIC_RELAXED);
}

static inline int kvring_needs_wakeup(const struct kvd_ring_hdr *r)
{
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	return (__atomic_load_n(&r->flags, __ATOMIC_RELAXED) & KVD_RING_NEED_WAKEUP) != 0;
}

/* Initialise a ring header in a fresh region; entries must be a power of two. */
static inline int kvring_init(struct kvd_ring_hdr *r, uint32_t entries)
{
	if (entries == 0 || (entries & (entries - 1)) != 0)
		return -22; /* -EINVAL */
	__builtin_memset(r, 0, sizeof(*r));
	r->ring_entries = entries;
	r->ring_mask = entries - 1;
	return 0;
}

#endif
