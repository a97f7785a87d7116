/* kvpool.c — the paged KV cache: one reserved block pool, refcounts, an LRU prefix cache and per-sequence block tables. */
#include "daemon/engine/kvpool.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* For XXH3_state_t on the stack: the header and library come from one package. */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
#include "daemon/log.h"
#include "daemon/probes.h"

#include "kernels/backend.h"

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
};

/* ---- sizes ---- */

size_t kvpool_row_bytes(uint32_t kv_type, uint32_t kv_dim)
{
	switch (kv_type) {
	case KB_F32:
		return (size_t)kv_dim * 4;
	case KB_F16:
		return (size_t)kv_dim * 2;
	case KB_Q8_0:
		/* 32 int8 quants and one f16 scale per 32 elements */
		return kv_dim % 32 ? 0 : (size_t)(kv_dim / 32) * 34;
	default:
		return 0;
	}
}

size_t kvpool_token_bytes(uint32_t kv_type, uint32_t n_layers, uint32_t kv_dim)
{
	size_t row = kvpool_row_bytes(kv_type, kv_dim), out;

	if (!row || __builtin_mul_overflow(row, (size_t)n_layers * 2, &out))
		return 0;
	return out;
}

size_t kvpool_block_bytes(const struct kvpool *p)
{
	return p->block_bytes;
}

const struct kvpool_config *kvpool_config(const struct kvpool *p)
{
	return &p->cfg;
}

uint8_t *kvpool_block(const struct kvpool *p, uint32_t id)
{
	if (id >= p->cfg.n_blocks)
		return NULL;
	return p->base + (size_t)id * p->block_bytes;
}

uint8_t *kvpool_base(const struct kvpool *p)
{
	return p->base;
}

/* ---- block lists ---- */

static void list_init(struct blist *l)
{
	l->head = l->tail = NONE;
	l->n = 0;
}

static void list_push_head(struct kvpool *p, struct blist *l, uint32_t id)
{
	p->prev[id] = NONE;
	p->next[id] = l->head;
	if (l->head != NONE)
		p->prev[l->head] = id;
	else
		l->tail = id;
	l->head = id;
	l->n++;
}

static void list_push_tail(struct kvpool *p, struct blist *l, uint32_t id)
{
	p->next[id] = NONE;
	p->prev[id] = l->tail;
	if (l->tail != NONE)
		p->next[l->tail] = id;
	else
		l->head = id;
	l->tail = id;
	l->n++;
}

static void list_remove(struct kvpool *p, struct blist *l, uint32_t id)
{
	uint32_t pr = p->prev[id], nx = p->next[id];

	if (pr != NONE)
		p->next[pr] = nx;
	else
		l->head = nx;
	if (nx != NONE)
		p->prev[nx] = pr;
	else
		l->tail = pr;
	p->prev[id] = p->next[id] = NONE;
	l->n--;
}

/* ---- hash table: key -> registered block ---- */

static size_t ht_home(const struct kvpool *p, uint64_t key)
{
	/* Keys are XXH3 output already; the multiply only guards against callers' toy keys. */
	return (size_t)((key * 0x9E3779B97F4A7C15ull) >> p->ht_shift);
}

/* Slot holding key, or SIZE_MAX. Terminates: the table is never more than half full. */
static size_t ht_find(const struct kvpool *p, uint64_t key)
{
	for (size_t i = ht_home(p, key);; i = (i + 1) & p->ht_mask) {
		if (p->ht[i].id == NONE)
			return SIZE_MAX;
		if (p->ht[i].key == key)
			return i;
	}
}

static void ht_insert(struct kvpool *p, uint64_t key, uint32_t id)
{
	size_t i = ht_home(p, key);

	while (p->ht[i].id != NONE)
		i = (i + 1) & p->ht_mask;
	p->ht[i].key = key;
	p->ht[i].id = id;
}

/*
 * Backward-shift deletion: pull later entries of the probe run into the
 * hole when the hole lies between their home and their slot, so lookups
 * never need tombstones and the table never degrades.
 */
static void ht_delete(struct kvpool *p, size_t hole)
{
	size_t j = hole;

	for (;;) {
		j = (j + 1) & p->ht_mask;
		if (p->ht[j].id == NONE)
			break;
		size_t home = ht_home(p, p->ht[j].key);
		if (((j - home) & p->ht_mask) >= ((j - hole) & p->ht_mask)) {
			p->ht[hole] = p->ht[j];
			hole = j;
		}
	}
	p->ht[hole].id = NONE;
	p->ht[hole].key = 0;
}

static void unregister_block(struct kvpool *p, uint32_t id)
{
	size_t i = ht_find(p, p->key[id]);

	if (i != SIZE_MAX && p->ht[i].id == id)
		ht_delete(p, i);
	p->registered[id] = 0;
	p->key[id] = 0;
}

/* ---- pool ---- */

void kvpool_destroy(struct kvpool *p)
{
	if (!p)
		return;
	if (p->base && p->be)
		p->be->ops->buf_free(p->be, p->base);
	else if (p->base)
		munmap(p->base, p->pool_bytes);
	free(p->refcount);
	free(p->key);
	free(p->registered);
	free(p->prev);
	free(p->next);
	free(p->ht);
	free(p);
}

int kvpool_create(struct kvpool **out, const struct kvpool_config *cfg)
{
	return kvpool_create_on(out, cfg, NULL);
}

struct backend *kvpool_backend(const struct kvpool *p)
{
	return p->be;
}

int kvpool_create_on(struct kvpool **out, const struct kvpool_config *cfg, struct backend *be)
{
	struct kvpool *p;
	size_t row, block, total;
	uint32_t bt;

	if (!out || !cfg)
		return -EINVAL;
	*out = NULL;
	bt = cfg->block_tokens;
	if (cfg->n_blocks < 1 || cfg->n_layers < 1 || cfg->kv_dim < 1 ||
	    bt < 1 || bt > MAX_BLOCK_TOKENS || (bt & (bt - 1)))
		return -EINVAL;
	row = kvpool_row_bytes(cfg->kv_type, cfg->kv_dim);
	if (!row)
		return -EINVAL;	/* unknown type, or q8_0 with kv_dim % 32 */
	if (__builtin_mul_overflow((size_t)cfg->n_layers, (size_t)2 * bt, &block) ||
	    __builtin_mul_overflow(block, row, &block) ||
	    __builtin_mul_overflow(block, (size_t)cfg->n_blocks, &total))
		return -EINVAL;

	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->cfg = *cfg;
	p->row_bytes = row;
	p->block_bytes = block;
	p->pool_bytes = total;

	if (be && !be->host_mem) {
		/* Device memory, allocated once; only the backend reads and writes it. */
		void *d;
		if (be->ops->buf_alloc(be, &d, total))
			goto err;
		p->be = be;
		p->base = d;
		goto tables;
	}
	/*
	 * One mapping for the whole pool: page aligned (so every block start is
	 * 64-byte aligned whenever block_bytes is, and rows stay naturally
	 * aligned), never moved, returned only at destroy. Pages are committed
	 * on first touch by the kernel.
	 */
	void *m = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		goto err;
	p->base = m;
	if (total >= (2u << 20))
		madvise(m, total, MADV_HUGEPAGE);	/* best effort: fewer TLB misses in attention */
tables:;

	size_t n = cfg->n_blocks;
	p->refcount = calloc(n, sizeof(*p->refcount));
	p->key = calloc(n, sizeof(*p->key));
	p->registered = calloc(n, sizeof(*p->registered));
	p->prev = malloc(n * sizeof(*p->prev));
	p->next = malloc(n * sizeof(*p->next));
	if (!p->refcount || !p->key || !p->registered || !p->prev || !p->next)
		goto err;

	/* At least twice the blocks, a power of two: probe runs stay short. */
	size_t slots = 2;
	unsigned bits = 1;
	while (slots < 2 * n) {
		slots <<= 1;
		bits++;
	}
	p->ht = malloc(slots * sizeof(*p->ht));
	if (!p->ht)
		goto err;
	for (size_t i = 0; i < slots; i++) {
		p->ht[i].key = 0;
		p->ht[i].id = NONE;
		p->ht[i].pad = 0;
	}
	p->ht_mask = slots - 1;
	p->ht_shift = 64 - bits;

	list_init(&p->free);
	list_init(&p->lru);
	/* Pushed in reverse so a fresh pool hands out blocks 0, 1, 2, ... */
	for (uint32_t id = cfg->n_blocks; id-- > 0;)
		list_push_head(p, &p->free, id);

	*out = p;
	return 0;
err:
	kvpool_destroy(p);
	return -ENOMEM;
}

/* ---- blocks ---- */

int kvpool_alloc(struct kvpool *p, uint32_t *id)
{
	uint32_t b;

	if (!p || !id)
		return -EINVAL;
	if (p->free.n) {
		b = p->free.head;
		list_remove(p, &p->free, b);
	} else if (p->lru.n) {
		b = p->lru.head;
		list_remove(p, &p->lru, b);
		unregister_block(p, b);
		p->st.evictions++;
		KVD_PROBE(kv_evict, b);
	} else {
		return -ENOSPC;
	}
	p->refcount[b] = 1;
	p->in_use++;
	*id = b;
	KVD_PROBE(kv_alloc, b, p->in_use, p->lru.n, p->free.n);
	return 0;
}

/* Misuse (a bad id, a block nobody holds) is ignored: it must not corrupt the pool. */
void kvpool_ref(struct kvpool *p, uint32_t id)
{
	if (!p || id >= p->cfg.n_blocks || !p->refcount[id] || p->refcount[id] == UINT32_MAX)
		return;
	p->refcount[id]++;
}

void kvpool_unref(struct kvpool *p, uint32_t id)
{
	if (!p || id >= p->cfg.n_blocks || !p->refcount[id])
		return;
	if (--p->refcount[id])
		return;
	p->in_use--;
	if (p->registered[id])
		list_push_tail(p, &p->lru, id);	/* most recently used end */
	else
		list_push_head(p, &p->free, id);
	KVD_PROBE(kv_free, id, p->in_use, p->lru.n, p->free.n);
}

uint32_t kvpool_refcount(const struct kvpool *p, uint32_t id)
{
	return p && id < p->cfg.n_blocks ? p->refcount[id] : 0;
}

int kvpool_registered(const struct kvpool *p, uint32_t id)
{
	return p && id < p->cfg.n_blocks ? p->registered[id] : 0;
}

/* ---- prefix cache ---- */

uint64_t kvpool_key(uint64_t parent, uint32_t ns, const uint32_t *tokens, uint32_t n)
{
	/* The hashed bytes are (parent u64, ns u32, tokens u32[n]) in host order. */
	if (n <= MAX_BLOCK_TOKENS) {
		uint8_t buf[12 + 4 * MAX_BLOCK_TOKENS];

		memcpy(buf, &parent, 8);
		memcpy(buf + 8, &ns, 4);
		if (n)
			memcpy(buf + 12, tokens, (size_t)n * 4);
		return XXH3_64bits(buf, 12 + (size_t)n * 4);
	}
	XXH3_state_t st;
	XXH3_64bits_reset(&st);
	XXH3_64bits_update(&st, &parent, 8);
	XXH3_64bits_update(&st, &ns, 4);
	XXH3_64bits_update(&st, tokens, (size_t)n * 4);
	return XXH3_64bits_digest(&st);
}

int kvpool_lookup(struct kvpool *p, uint64_t key, uint32_t *id)
{
	size_t i;
	uint32_t b;

	if (!p || !id)
		return -EINVAL;
	i = ht_find(p, key);
	if (i == SIZE_MAX)
		return -ENOENT;
	b = p->ht[i].id;
	if (!p->refcount[b]) {
		list_remove(p, &p->lru, b);
		p->in_use++;
	}
	p->refcount[b]++;
	*id = b;
	return 0;
}

int kvpool_register(struct kvpool *p, uint32_t id, uint64_t key)
{
	if (!p || id >= p->cfg.n_blocks || !p->refcount[id])
		return -EINVAL;
	if (p->registered[id])
		return p->key[id] == key ? 0 : -EINVAL;
	if (ht_find(p, key) != SIZE_MAX)
		return -EEXIST;
	ht_insert(p, key, id);
	p->registered[id] = 1;
	p->key[id] = key;
	return 0;
}

/* ---- sequences ---- */

static uint64_t blocks_for(uint64_t positions, uint32_t bt)
{
	return (positions + bt - 1) / bt;
}

/* Key of the seq's block n_blocks - 1 by the chain over its tokens; 0 for none. */
static uint64_t chain_key(const struct kvseq *s, uint32_t n_blocks, uint32_t bt)
{
	uint64_t key = 0;

	for (uint32_t i = 0; i < n_blocks; i++)
		key = kvpool_key(key, s->ns, s->tokens + (size_t)i * bt, bt);
	return key;
}

/*
 * Room for n_blocks block ids and their n_blocks * bt token ids, so that
 * kvseq_commit never allocates (it runs after the K/V are written).
 */
static int seq_reserve(struct kvseq *s, uint64_t n_blocks, uint32_t bt)
{
	uint64_t n_tok = n_blocks * bt;

	if (n_tok > UINT32_MAX)
		return -EINVAL;
	if (n_blocks > s->cap) {
		uint64_t cap = s->cap ? (uint64_t)s->cap * 2 : 4;
		if (cap < n_blocks)
			cap = n_blocks;
		if (cap > UINT32_MAX)
			cap = UINT32_MAX;
		uint32_t *b = realloc(s->blocks, cap * sizeof(*b));
		if (!b)
			return -ENOMEM;
		s->blocks = b;
		s->cap = (uint32_t)cap;
	}
	if (n_tok > s->tok_cap) {
		uint64_t cap = s->tok_cap ? (uint64_t)s->tok_cap * 2 : 64;
		if (cap < n_tok)
			cap = n_tok;
		if (cap > UINT32_MAX)
			cap = UINT32_MAX;
		uint32_t *t = realloc(s->tokens, cap * sizeof(*t));
		if (!t)
			return -ENOMEM;
		s->tokens = t;
		s->tok_cap = (uint32_t)cap;
	}
	return 0;
}

void kvseq_init(struct kvseq *s, uint32_t ns)
{
	memset(s, 0, sizeof(*s));
	s->ns = ns;
}

void kvseq_release(struct kvpool *p, struct kvseq *s)
{
	if (!s)
		return;
	if (p) {
		p->st.tokens_stored -= s->n_tokens;
		p->st.slots_allocated -= (uint64_t)s->n_blocks * p->cfg.block_tokens;
		while (s->n_blocks)
			kvpool_unref(p, s->blocks[--s->n_blocks]);
	}
	free(s->blocks);
	free(s->tokens);
	memset(s, 0, sizeof(*s));
}

int kvseq_attach_prefix(struct kvpool *p, struct kvseq *s, const uint32_t *tokens, uint32_t n)
{
	uint32_t bt, max, hits;
	uint64_t key = 0;
	int r;

	if (!p || !s || (n && !tokens) || s->n_blocks || s->n_tokens)
		return -EINVAL;
	if (!n)
		return 0;
	bt = p->cfg.block_tokens;
	max = (n - 1) / bt;	/* never the block holding token n - 1 */
	if (max > INT_MAX / bt)
		max = INT_MAX / bt;
	r = seq_reserve(s, max, bt);
	if (r)
		return r;
	for (hits = 0; hits < max; hits++) {
		uint64_t k = kvpool_key(key, s->ns, tokens + (size_t)hits * bt, bt);
		uint32_t id;

		if (kvpool_lookup(p, k, &id))
			break;	/* a chain: nothing past the first miss can hit */
		s->blocks[hits] = id;
		key = k;
	}

	uint32_t hit_tokens = hits * bt;
	if (hit_tokens)
		memcpy(s->tokens, tokens, (size_t)hit_tokens * sizeof(*tokens));
	s->n_blocks = hits;
	s->n_tokens = hit_tokens;
	s->n_keyed = hits;
	s->last_key = key;
	p->st.tokens_stored += hit_tokens;
	p->st.slots_allocated += hit_tokens;
	p->st.prefix_hit_blocks += hits;
	p->st.prefix_hit_tokens += hit_tokens;
	p->st.prefix_miss_blocks += blocks_for(n, bt) - hits;
	p->st.prefix_miss_tokens += n - hit_tokens;
	KVD_PROBE(prefix_lookup, s->ns, hit_tokens, n - hit_tokens);
	return (int)hit_tokens;
}

/* Drop positions [from, n_tokens) and every block no position below from needs. */
static void seq_truncate(struct kvpool *p, struct kvseq *s, uint32_t from)
{
	uint32_t bt = p->cfg.block_tokens;
	uint32_t keep = (uint32_t)blocks_for(from, bt);

	p->st.slots_allocated -= (uint64_t)(s->n_blocks - keep) * bt;
	p->st.tokens_stored -= s->n_tokens - from;
	while (s->n_blocks > keep)
		kvpool_unref(p, s->blocks[--s->n_blocks]);
	s->n_tokens = from;
	if (s->n_keyed > from / bt) {
		s->n_keyed = from / bt;
		s->last_key = chain_key(s, s->n_keyed, bt);
	}
}

int kvseq_prepare(struct kvpool *p, struct kvseq *s, uint32_t from, uint32_t to)
{
	uint32_t bt, have, cow = NONE, id;
	uint64_t want, need;
	int r;

	if (!p || !s || from > s->n_tokens || to < from)
		return -EINVAL;
	bt = p->cfg.block_tokens;
	want = blocks_for(to, bt);
	if (want * bt > UINT32_MAX)
		return -EINVAL;

	seq_truncate(p, s, from);
	have = s->n_blocks;

	/*
	 * The block receiving position from already holds [from - from % bt,
	 * from). Others may read it (refcount > 1) or find it by key
	 * (registered): write into a copy instead.
	 */
	if (to > from && from % bt) {
		uint32_t b = s->blocks[from / bt];
		if (p->refcount[b] > 1 || p->registered[b])
			cow = from / bt;
	}

	/*
	 * Allocation fails only when the free and LRU lists are both empty, so
	 * counting them first makes the call all-or-nothing: no block is
	 * evicted and no copy is made for a request that cannot be met.
	 */
	need = want - have + (cow != NONE);
	if (need > (uint64_t)p->free.n + p->lru.n)
		return -ENOSPC;
	r = seq_reserve(s, want, bt);
	if (r)
		return r;

	if (cow != NONE) {
		uint32_t old = s->blocks[cow];

		if (kvpool_alloc(p, &id))
			return -ENOSPC;	/* unreachable after the count above */
		if (p->be) {
			r = p->be->ops->copy(p->be, kvpool_block(p, id), kvpool_block(p, old),
					     p->block_bytes);
			if (r) {
				kvpool_unref(p, id);
				return r;
			}
		} else {
			memcpy(kvpool_block(p, id), kvpool_block(p, old), p->block_bytes);
		}
		s->blocks[cow] = id;
		kvpool_unref(p, old);
		p->st.cow_copies++;
	}
	while (s->n_blocks < want) {
		if (kvpool_alloc(p, &id)) {
			while (s->n_blocks > have)
				kvpool_unref(p, s->blocks[--s->n_blocks]);
			return -ENOSPC;
		}
		s->blocks[s->n_blocks++] = id;
	}
	p->st.slots_allocated += (uint64_t)(want - have) * bt;
	return 0;
}

int kvseq_commit(struct kvpool *p, struct kvseq *s, uint32_t from, uint32_t to,
		 const uint32_t *tokens)
{
	uint32_t bt;

	if (!p || !s || from != s->n_tokens || to < from || (to > from && !tokens))
		return -EINVAL;
	if (to == from)
		return 0;
	bt = p->cfg.block_tokens;
	if ((uint64_t)to > (uint64_t)s->n_blocks * bt || to > s->tok_cap)
		return -EINVAL;
	/* Every block written must have been made private by kvseq_prepare. */
	for (uint32_t i = from / bt; i <= (to - 1) / bt; i++) {
		uint32_t b = s->blocks[i];
		if (b >= p->cfg.n_blocks || p->refcount[b] != 1 || p->registered[b])
			return -EINVAL;
	}

	memcpy(s->tokens + from, tokens, (size_t)(to - from) * sizeof(*tokens));
	p->st.tokens_stored += to - from;
	s->n_tokens = to;
	for (uint32_t i = s->n_keyed; i < to / bt; i++) {
		uint64_t key = kvpool_key(s->last_key, s->ns, s->tokens + (size_t)i * bt, bt);

		/*
		 * -EEXIST: another sequence computed the same prefix first; this
		 * block stays private, but the chain still advances so the blocks
		 * after it get the keys a later prompt will look up.
		 */
		kvpool_register(p, s->blocks[i], key);
		s->last_key = key;
		s->n_keyed = i + 1;
	}
	return 0;
}

int kvseq_fork(struct kvpool *p, struct kvseq *dst, const struct kvseq *src)
{
	uint32_t bt, nb;
	int r;

	if (!p || !dst || !src || dst == src || dst->n_blocks || dst->n_tokens)
		return -EINVAL;
	bt = p->cfg.block_tokens;
	/* Only blocks holding written positions: src's prepared blocks stay its own. */
	nb = (uint32_t)blocks_for(src->n_tokens, bt);
	r = seq_reserve(dst, nb, bt);
	if (r)
		return r;
	for (uint32_t i = 0; i < nb; i++) {
		dst->blocks[i] = src->blocks[i];
		kvpool_ref(p, src->blocks[i]);
	}
	if (src->n_tokens)
		memcpy(dst->tokens, src->tokens, (size_t)src->n_tokens * sizeof(*src->tokens));
	dst->n_blocks = nb;
	dst->n_tokens = src->n_tokens;
	dst->n_keyed = src->n_keyed;
	dst->last_key = src->last_key;
	dst->ns = src->ns;	/* the key chain was computed in src's namespace */
	p->st.tokens_stored += src->n_tokens;
	p->st.slots_allocated += (uint64_t)nb * bt;
	return 0;
}

void kvpool_get_stats(const struct kvpool *p, struct kvpool_stats *out)
{
	*out = p->st;
	out->blocks_total = p->cfg.n_blocks;
	out->blocks_in_use = p->in_use;
	out->blocks_cached = p->lru.n;
	out->blocks_free = p->free.n;
	out->bytes_total = p->pool_bytes;
	out->bytes_used = (uint64_t)p->in_use * p->block_bytes;
}

/* ---- invariants ---- */

/* A broken invariant: -EUCLEAN with what broke in err. */
#define bad(err, len, ...) log_errf((err), (len), -EUCLEAN, __VA_ARGS__)

/* Walk one list: well linked, each block once, in the right state. mark[] records the list. */
static int check_list(const struct kvpool *p, const struct blist *l, uint8_t want_reg,
		      uint8_t tag, uint8_t *mark, char *err, size_t len)
{
	const char *name = tag == 1 ? "free" : "LRU";
	uint32_t prev = NONE, count = 0;

	for (uint32_t id = l->head; id != NONE; prev = id, id = p->next[id]) {
		if (id >= p->cfg.n_blocks)
			return bad(err, len, "%s list: block id %u out of range", name, id);
		if (mark[id])
			return bad(err, len, "%s list: block %u reached twice (cycle or on both lists)",
				   name, id);
		mark[id] = tag;
		if (p->prev[id] != prev)
			return bad(err, len, "%s list: block %u has prev %u, expected %u",
				   name, id, p->prev[id], prev);
		if (p->refcount[id])
			return bad(err, len, "%s list: block %u has refcount %u",
				   name, id, p->refcount[id]);
		if (p->registered[id] != want_reg)
			return bad(err, len, "%s list: block %u is %sregistered",
				   name, id, want_reg ? "not " : "");
		count++;
	}
	if (l->tail != prev)
		return bad(err, len, "%s list: tail %u, last block reached %u", name, l->tail, prev);
	if (l->n != count)
		return bad(err, len, "%s list: count %u, %u blocks linked", name, l->n, count);
	return 0;
}

static int check_table(const struct kvpool *p, char *err, size_t len)
{
	uint64_t occupied = 0, registered = 0;

	for (size_t i = 0; i <= p->ht_mask; i++) {
		const struct ht_slot *h = &p->ht[i];

		if (h->id == NONE)
			continue;
		occupied++;
		if (h->id >= p->cfg.n_blocks)
			return bad(err, len, "hash slot %zu: block id %u out of range", i, h->id);
		if (!p->registered[h->id] || p->key[h->id] != h->key)
			return bad(err, len, "hash slot %zu: key %016llx -> block %u, which is %s",
				   i, (unsigned long long)h->key, h->id,
				   p->registered[h->id] ? "registered under another key"
							: "not registered");
		if (ht_find(p, h->key) != i)
			return bad(err, len, "hash slot %zu: key %016llx unreachable from its home slot "
				   "or stored twice", i, (unsigned long long)h->key);
	}
	for (uint32_t id = 0; id < p->cfg.n_blocks; id++)
		registered += p->registered[id];
	if (occupied != registered)
		return bad(err, len, "hash table holds %llu keys, %llu blocks are registered",
			   (unsigned long long)occupied, (unsigned long long)registered);
	return 0;
}

static int check_seq(const struct kvpool *p, const struct kvseq *s, size_t k,
		     uint32_t *refs, uint32_t *owner, char *err, size_t len)
{
	uint32_t bt = p->cfg.block_tokens;
	uint64_t slots = (uint64_t)s->n_blocks * bt;
	uint32_t written = (uint32_t)blocks_for(s->n_tokens, bt);
	uint64_t key = 0;

	if (s->n_blocks > s->cap || (s->n_blocks && !s->blocks))
		return bad(err, len, "seq %zu: %u blocks, capacity %u", k, s->n_blocks, s->cap);
	if (s->n_tokens > slots)
		return bad(err, len, "seq %zu: %u tokens in %u blocks", k, s->n_tokens, s->n_blocks);
	if (slots > s->tok_cap || (s->tok_cap && !s->tokens))
		return bad(err, len, "seq %zu: token capacity %u below %llu slots",
			   k, s->tok_cap, (unsigned long long)slots);
	if (s->n_keyed != s->n_tokens / bt)
		return bad(err, len, "seq %zu: %u blocks keyed, %u full", k, s->n_keyed,
			   s->n_tokens / bt);
	for (uint32_t i = 0; i < s->n_blocks; i++) {
		uint32_t b = s->blocks[i];

		if (b >= p->cfg.n_blocks)
			return bad(err, len, "seq %zu: block %u is id %u, out of range", k, i, b);
		if (owner[b] == k + 1)
			return bad(err, len, "seq %zu: block id %u appears twice", k, b);
		owner[b] = (uint32_t)(k + 1);
		refs[b]++;
		if (i >= written && (p->refcount[b] != 1 || p->registered[b]))
			return bad(err, len, "seq %zu: prepared block %u (id %u) is shared or registered",
				   k, i, b);
		if (i < s->n_keyed) {
			key = kvpool_key(key, s->ns, s->tokens + (size_t)i * bt, bt);
			if (p->registered[b] && p->key[b] != key)
				return bad(err, len, "seq %zu: block %u (id %u) registered under %016llx, "
					   "its tokens give %016llx", k, i, b,
					   (unsigned long long)p->key[b], (unsigned long long)key);
		}
	}
	if (s->last_key != key)
		return bad(err, len, "seq %zu: last_key %016llx, chain gives %016llx",
			   k, (unsigned long long)s->last_key, (unsigned long long)key);
	return 0;
}

int kvpool_check(const struct kvpool *p, const struct kvseq *const *seqs, size_t n_seqs,
		 char *err, size_t errlen)
{
	uint32_t n, *refs = NULL, *owner = NULL, in_use = 0;
	uint64_t tokens = 0, slots = 0;
	uint8_t *mark = NULL;
	int r;

	if (err && errlen)
		err[0] = '\0';
	if (!p)
		return bad(err, errlen, "no pool");
	n = p->cfg.n_blocks;
	refs = calloc(n, sizeof(*refs));
	owner = calloc(n, sizeof(*owner));
	mark = calloc(n, sizeof(*mark));
	if (!refs || !owner || !mark) {
		r = -ENOMEM;
		goto out;
	}

	r = check_list(p, &p->free, 0, 1, mark, err, errlen);
	if (!r)
		r = check_list(p, &p->lru, 1, 2, mark, err, errlen);
	if (r)
		goto out;
	for (uint32_t id = 0; id < n; id++) {
		if (p->refcount[id] && mark[id]) {
			r = bad(err, errlen, "block %u: refcount %u but on the %s list", id,
				p->refcount[id], mark[id] == 1 ? "free" : "LRU");
			goto out;
		}
		if (!p->refcount[id] && !mark[id]) {
			r = bad(err, errlen, "block %u: refcount 0 but on neither the free nor the LRU list",
				id);
			goto out;
		}
		in_use += p->refcount[id] != 0;
	}
	if (in_use != p->in_use || (uint64_t)in_use + p->free.n + p->lru.n != n) {
		r = bad(err, errlen, "counts: %u blocks referenced (counter %u) + %u free + %u cached != %u",
			in_use, p->in_use, p->free.n, p->lru.n, n);
		goto out;
	}
	r = check_table(p, err, errlen);
	if (r)
		goto out;

	for (size_t k = 0; k < n_seqs; k++) {
		if (!seqs[k]) {
			r = bad(err, errlen, "seq %zu is NULL", k);
			goto out;
		}
		r = check_seq(p, seqs[k], k, refs, owner, err, errlen);
		if (r)
			goto out;
		tokens += seqs[k]->n_tokens;
		slots += (uint64_t)seqs[k]->n_blocks * p->cfg.block_tokens;
	}
	for (uint32_t id = 0; id < n; id++) {
		if (refs[id] != p->refcount[id]) {
			r = bad(err, errlen, "block %u: refcount %u, but the sequences hold %u references",
				id, p->refcount[id], refs[id]);
			goto out;
		}
	}
	if (tokens != p->st.tokens_stored || slots != p->st.slots_allocated)
		r = bad(err, errlen, "stats: tokens_stored %llu (sequences hold %llu), "
			"slots_allocated %llu (sequences hold %llu)",
			(unsigned long long)p->st.tokens_stored, (unsigned long long)tokens,
			(unsigned long long)p->st.slots_allocated, (unsigned long long)slots);
out:
	free(refs);
	free(owner);
	free(mark);
	return r;
}
