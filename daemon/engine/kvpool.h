/* kvpool.h — the paged KV cache: one preallocated pool of blocks, per-sequence block tables, a prefix cache. */
#ifndef KVD_KVPOOL_H
#define KVD_KVPOOL_H

#include <stddef.h>
#include <stdint.h>

/*
 * Block layout. A block holds K and V of block_tokens consecutive positions
 * for every layer and KV head:
 *
 *   block (n_layers, 2, block_tokens, row_bytes)
 *     [l][0][t] = K row of layer l, slot t   (kv_dim elements, RoPE applied)
 *     [l][1][t] = V row of layer l, slot t   (kv_dim elements)
 *
 * row_bytes = kv_dim * 4 (f32), kv_dim * 2 (f16) or kv_dim / 32 * 34 (q8_0).
 * Position p of a sequence lives in block blocks[p / block_tokens], slot
 * p % block_tokens.
 *
 * Not thread-safe: one thread (the scheduler) owns a pool and its sequences.
 * Block ids passed in are checked; misuse (a bad id, unref of an unheld
 * block) is ignored rather than allowed to corrupt the pool.
 */

#define KVPOOL_NONE UINT32_MAX

struct kvpool_config {
	uint32_t n_blocks;
	uint32_t block_tokens;	/* power of two */
	uint32_t n_layers;
	uint32_t kv_dim;	/* n_kv_heads * head_dim; multiple of 32 for q8_0 */
	uint32_t kv_type;	/* KB_F16, KB_F32 or KB_Q8_0 (kernels/backend.h numbering) */
};

struct kvpool_stats {
	uint64_t blocks_total;
	uint64_t blocks_in_use;		/* refcount > 0 */
	uint64_t blocks_cached;		/* refcount 0, holding a registered prefix, evictable */
	uint64_t blocks_free;		/* refcount 0, nothing worth keeping */
	uint64_t tokens_stored;		/* positions held by live sequences */
	uint64_t slots_allocated;	/* block_tokens x blocks held by live sequences (shared blocks once per holder) */
	/*
	 * Per kvseq_attach_prefix of an n-token prompt: hit = blocks (tokens)
	 * attached, miss_tokens = n - hit_tokens, miss_blocks = ceil(n /
	 * block_tokens) - hit_blocks. So hit + miss = all prompt tokens (blocks,
	 * counting a partial last block), and hit / (hit + miss) is the rate.
	 */
	uint64_t prefix_hit_blocks;
	uint64_t prefix_hit_tokens;
	uint64_t prefix_miss_blocks;
	uint64_t prefix_miss_tokens;
	uint64_t evictions;		/* cached blocks reclaimed for new data */
	uint64_t cow_copies;		/* blocks copied before a write */
	uint64_t bytes_total;		/* the pool's reservation */
	uint64_t bytes_used;		/* blocks_in_use x block bytes */
};

struct kvpool;

/*
 * Reserve the whole pool now (one mapping, page aligned). Returns 0,
 * -EINVAL (bad config, or a size that overflows size_t) or -ENOMEM.
 */
int kvpool_create(struct kvpool **out, const struct kvpool_config *cfg);
/*
 * The same, with the blocks in be's memory when be keeps its buffers on a
 * device (allocated once through be, never managed memory; copy-on-write
 * copies go through be too). be NULL or a host-memory backend: as
 * kvpool_create. be must outlive the pool.
 */
/*
 * Commit every page of a host-memory pool now (MADV_POPULATE_WRITE), so
 * that no later write waits on a page fault; blocks keep their contents.
 * 0, nothing to do for a device pool, or -errno (-EINVAL: the kernel, older
 * than 5.14, cannot).
 */
int kvpool_prefault(struct kvpool *p);
struct backend;
int kvpool_create_on(struct kvpool **out, const struct kvpool_config *cfg, struct backend *be);
/* The backend holding the blocks, or NULL for host memory. */
struct backend *kvpool_backend(const struct kvpool *p);
void kvpool_destroy(struct kvpool *p);

/* Bytes of one row (one position, one layer, K or V) and of one block. */
size_t kvpool_row_bytes(uint32_t kv_type, uint32_t kv_dim);
size_t kvpool_block_bytes(const struct kvpool *p);
/* Bytes one position needs across all layers, K and V: 2 · layers · row_bytes. */
size_t kvpool_token_bytes(uint32_t kv_type, uint32_t n_layers, uint32_t kv_dim);
const struct kvpool_config *kvpool_config(const struct kvpool *p);
/* Start of block id, (n_layers, 2, block_tokens, row_bytes); NULL for a bad id. */
uint8_t *kvpool_block(const struct kvpool *p, uint32_t id);
uint8_t *kvpool_base(const struct kvpool *p);

/* ---- blocks ---- */

/*
 * A private block (refcount 1): from the free list, else by evicting the
 * least recently used cached block. -ENOSPC when every block is in use.
 */
int kvpool_alloc(struct kvpool *p, uint32_t *id);
/* Another reference to a block the caller holds (refcount > 0; else ignored). */
void kvpool_ref(struct kvpool *p, uint32_t id);
/* Drop a reference; at 0 a registered block becomes cached (LRU tail), any other free. */
void kvpool_unref(struct kvpool *p, uint32_t id);
/* 0 for a bad id. */
uint32_t kvpool_refcount(const struct kvpool *p, uint32_t id);
int kvpool_registered(const struct kvpool *p, uint32_t id);

/* ---- prefix cache ---- */

/*
 * Key of a full block: 64-bit XXH3 of (parent block's key, namespace, its
 * block_tokens token ids). The first block's parent key is 0. The namespace
 * is the owner's uid, or 0 when prefix sharing is global.
 */
uint64_t kvpool_key(uint64_t parent, uint32_t ns, const uint32_t *tokens, uint32_t n);
/*
 * A registered block with this key: referenced for the caller (refcount + 1)
 * and, if it was cached, taken off the LRU list (it goes back to the most
 * recent end when its last holder lets go). 0 or -ENOENT.
 */
int kvpool_lookup(struct kvpool *p, uint64_t key, uint32_t *id);
/*
 * Publish full block id (held by the caller) under key. -EEXIST when
 * another block already holds the key (the caller keeps its block private).
 * 0 if id is already registered under key; -EINVAL for a bad or unheld id
 * or one registered under another key.
 */
int kvpool_register(struct kvpool *p, uint32_t id, uint64_t key);

/* ---- sequences: block tables ---- */

struct kvseq {
	uint32_t *blocks;	/* (cap,) block ids of positions [0, n_tokens), then any prepared ones */
	uint32_t n_blocks;
	uint32_t cap;
	uint32_t n_tokens;	/* positions whose K/V are written */
	uint32_t *tokens;	/* (tok_cap,) ids at those positions, for prefix keys */
	uint32_t tok_cap;	/* >= n_blocks * block_tokens, so commit never allocates */
	uint32_t n_keyed;	/* leading full blocks whose keys are known; always n_tokens / block_tokens */
	uint64_t last_key;	/* key of block n_keyed - 1, 0 if none */
	uint32_t ns;		/* prefix-cache namespace */
};

void kvseq_init(struct kvseq *s, uint32_t ns);
/* Return every block and free the table. The kvseq can be reused after kvseq_init. */
void kvseq_release(struct kvpool *p, struct kvseq *s);

/*
 * Before a prompt is computed: attach cached blocks for its leading full
 * blocks (never the block holding the prompt's last token, which must be
 * computed for its logits). s must be empty. Returns the number of prompt
 * tokens now served from the cache (a multiple of block_tokens; they are
 * recorded as written, n_tokens = the return value) and counts hits and
 * misses (see kvpool_stats). The walk stops at the first missing key.
 * -EINVAL if s is not empty, -ENOMEM.
 */
int kvseq_attach_prefix(struct kvpool *p, struct kvseq *s, const uint32_t *tokens, uint32_t n);

/*
 * Make positions [from, to) writable: truncates to from (from <= n_tokens),
 * copies a shared or registered partial block before it is written
 * (copy-on-write) and allocates blocks up to position to. On -ENOSPC
 * nothing is lost: the sequence keeps positions [0, from); the truncation
 * stays done, but no block is allocated, evicted or copied. Prepared blocks
 * past n_tokens are private to s. -EINVAL for from > n_tokens or to < from.
 */
int kvseq_prepare(struct kvpool *p, struct kvseq *s, uint32_t from, uint32_t to);

/*
 * After positions [from, to) were written with tokens: record them,
 * n_tokens = to, and register every block that became full (a block whose
 * key is already taken stays private; later keys still chain through it).
 * Never allocates. -EINVAL unless from == n_tokens and every block written
 * was made private by kvseq_prepare (so a shared block is never written).
 */
int kvseq_commit(struct kvpool *p, struct kvseq *s, uint32_t from, uint32_t to,
		 const uint32_t *tokens);

/*
 * dst (empty) shares every block holding src's written positions and takes
 * src's tokens, key chain and namespace; the first write to a shared block
 * copies it. Blocks src prepared but has not committed stay src's alone.
 */
int kvseq_fork(struct kvpool *p, struct kvseq *dst, const struct kvseq *src);

void kvpool_get_stats(const struct kvpool *p, struct kvpool_stats *out);

/* ---- persistence: the pool outliving its process ---- */

/*
 * What survives of a block beside its K/V, in memory that outlives the
 * process (the daemon's state memfd): enough to trust the block after a
 * restart. The pool writes a block's tokens, parent, ns and key before
 * state says KVB_SEALED: its K/V are all written and stay as they are
 * while it is sealed (a sealed block is only ever read; a write goes to a
 * copy or follows an unseal). state is cleared before a block is handed
 * out again, so a crash at any instruction never leaves a record that
 * vouches for K/V being rewritten. stamp orders cached blocks (LRU).
 */
struct kvblock_rec {
	uint64_t key;		/* kvpool_key(parent, ns, tokens) */
	uint64_t parent;	/* key of the block before it in its sequence; 0 for the first */
	uint64_t stamp;		/* when it was last released, for the LRU order */
	uint32_t ns;
	uint32_t state;		/* 0, KVB_SEALED, or KVB_SEALED | KVB_REGISTERED */
	uint32_t tokens[];	/* (block_tokens,) */
};

#define KVB_SEALED	1u
#define KVB_REGISTERED	2u

/* Bytes of one record; the records of a pool are n_blocks of them, back to back. */
size_t kvpool_rec_bytes(uint32_t block_tokens);
/* Bytes of the blocks cfg describes; 0 for a bad config or one that overflows. */
size_t kvpool_pool_bytes(const struct kvpool_config *cfg);

/*
 * A host-memory pool whose blocks are fd's bytes (MAP_SHARED), so they
 * outlive the process: fd is made kvpool_pool_bytes() long if it is not,
 * and what it holds is kept. The caller keeps fd open and owns it.
 */
int kvpool_create_fd(struct kvpool **out, const struct kvpool_config *cfg, int fd);

/*
 * From now on keep the blocks' records at recs (n_blocks records of
 * kvpool_rec_bytes(), 8-aligned): zeroed, or what a previous run of the
 * same pool left there, which kvpool_restore() then reads.
 */
void kvpool_set_records(struct kvpool *p, void *recs);

struct kvpool_restored {
	uint32_t sealed;	/* records that check out */
	uint32_t registered;	/* of them, back in the prefix index (cached) */
	uint32_t dropped;	/* records that did not check out (cleared) */
};

/*
 * After a restart, on a pool no sequence has touched yet: trust the
 * records that check out (a known state, every token id below vocab, the
 * key that parent, ns and tokens give), put the registered ones back in
 * the prefix index (a second block of a key stays out, as at run time)
 * and on the LRU list in their old order; every other block is free and
 * its record cleared. Sequences then find their blocks the usual way,
 * kvseq_attach_prefix().
 */
void kvpool_restore(struct kvpool *p, uint32_t vocab, struct kvpool_restored *out);

/*
 * Check every invariant (each block exactly once in free / cached / in use,
 * refcounts equal the references of the given live sequences, hash table
 * and registered blocks agree, LRU list well formed, every sequence's key
 * chain matches its tokens and the keys of its registered blocks,
 * tokens_stored and slots_allocated are the sequences' sums). seqs must be
 * every live sequence. Returns 0, -ENOMEM, or -EUCLEAN with a message in
 * err. For tests: O(blocks + tokens).
 */
int kvpool_check(const struct kvpool *p, const struct kvseq *const *seqs, size_t n_seqs,
		 char *err, size_t errlen);

#endif
