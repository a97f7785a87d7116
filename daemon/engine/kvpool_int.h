/* kvpool_int.h — the block pool's insides, shared by kvpool.c (blocks, prefix index) and kvseq.c (block tables). */
#ifndef KVD_KVPOOL_INT_H
#define KVD_KVPOOL_INT_H

#include <stddef.h>
#include <stdint.h>
#include "daemon/engine/kvpool.h"
#include "daemon/log.h"

#define NONE KVPOOL_NONE
#define MAX_BLOCK_TOKENS 1024u

/* One hash table slot; id NONE marks it empty because 0 is a real key. */
struct ht_slot {
	uint64_t key;
	uint32_t id;
	uint32_t pad;
};

/* A doubly linked list threaded through kvpool.prev/next; a block is on at most one. */
struct blist {
	uint32_t head;
	uint32_t tail;
	uint32_t n;
};

struct kvpool {
	struct kvpool_config cfg;
	size_t row_bytes;
	size_t block_bytes;	/* n_layers * 2 * block_tokens * row_bytes */
	size_t pool_bytes;	/* n_blocks * block_bytes */
	uint8_t *base;		/* (n_blocks, n_layers, 2, block_tokens, row_bytes) */
	struct backend *be;	/* owns base when it is device memory; NULL: host mapping */

	uint32_t *refcount;	/* (n_blocks,) */
	uint64_t *key;		/* (n_blocks,) meaningful where registered */
	uint8_t *registered;	/* (n_blocks,) */
	uint32_t *prev;		/* (n_blocks,) links of the free or the LRU list */
	uint32_t *next;		/* (n_blocks,) */
	struct blist free;	/* refcount 0, unregistered; a stack, so reuse stays cache-warm */
	struct blist lru;	/* refcount 0, registered; head = least recently released */
	uint32_t in_use;

	struct ht_slot *ht;	/* (ht_mask + 1,) key -> block, linear probing */
	size_t ht_mask;
	unsigned ht_shift;	/* 64 - log2(ht_mask + 1), for Fibonacci hashing */

	/* Counters; the block counts and byte totals are filled in by kvpool_get_stats. */
	struct kvpool_stats st;

	uint8_t *recs;		/* (n_blocks, rec_bytes) in the state memfd, or NULL */
	size_t rec_bytes;
	uint64_t stamp;		/* the last LRU stamp given */
};

static inline struct kvblock_rec *pool_rec(const struct kvpool *p, uint32_t id)
{
	return (struct kvblock_rec *)(p->recs + (size_t)id * p->rec_bytes);
}

/*
 * A record's state, stored after (release) everything it vouches for, so
 * that whatever instruction a crash stops at, a record that says sealed
 * describes K/V that are all there.
 */
static inline void rec_set_state(struct kvpool *p, uint32_t id, uint32_t state)
{
	if (p->recs)
		__atomic_store_n(&pool_rec(p, id)->state, state, __ATOMIC_RELEASE);
}

/* Seal block id of a sequence: its K/V are written and its key is known. */
void kvpool_seal(struct kvpool *p, uint32_t id, uint64_t parent, uint32_t ns, uint64_t key,
		 const uint32_t *tokens);

/* A broken invariant: -EUCLEAN with what broke in err. */
#define bad(err, len, ...) log_errf((err), (len), -EUCLEAN, __VA_ARGS__)

/*
 * kvpool_check's part for sequence k (see there): adds its references to
 * refs (n_blocks,) and marks its blocks k + 1 in owner (n_blocks,).
 */
int kvseq_check(const struct kvpool *p, const struct kvseq *s, size_t k, uint32_t *refs,
		uint32_t *owner, char *err, size_t len);

#endif
