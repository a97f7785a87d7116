/* kvpool.c — the paged KV cache's blocks: one reserved pool, refcounts, the LRU prefix cache and its hash index. */
#include "daemon/engine/kvpool.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* For XXH3_state_t on the stack: the header and library come from one package. */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
#include "daemon/engine/kvpool_int.h"
#include "daemon/probes.h"
#include "kernels/backend.h"
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

/* The bookkeeping beside the blocks: refcounts, keys, list links, the hash index, every block free. */
static int tables_create(struct kvpool *p)
{
	size_t n = p->cfg.n_blocks;
	p->refcount = calloc(n, sizeof(*p->refcount));
	p->key = calloc(n, sizeof(*p->key));
	p->registered = calloc(n, sizeof(*p->registered));
	p->prev = malloc(n * sizeof(*p->prev));
	p->next = malloc(n * sizeof(*p->next));
	if (!p->refcount || !p->key || !p->registered || !p->prev || !p->next)
		return -ENOMEM;

	/* At least twice the blocks, a power of two: probe runs stay short. */
	size_t slots = 2;
	unsigned bits = 1;
	while (slots < 2 * n) {
		slots <<= 1;
		bits++;
	}
	p->ht = malloc(slots * sizeof(*p->ht));
	if (!p->ht)
		return -ENOMEM;
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
	for (uint32_t id = p->cfg.n_blocks; id-- > 0;)
		list_push_head(p, &p->free, id);

	return 0;
}

int kvpool_create(struct kvpool **out, const struct kvpool_config *cfg)
{
	return kvpool_create_on(out, cfg, NULL);
}

struct backend *kvpool_backend(const struct kvpool *p)
{
	return p->be;
}

/* Row, block and pool bytes of cfg; -EINVAL for a bad config or a size that overflows. */
static int pool_sizes(const struct kvpool_config *cfg, size_t *row, size_t *block, size_t *total)
{
	uint32_t bt = cfg->block_tokens;

	if (cfg->n_blocks < 1 || cfg->n_layers < 1 || cfg->kv_dim < 1 ||
	    bt < 1 || bt > MAX_BLOCK_TOKENS || (bt & (bt - 1)))
		return -EINVAL;
	*row = kvpool_row_bytes(cfg->kv_type, cfg->kv_dim);
	if (!*row)
		return -EINVAL;	/* unknown type, or q8_0 with kv_dim % 32 */
	if (__builtin_mul_overflow((size_t)cfg->n_layers, (size_t)2 * bt, block) ||
	    __builtin_mul_overflow(*block, *row, block) ||
	    __builtin_mul_overflow(*block, (size_t)cfg->n_blocks, total))
		return -EINVAL;
	return 0;
}

size_t kvpool_pool_bytes(const struct kvpool_config *cfg)
{
	size_t row, block, total;

	return cfg && !pool_sizes(cfg, &row, &block, &total) ? total : 0;
}

size_t kvpool_rec_bytes(uint32_t block_tokens)
{
	/* 8-aligned, so every record's u64 fields are */
	return (sizeof(struct kvblock_rec) + (size_t)block_tokens * sizeof(uint32_t) + 7) & ~(size_t)7;
}

/* The pool without its blocks, or NULL (*rc says why). */
static struct kvpool *pool_new(const struct kvpool_config *cfg, int *rc)
{
	struct kvpool *p;
	size_t row, block, total;

	*rc = pool_sizes(cfg, &row, &block, &total);
	if (*rc)
		return NULL;
	p = calloc(1, sizeof(*p));
	if (!p) {
		*rc = -ENOMEM;
		return NULL;
	}
	p->cfg = *cfg;
	p->row_bytes = row;
	p->block_bytes = block;
	p->pool_bytes = total;
	return p;
}

int kvpool_create_fd(struct kvpool **out, const struct kvpool_config *cfg, int fd)
{
	struct stat st;
	int rc;

	if (!out || !cfg || fd < 0)
		return -EINVAL;
	*out = NULL;
	struct kvpool *p = pool_new(cfg, &rc);
	if (!p)
		return rc;
	if (fstat(fd, &st) || ((size_t)st.st_size != p->pool_bytes &&
			       ftruncate(fd, (off_t)p->pool_bytes))) {
		rc = -errno;
		kvpool_destroy(p);
		return rc;
	}
	/* Shared, so the blocks stay in fd's pages when the process goes. */
	void *m = mmap(NULL, p->pool_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) {
		rc = -errno;
		kvpool_destroy(p);
		return rc;
	}
	p->base = m;
	if (p->pool_bytes >= (2u << 20))
		madvise(m, p->pool_bytes, MADV_HUGEPAGE);	/* best effort (shmem_enabled=advise) */
	if ((rc = tables_create(p))) {
		kvpool_destroy(p);
		return rc;
	}
	*out = p;
	return 0;
}

int kvpool_create_on(struct kvpool **out, const struct kvpool_config *cfg, struct backend *be)
{
	struct kvpool *p;
	size_t total;
	int rc;

	if (!out || !cfg)
		return -EINVAL;
	*out = NULL;
	if (!(p = pool_new(cfg, &rc)))
		return rc;
	total = p->pool_bytes;

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
tables:
	if (tables_create(p))
		goto err;
	*out = p;
	return 0;
err:
	kvpool_destroy(p);
	return -ENOMEM;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

int kvpool_prefault(struct kvpool *p)
{
	if (!p)
		return -EINVAL;
	if (p->be || !p->pool_bytes)
		return 0;
	return madvise(p->base, p->pool_bytes, MADV_POPULATE_WRITE) ? -errno : 0;
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
	/* Before anyone writes it: its record no longer vouches for what it held. */
	rec_set_state(p, b, 0);
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
	if (p->registered[id]) {
		list_push_tail(p, &p->lru, id);	/* most recently used end */
		if (p->recs)
			pool_rec(p, id)->stamp = ++p->stamp;
	}
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
	if (p->recs)
		pool_rec(p, b)->stamp = ++p->stamp;	/* in use now: after a crash, the newest */
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
	if (p->recs && pool_rec(p, id)->state && pool_rec(p, id)->key == key) {
		pool_rec(p, id)->stamp = ++p->stamp;
		rec_set_state(p, id, KVB_SEALED | KVB_REGISTERED);
	}
	return 0;
}

void kvpool_seal(struct kvpool *p, uint32_t id, uint64_t parent, uint32_t ns, uint64_t key,
		 const uint32_t *tokens)
{
	if (!p->recs || id >= p->cfg.n_blocks)
		return;
	struct kvblock_rec *r = pool_rec(p, id);
	r->key = key;
	r->parent = parent;
	r->ns = ns;
	memcpy(r->tokens, tokens, (size_t)p->cfg.block_tokens * sizeof(*tokens));
	rec_set_state(p, id, p->registered[id] && p->key[id] == key ? KVB_SEALED | KVB_REGISTERED
								      : KVB_SEALED);
}

/* ---- persistence ---- */

void kvpool_set_records(struct kvpool *p, void *recs)
{
	p->recs = recs;
	p->rec_bytes = kvpool_rec_bytes(p->cfg.block_tokens);
}

static void restore_lists(struct kvpool *p);

void kvpool_restore(struct kvpool *p, uint32_t vocab, struct kvpool_restored *out)
{
	const uint32_t bt = p->cfg.block_tokens;
	struct kvpool_restored st = { 0, 0, 0 };
	uint32_t tokens[MAX_BLOCK_TOKENS];

	if (out)
		*out = st;
	if (!p->recs)
		return;	/* no records: nothing to trust */
	for (uint32_t id = 0; id < p->cfg.n_blocks; id++) {
		/*
		 * Each field read once, into private memory: the records are as
		 * untrusted as a client's region, and could change under us.
		 */
		struct kvblock_rec *r = pool_rec(p, id);
		uint32_t state = __atomic_load_n(&r->state, __ATOMIC_ACQUIRE);
		uint64_t key = r->key, parent = r->parent, stamp = r->stamp;
		uint32_t ns = r->ns, ok = state == KVB_SEALED || state == (KVB_SEALED | KVB_REGISTERED);

		if (!state)
			continue;
		memcpy(tokens, r->tokens, (size_t)bt * sizeof(uint32_t));
		for (uint32_t t = 0; ok && t < bt; t++)
			ok = tokens[t] < vocab;
		if (!ok || kvpool_key(parent, ns, tokens, bt) != key) {
			r->state = 0;
			st.dropped++;
			continue;
		}
		st.sealed++;
		if (stamp > p->stamp)
			p->stamp = stamp;	/* new releases sort after every old one */
		if (!(state & KVB_REGISTERED))
			continue;
		if (ht_find(p, key) != SIZE_MAX) {
			r->state = KVB_SEALED;	/* a second block of that prefix: private, like at run time */
			continue;
		}
		ht_insert(p, key, id);
		p->registered[id] = 1;
		p->key[id] = key;
		st.registered++;
	}
	restore_lists(p);
	if (out)
		*out = st;
}

/* A cached block and its stamp, read once, for sorting. */
struct stamped {
	uint64_t stamp;
	uint32_t id;
};

static int stamp_cmp(const void *a, const void *b)
{
	const struct stamped *x = a, *y = b;
	if (x->stamp != y->stamp)
		return x->stamp < y->stamp ? -1 : 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

/* Unheld registered blocks cached in their old LRU order, every other block free. */
static void restore_lists(struct kvpool *p)
{
	uint32_t n = p->cfg.n_blocks, n_lru = 0;
	struct stamped *lru = malloc((size_t)n * sizeof(*lru));

	list_init(&p->free);
	list_init(&p->lru);
	for (uint32_t id = n; id-- > 0;) {
		if (p->refcount[id])
			continue;
		if (p->registered[id] && lru) {
			lru[n_lru++] = (struct stamped){ pool_rec(p, id)->stamp, id };
			continue;
		}
		if (p->registered[id])
			unregister_block(p, id);	/* no memory to order them: drop, never corrupt */
		/* Unheld and private: its K/V are free to be overwritten. */
		pool_rec(p, id)->state = 0;
		list_push_head(p, &p->free, id);
	}
	if (lru) {
		/* Least recently released first, as they were (stamps copied: the order cannot shift). */
		qsort(lru, n_lru, sizeof(*lru), stamp_cmp);
		for (uint32_t i = 0; i < n_lru; i++)
			list_push_tail(p, &p->lru, lru[i].id);
	}
	free(lru);
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

/* Each block on exactly one of free, LRU or in use, and the counters agree. mark[] from check_list. */
static int check_blocks(const struct kvpool *p, const uint8_t *mark, char *err, size_t errlen)
{
	uint32_t n = p->cfg.n_blocks, in_use = 0;

	for (uint32_t id = 0; id < n; id++) {
		if (p->refcount[id] && mark[id])
			return bad(err, errlen, "block %u: refcount %u but on the %s list", id,
				   p->refcount[id], mark[id] == 1 ? "free" : "LRU");
		if (!p->refcount[id] && !mark[id])
			return bad(err, errlen, "block %u: refcount 0 but on neither the free nor the LRU list",
				   id);
		in_use += p->refcount[id] != 0;
	}
	if (in_use != p->in_use || (uint64_t)in_use + p->free.n + p->lru.n != n)
		return bad(err, errlen, "counts: %u blocks referenced (counter %u) + %u free + %u cached != %u",
			   in_use, p->in_use, p->free.n, p->lru.n, n);
	return 0;
}

/* The sequences hold exactly the references the refcounts say, and the stats sum them. */
static int check_seqs(const struct kvpool *p, const struct kvseq *const *seqs, size_t n_seqs,
		      uint32_t *refs, uint32_t *owner, char *err, size_t errlen)
{
	uint64_t tokens = 0, slots = 0;
	int r;

	for (size_t k = 0; k < n_seqs; k++) {
		if (!seqs[k])
			return bad(err, errlen, "seq %zu is NULL", k);
		r = kvseq_check(p, seqs[k], k, refs, owner, err, errlen);
		if (r)
			return r;
		tokens += seqs[k]->n_tokens;
		slots += (uint64_t)seqs[k]->n_blocks * p->cfg.block_tokens;
	}
	for (uint32_t id = 0; id < p->cfg.n_blocks; id++)
		if (refs[id] != p->refcount[id])
			return bad(err, errlen, "block %u: refcount %u, but the sequences hold %u references",
				   id, p->refcount[id], refs[id]);
	if (tokens != p->st.tokens_stored || slots != p->st.slots_allocated)
		return bad(err, errlen, "stats: tokens_stored %llu (sequences hold %llu), "
			   "slots_allocated %llu (sequences hold %llu)",
			   (unsigned long long)p->st.tokens_stored, (unsigned long long)tokens,
			   (unsigned long long)p->st.slots_allocated, (unsigned long long)slots);
	return 0;
}

int kvpool_check(const struct kvpool *p, const struct kvseq *const *seqs, size_t n_seqs,
		 char *err, size_t errlen)
{
	uint32_t n, *refs = NULL, *owner = NULL;
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
	if (!r)
		r = check_blocks(p, mark, err, errlen);
	if (!r)
		r = check_table(p, err, errlen);
	if (!r)
		r = check_seqs(p, seqs, n_seqs, refs, owner, err, errlen);
out:
	free(refs);
	free(owner);
	free(mark);
	return r;
}
