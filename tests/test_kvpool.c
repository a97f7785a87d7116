/* test_kvpool.c — the paged KV pool: config, sizes, refcounts, prefix reuse, LRU eviction, copy-on-write, rollback, restoring after a restart, a randomised run. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cmocka.h>

#include <xxhash.h>

#include "daemon/engine/kvpool.h"
#include "kernels/backend.h"

#define CHECK(p, seqs, n)                                                        \
	do {                                                                     \
		char err_[256];                                                  \
		int r_ = kvpool_check((p), (seqs), (n), err_, sizeof(err_));     \
		if (r_)                                                          \
			fail_msg("kvpool_check: %d %s (line %d)", r_, err_, __LINE__); \
	} while (0)

static struct kvpool *make_pool(uint32_t n_blocks, uint32_t bt, uint32_t n_layers,
				uint32_t kv_dim, uint32_t type)
{
	struct kvpool_config c = { n_blocks, bt, n_layers, kv_dim, type };
	struct kvpool *p = NULL;

	assert_int_equal(kvpool_create(&p, &c), 0);
	assert_non_null(p);
	return p;
}

static struct kvpool_stats stats(const struct kvpool *p)
{
	struct kvpool_stats s;

	kvpool_get_stats(p, &s);
	return s;
}

/* Offset of row (layer, K=0/V=1, slot) inside a block. */
static size_t row_off(const struct kvpool *p, uint32_t layer, uint32_t kv, uint32_t slot)
{
	const struct kvpool_config *c = kvpool_config(p);

	return (((size_t)layer * 2 + kv) * c->block_tokens + slot) *
	       kvpool_row_bytes(c->kv_type, c->kv_dim);
}

/* Stand-in for "the K/V of position pos": written into layer 0's K row and the last layer's V row. */
static void put_marker(struct kvpool *p, const struct kvseq *s, uint32_t pos, uint64_t m)
{
	const struct kvpool_config *c = kvpool_config(p);
	uint8_t *b = kvpool_block(p, s->blocks[pos / c->block_tokens]);

	memcpy(b + row_off(p, 0, 0, pos % c->block_tokens), &m, 8);
	memcpy(b + row_off(p, c->n_layers - 1, 1, pos % c->block_tokens), &m, 8);
}

static void expect_marker(struct kvpool *p, const struct kvseq *s, uint32_t pos, uint64_t m)
{
	const struct kvpool_config *c = kvpool_config(p);
	uint8_t *b = kvpool_block(p, s->blocks[pos / c->block_tokens]);
	uint64_t k, v;

	memcpy(&k, b + row_off(p, 0, 0, pos % c->block_tokens), 8);
	memcpy(&v, b + row_off(p, c->n_layers - 1, 1, pos % c->block_tokens), 8);
	if (k != m || v != m)
		fail_msg("position %u: K marker %016llx V marker %016llx, expected %016llx", pos,
			 (unsigned long long)k, (unsigned long long)v, (unsigned long long)m);
}

static uint64_t mix(uint64_t x)
{
	x += 0x9E3779B97F4A7C15ull;
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
	return x ^ (x >> 31);
}

/* Like real K/V, position p's content depends on every token up to p. */
static uint64_t next_marker(uint64_t prev, uint32_t tok)
{
	return mix(prev ^ ((uint64_t)tok << 17));
}

/* prepare + write markers + commit, asserting success. */
static void write_tokens(struct kvpool *p, struct kvseq *s, uint32_t from, const uint32_t *toks,
			 uint32_t k)
{
	assert_int_equal(kvseq_prepare(p, s, from, from + k), 0);
	for (uint32_t i = 0; i < k; i++)
		put_marker(p, s, from + i, mix(toks[i] + 1000 * (uint64_t)(from + i)));
	assert_int_equal(kvseq_commit(p, s, from, from + k, toks), 0);
}

/* ---- config and sizes ---- */

static void test_config_validation(void **state)
{
	(void)state;
	struct kvpool_config ok = { 4, 16, 2, 64, KB_F16 };
	struct kvpool *p = (struct kvpool *)1;
	struct kvpool_config c;

	assert_int_equal(kvpool_create(NULL, &ok), -EINVAL);
	assert_int_equal(kvpool_create(&p, NULL), -EINVAL);

	const struct { uint32_t nb, bt, nl, dim, type; } bad[] = {
		{ 0, 16, 2, 64, KB_F16 },	/* no blocks */
		{ 4, 0, 2, 64, KB_F16 },	/* block_tokens 0 */
		{ 4, 3, 2, 64, KB_F16 },	/* not a power of two */
		{ 4, 24, 2, 64, KB_F16 },
		{ 4, 2048, 2, 64, KB_F16 },	/* above 1024 */
		{ 4, 16, 0, 64, KB_F16 },	/* no layers */
		{ 4, 16, 2, 0, KB_F16 },	/* no kv_dim */
		{ 4, 16, 2, 64, KB_Q4_0 },	/* not a KV type */
		{ 4, 16, 2, 64, 99 },
		{ 4, 16, 2, 48, KB_Q8_0 },	/* q8_0 needs kv_dim % 32 == 0 */
		/* n_blocks * block bytes overflows size_t */
		{ UINT32_MAX, 1024, UINT32_MAX, UINT32_MAX, KB_F32 },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		c = (struct kvpool_config){ bad[i].nb, bad[i].bt, bad[i].nl, bad[i].dim, bad[i].type };
		p = (struct kvpool *)1;
		if (kvpool_create(&p, &c) != -EINVAL)
			fail_msg("bad config %zu accepted", i);
		assert_null(p);
	}

	/* Representable but far beyond any address space: the reservation fails. */
	c = (struct kvpool_config){ 1u << 20, 1024, 1024, 1024, KB_F32 };
	assert_int_equal(kvpool_create(&p, &c), -ENOMEM);
	assert_null(p);

	const struct { uint32_t bt, dim, type; } good[] = {
		{ 1, 1, KB_F32 }, { 1024, 8, KB_F16 }, { 16, 64, KB_Q8_0 }, { 2, 3, KB_F16 },
	};
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		c = (struct kvpool_config){ 3, good[i].bt, 2, good[i].dim, good[i].type };
		assert_int_equal(kvpool_create(&p, &c), 0);
		assert_memory_equal(kvpool_config(p), &c, sizeof(c));
		CHECK(p, NULL, 0);
		kvpool_destroy(p);
	}
	kvpool_destroy(NULL);
}

static void test_sizes(void **state)
{
	(void)state;
	/* The default model: 30 layers, 3 KV heads x 64 = kv_dim 192. */
	assert_int_equal(kvpool_row_bytes(KB_F16, 192), 384);
	assert_int_equal(kvpool_row_bytes(KB_F32, 192), 768);
	assert_int_equal(kvpool_row_bytes(KB_Q8_0, 192), 6 * 34);
	assert_int_equal(kvpool_row_bytes(KB_Q8_0, 48), 0);
	assert_int_equal(kvpool_row_bytes(KB_Q4_0, 192), 0);
	assert_int_equal(kvpool_token_bytes(KB_F16, 30, 192), 23040);
	assert_int_equal(kvpool_token_bytes(KB_F32, 30, 192), 46080);
	assert_int_equal(kvpool_token_bytes(KB_Q8_0, 30, 192), 12240);
	assert_int_equal(kvpool_token_bytes(KB_Q8_0, 30, 100), 0);

	const uint32_t types[] = { KB_F16, KB_F32, KB_Q8_0 };
	for (size_t t = 0; t < 3; t++) {
		struct kvpool *p = make_pool(10, 16, 30, 192, types[t]);
		size_t bb = kvpool_block_bytes(p);
		struct kvpool_stats st = stats(p);

		assert_int_equal(bb, 16 * kvpool_token_bytes(types[t], 30, 192));
		assert_int_equal(st.blocks_total, 10);
		assert_int_equal(st.blocks_free, 10);
		assert_int_equal(st.blocks_in_use + st.blocks_cached + st.bytes_used, 0);
		assert_int_equal(st.bytes_total, 10 * bb);
		assert_int_equal((uintptr_t)kvpool_base(p) % 64, 0);
		for (uint32_t i = 0; i < 10; i++)
			assert_ptr_equal(kvpool_block(p, i), kvpool_base(p) + i * bb);
		assert_null(kvpool_block(p, 10));
		assert_null(kvpool_block(p, KVPOOL_NONE));
		/* The whole reservation is writable. */
		memset(kvpool_base(p), 0xa5, st.bytes_total);

		uint32_t id;
		assert_int_equal(kvpool_alloc(p, &id), 0);
		st = stats(p);
		assert_int_equal(st.bytes_used, bb);
		kvpool_destroy(p);
	}
	struct kvpool *p = make_pool(1, 16, 30, 192, KB_F16);
	assert_int_equal(kvpool_block_bytes(p), 368640);	/* 16 tokens x 23040 bytes */
	kvpool_destroy(p);
}

/* ---- blocks ---- */

static void test_alloc_refcount(void **state)
{
	(void)state;
	struct kvpool *p = make_pool(8, 4, 2, 8, KB_F16);
	uint32_t ids[8], id;
	struct kvpool_stats st;

	for (uint32_t i = 0; i < 8; i++) {
		assert_int_equal(kvpool_alloc(p, &ids[i]), 0);
		assert_int_equal(ids[i], i);	/* a fresh pool hands out 0, 1, 2, ... */
		assert_int_equal(kvpool_refcount(p, i), 1);
		assert_false(kvpool_registered(p, i));
	}
	assert_int_equal(kvpool_alloc(p, &id), -ENOSPC);
	assert_int_equal(kvpool_alloc(p, NULL), -EINVAL);
	st = stats(p);
	assert_int_equal(st.blocks_in_use, 8);
	assert_int_equal(st.blocks_free, 0);

	kvpool_ref(p, 3);
	kvpool_ref(p, 3);
	assert_int_equal(kvpool_refcount(p, 3), 3);
	kvpool_unref(p, 3);
	kvpool_unref(p, 3);
	assert_int_equal(kvpool_refcount(p, 3), 1);

	/* Release 2 and 5: exactly those come back (the free list is a stack: 5 first). */
	kvpool_unref(p, 2);
	kvpool_unref(p, 5);
	st = stats(p);
	assert_int_equal(st.blocks_in_use, 6);
	assert_int_equal(st.blocks_free, 2);
	assert_int_equal(kvpool_alloc(p, &id), 0);
	assert_int_equal(id, 5);
	assert_int_equal(kvpool_alloc(p, &id), 0);
	assert_int_equal(id, 2);
	assert_int_equal(kvpool_alloc(p, &id), -ENOSPC);

	for (uint32_t i = 0; i < 8; i++)
		kvpool_unref(p, i);
	CHECK(p, NULL, 0);
	st = stats(p);
	assert_int_equal(st.blocks_free, 8);
	assert_int_equal(st.bytes_used, 0);

	/* Misuse is ignored and corrupts nothing. */
	kvpool_unref(p, 4);			/* refcount already 0 */
	kvpool_unref(p, 8);			/* out of range */
	kvpool_unref(p, KVPOOL_NONE);
	kvpool_ref(p, 4);			/* nobody holds it */
	kvpool_ref(p, 99);
	assert_int_equal(kvpool_refcount(p, 4), 0);
	assert_int_equal(kvpool_refcount(p, 99), 0);
	assert_false(kvpool_registered(p, 99));
	assert_int_equal(kvpool_register(p, 4, 1), -EINVAL);	/* not held */
	assert_int_equal(kvpool_register(p, 99, 1), -EINVAL);
	assert_int_equal(kvpool_lookup(p, 1, NULL), -EINVAL);
	CHECK(p, NULL, 0);
	st = stats(p);
	assert_int_equal(st.blocks_free, 8);

	for (uint32_t i = 0; i < 8; i++)
		assert_int_equal(kvpool_alloc(p, &ids[i]), 0);
	for (uint32_t i = 0; i < 8; i++)
		kvpool_unref(p, ids[i]);
	CHECK(p, NULL, 0);
	kvpool_destroy(p);
}

static void test_register_lookup(void **state)
{
	(void)state;
	struct kvpool *p = make_pool(4, 4, 2, 8, KB_F16);
	uint32_t a, b, id;
	struct kvpool_stats st;

	assert_int_equal(kvpool_alloc(p, &a), 0);
	assert_int_equal(kvpool_alloc(p, &b), 0);
	assert_int_equal(kvpool_lookup(p, 0, &id), -ENOENT);
	assert_int_equal(kvpool_register(p, a, 0), 0);		/* 0 is a real key */
	assert_int_equal(kvpool_register(p, a, 0), 0);		/* idempotent */
	assert_int_equal(kvpool_register(p, a, 7), -EINVAL);	/* already under another key */
	assert_int_equal(kvpool_register(p, b, 0), -EEXIST);
	assert_false(kvpool_registered(p, b));
	assert_true(kvpool_registered(p, a));

	assert_int_equal(kvpool_lookup(p, 0, &id), 0);
	assert_int_equal(id, a);
	assert_int_equal(kvpool_refcount(p, a), 2);
	kvpool_unref(p, a);
	kvpool_unref(p, a);	/* registered, refcount 0: cached */
	kvpool_unref(p, b);	/* unregistered: free */
	st = stats(p);
	assert_int_equal(st.blocks_cached, 1);
	assert_int_equal(st.blocks_free, 3);
	CHECK(p, NULL, 0);

	/* A cached block is found again and leaves the LRU. */
	assert_int_equal(kvpool_lookup(p, 0, &id), 0);
	assert_int_equal(id, a);
	st = stats(p);
	assert_int_equal(st.blocks_cached, 0);
	assert_int_equal(st.blocks_in_use, 1);
	kvpool_unref(p, a);

	/* Free blocks are used before any cached block is evicted. */
	for (int i = 0; i < 3; i++) {
		assert_int_equal(kvpool_alloc(p, &id), 0);
		assert_int_not_equal(id, a);
	}
	assert_int_equal(stats(p).evictions, 0);
	assert_int_equal(kvpool_alloc(p, &id), 0);
	assert_int_equal(id, a);
	assert_int_equal(stats(p).evictions, 1);
	assert_false(kvpool_registered(p, a));
	assert_int_equal(kvpool_lookup(p, 0, &id), -ENOENT);
	for (uint32_t i = 0; i < 4; i++)
		kvpool_unref(p, i);
	CHECK(p, NULL, 0);
	kvpool_destroy(p);
}

static void test_key(void **state)
{
	(void)state;
	uint32_t toks[2000];
	uint8_t buf[12 + sizeof(toks)];
	uint64_t parent = 0x0123456789abcdefull;
	uint32_t ns = 1000;

	for (uint32_t i = 0; i < 2000; i++)
		toks[i] = i * 2654435761u;
	memcpy(buf, &parent, 8);
	memcpy(buf + 8, &ns, 4);
	memcpy(buf + 12, toks, sizeof(toks));
	/* The hashed layout is pinned: (parent u64, ns u32, tokens u32[n]). */
	assert_true(kvpool_key(parent, ns, toks, 16) == XXH3_64bits(buf, 12 + 64));
	assert_true(kvpool_key(parent, ns, toks, 0) == XXH3_64bits(buf, 12));
	assert_true(kvpool_key(parent, ns, toks, 1024) == XXH3_64bits(buf, 12 + 4096));
	assert_true(kvpool_key(parent, ns, toks, 2000) == XXH3_64bits(buf, sizeof(buf)));

	uint64_t k = kvpool_key(parent, ns, toks, 16);
	assert_true(k != kvpool_key(parent + 1, ns, toks, 16));
	assert_true(k != kvpool_key(parent, ns + 1, toks, 16));
	assert_true(k != kvpool_key(parent, ns, toks + 1, 16));
	assert_true(k != kvpool_key(parent, ns, toks, 15));
}

/* ---- prefix cache ---- */

/* One pool, prompts in uid 5, 6 and the global namespace, and the hit/miss counts expected so far. */
struct prefix_case {
	struct kvpool *p;
	struct kvseq a, b, c, d, e, f, g;
	uint32_t prompt[49];
	uint64_t hb, ht, mb, mt;
};

static void expect_counts(const struct prefix_case *x)
{
	struct kvpool_stats st = stats(x->p);
	assert_int_equal(st.prefix_hit_blocks, x->hb);
	assert_int_equal(st.prefix_hit_tokens, x->ht);
	assert_int_equal(st.prefix_miss_blocks, x->mb);
	assert_int_equal(st.prefix_miss_tokens, x->mt);
}

/* One uid: a computes, b, c and d attach what a's full blocks hold. */
static void prefix_same_uid(struct prefix_case *x)
{
	/* a (uid 5) computes 48 tokens: three full blocks get registered. */
	kvseq_init(&x->a, 5);
	assert_int_equal(kvseq_attach_prefix(x->p, &x->a, x->prompt, 48), 0);
	x->mb += 3, x->mt += 48;
	expect_counts(x);
	write_tokens(x->p, &x->a, 0, x->prompt, 48);
	assert_int_equal(x->a.n_keyed, 3);
	for (uint32_t i = 0; i < 3; i++)
		assert_true(kvpool_registered(x->p, x->a.blocks[i]));
	{
		const struct kvseq *l[] = { &x->a };
		CHECK(x->p, l, 1);
	}

	/* Same 40-token prompt, same uid: two blocks (32 tokens) reused. */
	kvseq_init(&x->b, 5);
	assert_int_equal(kvseq_attach_prefix(x->p, &x->b, x->prompt, 40), 32);
	x->hb += 2, x->ht += 32, x->mb += 1, x->mt += 8;
	expect_counts(x);
	assert_int_equal(x->b.n_tokens, 32);
	assert_int_equal(x->b.n_blocks, 2);
	assert_int_equal(x->b.n_keyed, 2);
	assert_int_equal(x->b.blocks[0], x->a.blocks[0]);
	assert_int_equal(x->b.blocks[1], x->a.blocks[1]);
	assert_int_equal(kvpool_refcount(x->p, x->a.blocks[0]), 2);
	assert_int_equal(kvpool_refcount(x->p, x->a.blocks[2]), 1);
	assert_memory_equal(x->b.tokens, x->prompt, 32 * sizeof(uint32_t));

	/* 48 tokens: the third block holds the last token, so still two. */
	kvseq_init(&x->c, 5);
	assert_int_equal(kvseq_attach_prefix(x->p, &x->c, x->prompt, 48), 32);
	x->hb += 2, x->ht += 32, x->mb += 1, x->mt += 16;
	expect_counts(x);
	/* 49 tokens: now the third block is entirely before the last token. */
	kvseq_init(&x->d, 5);
	assert_int_equal(kvseq_attach_prefix(x->p, &x->d, x->prompt, 49), 48);
	x->hb += 3, x->ht += 48, x->mb += 1, x->mt += 1;
	expect_counts(x);
	assert_int_equal(x->d.blocks[2], x->a.blocks[2]);
	assert_int_equal(x->d.last_key, x->a.last_key);
}

/* Another uid misses; namespace 0 shares among its users; a changed block ends the chain. */
static void prefix_namespaces(struct prefix_case *x)
{
	/* Another uid: no hit, even though the blocks are there. */
	kvseq_init(&x->e, 6);
	assert_int_equal(kvseq_attach_prefix(x->p, &x->e, x->prompt, 48), 0);
	x->mb += 3, x->mt += 48;
	expect_counts(x);
	assert_int_equal(x->e.n_blocks, 0);

	/* Global sharing: namespace 0 shares among everyone who uses it. */
	kvseq_init(&x->f, 0);
	assert_int_equal(kvseq_attach_prefix(x->p, &x->f, x->prompt, 40), 0);
	x->mb += 3, x->mt += 40;
	write_tokens(x->p, &x->f, 0, x->prompt, 40);
	kvseq_init(&x->g, 0);
	assert_int_equal(kvseq_attach_prefix(x->p, &x->g, x->prompt, 40), 32);
	x->hb += 2, x->ht += 32, x->mb += 1, x->mt += 8;
	expect_counts(x);
	assert_int_equal(x->g.blocks[1], x->f.blocks[1]);
	assert_int_not_equal(x->g.blocks[0], x->a.blocks[0]);

	/* Tokens differing in the second block: only the first hits. */
	uint32_t other[40];
	memcpy(other, x->prompt, sizeof(other));
	other[20] = 999;
	kvseq_release(x->p, &x->g);
	kvseq_init(&x->g, 0);
	assert_int_equal(kvseq_attach_prefix(x->p, &x->g, other, 40), 16);
	x->hb += 1, x->ht += 16, x->mb += 2, x->mt += 24;
	expect_counts(x);

	/* Empty and misused attaches count nothing. */
	assert_int_equal(kvseq_attach_prefix(x->p, &x->e, x->prompt, 0), 0);
	assert_int_equal(kvseq_attach_prefix(x->p, &x->g, x->prompt, 40), -EINVAL);	/* g not empty */
	expect_counts(x);
}

static void test_prefix_reuse(void **state)
{
	(void)state;
	struct prefix_case *x = calloc(1, sizeof(*x));
	assert_non_null(x);
	x->p = make_pool(32, 16, 2, 8, KB_F16);
	struct kvpool *p = x->p;
	struct kvseq *a = &x->a, *b = &x->b, *c = &x->c, *d = &x->d, *e = &x->e, *f = &x->f;
	struct kvseq *g = &x->g;
	struct kvpool_stats st;

	for (uint32_t i = 0; i < 49; i++)
		x->prompt[i] = 7 * i + 3;
	prefix_same_uid(x);
	prefix_namespaces(x);

	const struct kvseq *l[] = { a, b, c, d, e, f, g };
	CHECK(p, l, 7);
	st = stats(p);
	assert_int_equal(st.tokens_stored, 48 + 32 + 32 + 48 + 0 + 40 + 16);
	assert_int_equal(st.slots_allocated, (3 + 2 + 2 + 3 + 0 + 3 + 1) * 16);
	/* Distinct blocks: a's three, f's three (its third is partial), none else. */
	assert_int_equal(st.blocks_in_use, 6);

	kvseq_release(p, a);
	kvseq_release(p, b);
	kvseq_release(p, c);
	kvseq_release(p, d);
	kvseq_release(p, e);
	kvseq_release(p, f);
	kvseq_release(p, g);
	CHECK(p, NULL, 0);
	st = stats(p);
	assert_int_equal(st.blocks_in_use, 0);
	assert_int_equal(st.blocks_cached, 5);	/* a's 3, f's 2 full */
	assert_int_equal(st.tokens_stored, 0);
	assert_int_equal(st.slots_allocated, 0);

	/* Cached blocks still serve a new prompt after everyone left. */
	kvseq_init(a, 5);
	assert_int_equal(kvseq_attach_prefix(p, a, x->prompt, 49), 48);
	assert_int_equal(stats(p).blocks_cached, 2);
	kvseq_release(p, a);
	kvpool_destroy(p);
	free(x);
}

/* Two sequences compute the same prefix: the loser's block stays private, its chain goes on. */
static void test_duplicate_prefix(void **state)
{
	(void)state;
	struct kvpool *p = make_pool(16, 16, 2, 8, KB_F16);
	uint32_t prompt[33];
	struct kvseq a, b, c;

	for (uint32_t i = 0; i < 33; i++)
		prompt[i] = i * 3;
	kvseq_init(&a, 2);
	kvseq_init(&b, 2);
	assert_int_equal(kvseq_attach_prefix(p, &a, prompt, 33), 0);
	assert_int_equal(kvseq_attach_prefix(p, &b, prompt, 33), 0);	/* nothing registered yet */
	write_tokens(p, &a, 0, prompt, 16);
	write_tokens(p, &b, 0, prompt, 32);
	assert_true(kvpool_registered(p, a.blocks[0]));
	assert_false(kvpool_registered(p, b.blocks[0]));	/* -EEXIST: private */
	assert_true(kvpool_registered(p, b.blocks[1]));	/* keyed after a's block 0 */
	assert_int_equal(b.n_keyed, 2);
	assert_true(b.last_key == kvpool_key(a.last_key, 2, prompt + 16, 16));

	kvseq_init(&c, 2);
	assert_int_equal(kvseq_attach_prefix(p, &c, prompt, 33), 32);
	assert_int_equal(c.blocks[0], a.blocks[0]);
	assert_int_equal(c.blocks[1], b.blocks[1]);
	const struct kvseq *l[] = { &a, &b, &c };
	CHECK(p, l, 3);
	kvseq_release(p, &a);
	kvseq_release(p, &b);
	kvseq_release(p, &c);
	CHECK(p, NULL, 0);
	assert_int_equal(stats(p).blocks_cached, 2);
	kvpool_destroy(p);
}

static void test_lru_eviction(void **state)
{
	(void)state;
	struct kvpool *p = make_pool(8, 4, 2, 8, KB_F16);
	uint32_t id, held;
	const uint64_t key[8] = { 0, 11, 22, 33, 44, 55, 66, 77 };

	/* Blocks 0..7 registered, then released in that order: LRU 0 1 2 3 4 5 6 7. */
	for (uint32_t i = 0; i < 8; i++) {
		assert_int_equal(kvpool_alloc(p, &id), 0);
		assert_int_equal(kvpool_register(p, id, key[id]), 0);
	}
	for (uint32_t i = 0; i < 8; i++)
		kvpool_unref(p, i);
	assert_int_equal(stats(p).blocks_cached, 8);
	CHECK(p, NULL, 0);

	/* Touch 2 then 5: LRU 0 1 3 4 6 7 2 5. Hold 6 (in use, never evicted). */
	assert_int_equal(kvpool_lookup(p, key[2], &id), 0);
	kvpool_unref(p, id);
	assert_int_equal(kvpool_lookup(p, key[5], &id), 0);
	kvpool_unref(p, id);
	assert_int_equal(kvpool_lookup(p, key[6], &held), 0);
	assert_int_equal(held, 6);

	const uint32_t first[3] = { 0, 1, 3 };
	for (int i = 0; i < 3; i++) {
		assert_int_equal(kvpool_alloc(p, &id), 0);
		assert_int_equal(id, first[i]);
		assert_false(kvpool_registered(p, id));
	}
	assert_int_equal(stats(p).evictions, 3);
	assert_int_equal(kvpool_lookup(p, key[0], &id), -ENOENT);
	assert_int_equal(kvpool_lookup(p, key[1], &id), -ENOENT);
	assert_int_equal(kvpool_lookup(p, key[3], &id), -ENOENT);
	/* 4 is still cached; touching it moves it behind 5: LRU 7 2 5 4. */
	assert_int_equal(kvpool_lookup(p, key[4], &id), 0);
	assert_int_equal(id, 4);
	kvpool_unref(p, id);

	const uint32_t rest[4] = { 7, 2, 5, 4 };
	for (int i = 0; i < 4; i++) {
		assert_int_equal(kvpool_alloc(p, &id), 0);
		assert_int_equal(id, rest[i]);
	}
	assert_int_equal(kvpool_alloc(p, &id), -ENOSPC);
	assert_int_equal(stats(p).evictions, 7);
	/* The held block kept its key. */
	assert_int_equal(kvpool_lookup(p, key[6], &id), 0);
	assert_int_equal(id, 6);
	kvpool_unref(p, 6);
	for (uint32_t i = 0; i < 8; i++)
		kvpool_unref(p, i);
	CHECK(p, NULL, 0);
	assert_int_equal(stats(p).blocks_cached, 1);
	assert_int_equal(stats(p).blocks_free, 7);
	kvpool_destroy(p);
}

/* ---- writes ---- */

/* b forks a, is refused a write to the shared block, then writes into its own copy. */
static void cow_on_write(struct kvpool *p, struct kvseq *a, struct kvseq *b, const uint32_t *toks,
			 uint8_t *snap)
{
	size_t bb = kvpool_block_bytes(p);

	kvseq_init(b, 99);
	assert_int_equal(kvseq_fork(p, b, a), 0);
	assert_int_equal(b->ns, 1);	/* a fork continues its source's key chain */
	assert_int_equal(b->n_tokens, 20);
	assert_int_equal(b->blocks[0], a->blocks[0]);
	assert_int_equal(b->blocks[1], a->blocks[1]);
	assert_int_equal(kvpool_refcount(p, a->blocks[1]), 2);
	{
		const struct kvseq *l[] = { a, b };
		CHECK(p, l, 2);
	}

	/* Writing the shared partial block without prepare is refused. */
	assert_int_equal(kvseq_commit(p, b, 20, 21, toks + 20), -EINVAL);
	assert_int_equal(kvseq_commit(p, b, 19, 21, toks + 19), -EINVAL);	/* from != n_tokens */
	assert_int_equal(b->n_tokens, 20);

	/* b writes position 20: it gets a copy, a's block is untouched. */
	assert_int_equal(kvseq_prepare(p, b, 20, 21), 0);
	assert_int_equal(stats(p).cow_copies, 1);
	assert_int_not_equal(b->blocks[1], a->blocks[1]);
	assert_int_equal(b->blocks[0], a->blocks[0]);	/* the full block stays shared */
	assert_int_equal(kvpool_refcount(p, a->blocks[1]), 1);
	assert_int_equal(kvpool_refcount(p, b->blocks[1]), 1);
	assert_memory_equal(kvpool_block(p, b->blocks[1]), snap, bb);
	put_marker(p, b, 20, 0xdeadbeefcafef00dull);
	put_marker(p, b, 16, 0x1111);	/* even rewriting an old slot only touches the copy */
	assert_int_equal(kvseq_commit(p, b, 20, 21, toks + 20), 0);
	assert_memory_equal(kvpool_block(p, a->blocks[1]), snap, bb);
	{
		const struct kvseq *l[] = { a, b };
		CHECK(p, l, 2);
	}
}

/* A registered full block that a truncating rewrite touches is copied, the old one cached. */
static void cow_after_truncate(struct kvpool *p, struct kvseq *a, struct kvseq *b,
			       const uint32_t *toks, uint8_t *snap)
{
	size_t bb = kvpool_block_bytes(p);

	/* a now holds its partial block alone and unregistered: no copy. */
	assert_int_equal(kvseq_prepare(p, a, 20, 21), 0);
	assert_int_equal(stats(p).cow_copies, 1);
	assert_int_equal(kvseq_commit(p, a, 20, 21, toks + 20), 0);

	/* a fills block 1 (registered), then truncates into it and rewrites: copy. */
	write_tokens(p, a, 21, toks + 21, 11);
	uint32_t full = a->blocks[1];
	uint64_t key1 = a->last_key;
	assert_true(kvpool_registered(p, full));
	memcpy(snap, kvpool_block(p, full), bb);
	assert_int_equal(kvseq_prepare(p, a, 24, 24), 0);	/* truncation alone copies nothing */
	assert_int_equal(a->n_tokens, 24);
	assert_int_equal(a->n_keyed, 1);
	assert_true(a->last_key == kvpool_key(0, 1, toks, 16));
	assert_int_equal(a->blocks[1], full);
	assert_int_equal(stats(p).cow_copies, 1);
	uint32_t alt[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
	write_tokens(p, a, 24, alt, 8);
	assert_int_equal(stats(p).cow_copies, 2);
	assert_int_not_equal(a->blocks[1], full);
	assert_memory_equal(kvpool_block(p, full), snap, bb);
	/* The old block is cached under its old key, the new one under the new chain. */
	assert_int_equal(kvpool_refcount(p, full), 0);
	assert_int_equal(stats(p).blocks_cached, 1);
	uint32_t id;
	assert_int_equal(kvpool_lookup(p, key1, &id), 0);
	assert_int_equal(id, full);
	kvpool_unref(p, id);
	uint32_t mixed[32];
	memcpy(mixed, toks, 24 * sizeof(uint32_t));
	memcpy(mixed + 24, alt, sizeof(alt));
	assert_true(a->last_key == kvpool_key(kvpool_key(0, 1, mixed, 16), 1, mixed + 16, 16));
	assert_true(kvpool_registered(p, a->blocks[1]));
	{
		const struct kvseq *l[] = { a, b };
		CHECK(p, l, 2);
	}
}

/* A fork between prepare and commit shares only the written positions. */
static void fork_prepared(struct kvpool *p, struct kvseq *a, struct kvseq *b, struct kvseq *c,
			  const uint32_t *toks)
{
	assert_int_equal(kvseq_prepare(p, a, 32, 50), 0);
	assert_int_equal(a->n_blocks, 4);
	kvseq_init(c, 1);
	assert_int_equal(kvseq_fork(p, c, a), 0);
	assert_int_equal(c->n_blocks, 2);
	assert_int_equal(c->n_tokens, 32);
	assert_int_equal(kvpool_refcount(p, a->blocks[2]), 1);
	assert_int_equal(kvseq_commit(p, a, 32, 40, toks), 0);
	{
		const struct kvseq *l[] = { a, b, c };
		CHECK(p, l, 3);
	}
}

static void test_cow_fork(void **state)
{
	(void)state;
	struct kvpool *p = make_pool(8, 16, 2, 8, KB_F16);
	size_t bb = kvpool_block_bytes(p);
	uint32_t toks[40];
	struct kvseq a, b, c;
	uint8_t *snap = malloc(bb);

	assert_non_null(snap);
	for (uint32_t i = 0; i < 40; i++)
		toks[i] = i + 100;
	kvseq_init(&a, 1);
	write_tokens(p, &a, 0, toks, 20);	/* block 1 holds positions 16..19 */
	memset(kvpool_block(p, a.blocks[1]) + row_off(p, 1, 0, 8), 0x5a, 8);	/* past the marker rows */
	memcpy(snap, kvpool_block(p, a.blocks[1]), bb);
	cow_on_write(p, &a, &b, toks, snap);
	cow_after_truncate(p, &a, &b, toks, snap);
	fork_prepared(p, &a, &b, &c, toks);

	kvseq_release(p, &a);
	kvseq_release(p, &b);
	kvseq_release(p, &c);
	CHECK(p, NULL, 0);
	free(snap);
	kvpool_destroy(p);
}

static int seq_equal(const struct kvseq *x, const struct kvseq *y)
{
	return x->n_blocks == y->n_blocks && x->n_tokens == y->n_tokens &&
	       x->n_keyed == y->n_keyed && x->last_key == y->last_key && x->ns == y->ns &&
	       !memcmp(x->blocks, y->blocks, x->n_blocks * sizeof(uint32_t)) &&
	       !memcmp(x->tokens, y->tokens, x->n_tokens * sizeof(uint32_t));
}

/* A failing prepare that truncates keeps only the truncation; bad ranges change nothing. */
static void enospc_truncate(struct kvpool *p, struct kvseq *a, const struct kvseq *const *l,
			    const uint32_t *toks)
{
	struct kvpool_stats before, after;

	/* A truncating prepare that fails keeps the truncation, and nothing else. */
	before = stats(p);
	assert_int_equal(kvseq_prepare(p, a, 3, 40), -ENOSPC);
	after = stats(p);
	assert_int_equal(a->n_tokens, 3);
	assert_int_equal(a->n_blocks, 1);
	assert_int_equal(a->n_keyed, 0);
	assert_true(a->last_key == 0);
	assert_int_equal(after.tokens_stored, before.tokens_stored - 5);
	assert_int_equal(after.slots_allocated, before.slots_allocated - 4);
	assert_int_equal(after.evictions, before.evictions);
	assert_int_equal(after.cow_copies, before.cow_copies);
	CHECK(p, l, 3);

	/* Bad ranges. */
	assert_int_equal(kvseq_prepare(p, a, 4, 8), -EINVAL);	/* from past n_tokens */
	assert_int_equal(kvseq_prepare(p, a, 2, 1), -EINVAL);
	assert_int_equal(kvseq_prepare(p, a, 0, UINT32_MAX), -EINVAL);
	assert_int_equal(kvseq_commit(p, a, 3, 9, toks), -EINVAL);	/* past prepared blocks */
	assert_int_equal(a->n_tokens, 3);
	CHECK(p, l, 3);
}

static void test_enospc_rollback(void **state)
{
	(void)state;
	struct kvpool *p = make_pool(6, 4, 2, 8, KB_F16);
	uint32_t toks[64], id, xblock;
	struct kvseq a, b, c, x, saved;
	struct kvpool_stats before, after;

	for (uint32_t i = 0; i < 64; i++)
		toks[i] = i;
	kvseq_init(&a, 0);
	write_tokens(p, &a, 0, toks, 8);		/* 2 full blocks */
	kvseq_init(&x, 0);
	write_tokens(p, &x, 0, toks + 32, 4);		/* 1 full block ... */
	xblock = x.blocks[0];
	uint64_t xkey = x.last_key;
	kvseq_release(p, &x);				/* ... now cached */
	kvseq_init(&b, 0);
	write_tokens(p, &b, 0, toks + 40, 2);		/* 1 partial block */
	kvseq_init(&c, 0);
	assert_int_equal(kvseq_fork(p, &c, &b), 0);	/* shared by b and c */
	const struct kvseq *l[] = { &a, &b, &c };
	CHECK(p, l, 3);
	before = stats(p);
	assert_int_equal(before.blocks_free, 2);
	assert_int_equal(before.blocks_cached, 1);

	/* c needs a copy plus 4 new blocks; 3 are available. Nothing changes. */
	saved = c;
	saved.blocks = malloc(c.cap * sizeof(uint32_t));
	saved.tokens = malloc(c.tok_cap * sizeof(uint32_t));
	memcpy(saved.blocks, c.blocks, c.n_blocks * sizeof(uint32_t));
	memcpy(saved.tokens, c.tokens, c.n_tokens * sizeof(uint32_t));
	assert_int_equal(kvseq_prepare(p, &c, 2, 18), -ENOSPC);
	after = stats(p);
	assert_memory_equal(&before, &after, sizeof(before));
	assert_true(seq_equal(&c, &saved));
	CHECK(p, l, 3);
	/* No eviction happened for the failed request. */
	assert_int_equal(kvpool_lookup(p, xkey, &id), 0);
	assert_int_equal(id, xblock);
	kvpool_unref(p, id);

	/* Without the copy it would not fit either: no block is taken. */
	assert_int_equal(kvseq_prepare(p, &a, 8, 8 + 16), -ENOSPC);
	after = stats(p);
	assert_memory_equal(&before, &after, sizeof(before));
	CHECK(p, l, 3);

	/* Exactly what is available: the copy and 2 blocks, evicting x's block. */
	assert_int_equal(kvseq_prepare(p, &c, 2, 12), 0);
	after = stats(p);
	assert_int_equal(after.cow_copies, 1);
	assert_int_equal(after.evictions, 1);
	assert_int_equal(after.blocks_free + after.blocks_cached, 0);
	assert_int_equal(kvpool_lookup(p, xkey, &id), -ENOENT);
	assert_int_equal(c.n_blocks, 3);
	assert_int_equal(c.n_tokens, 2);
	assert_int_equal(after.slots_allocated, before.slots_allocated + 8);
	CHECK(p, l, 3);
	assert_int_equal(kvseq_commit(p, &c, 2, 12, toks + 2), 0);
	CHECK(p, l, 3);

	enospc_truncate(p, &a, l, toks);

	free(saved.blocks);
	free(saved.tokens);
	kvseq_release(p, &a);
	kvseq_release(p, &b);
	kvseq_release(p, &c);
	kvseq_release(p, &c);	/* twice is harmless */
	CHECK(p, NULL, 0);
	after = stats(p);
	assert_int_equal(after.tokens_stored + after.slots_allocated + after.blocks_in_use, 0);
	kvpool_destroy(p);
}

/* kvpool_check itself must notice broken states. */
static void test_check_detects(void **state)
{
	(void)state;
	struct kvpool *p = make_pool(8, 4, 2, 8, KB_F16);
	uint32_t toks[10] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 };
	struct kvseq a, b, bad;
	char err[256];

	kvseq_init(&a, 3);
	write_tokens(p, &a, 0, toks, 10);
	kvseq_init(&b, 3);
	assert_int_equal(kvseq_fork(p, &b, &a), 0);
	const struct kvseq *both[] = { &a, &b };
	CHECK(p, both, 2);

	const struct kvseq *only_a[] = { &a };
	assert_int_equal(kvpool_check(p, only_a, 1, err, sizeof(err)), -EUCLEAN);
	assert_non_null(strstr(err, "refcount"));

	bad = b;
	bad.last_key ^= 1;
	const struct kvseq *l[] = { &a, &bad };
	assert_int_equal(kvpool_check(p, l, 2, err, sizeof(err)), -EUCLEAN);
	assert_non_null(strstr(err, "last_key"));

	bad = b;
	bad.n_tokens = 9;	/* same blocks, one token fewer: stats disagree */
	assert_int_equal(kvpool_check(p, l, 2, err, sizeof(err)), -EUCLEAN);
	assert_non_null(strstr(err, "tokens_stored"));

	uint32_t ids[3] = { b.blocks[0], b.blocks[1], 77 };
	bad = b;
	bad.blocks = ids;
	assert_int_equal(kvpool_check(p, l, 2, err, sizeof(err)), -EUCLEAN);
	assert_non_null(strstr(err, "out of range"));

	uint32_t twice[3] = { b.blocks[0], b.blocks[0], b.blocks[2] };
	bad.blocks = twice;
	assert_int_equal(kvpool_check(p, l, 2, err, sizeof(err)), -EUCLEAN);
	assert_non_null(strstr(err, "twice"));

	/* A registered block whose key is not its tokens' chain. */
	uint32_t other[10];
	memcpy(other, toks, sizeof(other));
	other[5] = 55;
	bad = b;
	bad.tokens = other;
	bad.last_key = kvpool_key(kvpool_key(0, 3, other, 4), 3, other + 4, 4);
	assert_int_equal(kvpool_check(p, l, 2, err, sizeof(err)), -EUCLEAN);
	assert_non_null(strstr(err, "registered under"));

	/* A reference nobody accounts for. */
	kvpool_ref(p, a.blocks[0]);
	assert_int_equal(kvpool_check(p, both, 2, err, sizeof(err)), -EUCLEAN);
	assert_non_null(strstr(err, "refcount"));
	kvpool_unref(p, a.blocks[0]);
	CHECK(p, both, 2);

	kvseq_release(p, &a);
	kvseq_release(p, &b);
	CHECK(p, NULL, 0);
	kvpool_destroy(p);
}

/* ---- persistence: what a restart keeps ---- */

#define P_BT 16
#define P_VOCAB 1000

/*
 * What outlives a run: the blocks (pool_fd) and their records (state_fd),
 * two memfds as in the daemon. recs and p are the current run's.
 */
struct persist {
	struct kvpool_config cfg;
	int pool_fd, state_fd;
	size_t recs_bytes;
	uint8_t *recs;		/* (n_blocks, rec_bytes): this run's mapping of state_fd */
	struct kvpool *p;
};

static struct kvblock_rec *rec_of(const struct persist *ps, uint32_t id)
{
	return (struct kvblock_rec *)(ps->recs + (size_t)id * kvpool_rec_bytes(P_BT));
}

/* A run starts: the records mapped afresh, a pool on the same fd. */
static void persist_start(struct persist *ps)
{
	ps->recs = mmap(NULL, ps->recs_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, ps->state_fd, 0);
	assert_true(ps->recs != MAP_FAILED);
	assert_int_equal(kvpool_create_fd(&ps->p, &ps->cfg, ps->pool_fd), 0);
	kvpool_set_records(ps->p, ps->recs);
}

static void persist_init(struct persist *ps, uint32_t n_blocks)
{
	ps->cfg = (struct kvpool_config){ n_blocks, P_BT, 2, 64, KB_F16 };
	ps->pool_fd = memfd_create("test-kvpool", MFD_CLOEXEC);
	ps->state_fd = memfd_create("test-kvstate", MFD_CLOEXEC);
	assert_true(ps->pool_fd >= 0 && ps->state_fd >= 0);
	ps->recs_bytes = (size_t)n_blocks * kvpool_rec_bytes(P_BT);
	assert_int_equal(ftruncate(ps->state_fd, (off_t)ps->recs_bytes), 0);	/* zeroed records */
	persist_start(ps);
}

/*
 * The process dies: only the two fds survive. kvpool_destroy frees no more
 * than exit would (test_restore_round_trip proves it leaves the records be).
 */
static void persist_crash(struct persist *ps)
{
	kvpool_destroy(ps->p);
	ps->p = NULL;
	if (ps->recs)
		munmap(ps->recs, ps->recs_bytes);
	ps->recs = NULL;
}

/* Crash, start again, restore. Sequences of the dead run are freed with kvseq_release(NULL, s). */
static struct kvpool_restored persist_restart(struct persist *ps)
{
	struct kvpool_restored st;

	persist_crash(ps);
	persist_start(ps);
	memset(&st, 0xff, sizeof(st));
	kvpool_restore(ps->p, P_VOCAB, &st);
	return st;
}

static void persist_fini(struct persist *ps)
{
	persist_crash(ps);
	close(ps->pool_fd);
	close(ps->state_fd);
}

/* Byte j of the K (kv 0) or V (kv 1) row, layer l, of token tok at pos: the same wherever computed. */
static uint8_t kv_byte(uint32_t pos, uint32_t tok, uint32_t l, uint32_t kv, size_t j)
{
	uint64_t x = mix(((uint64_t)pos << 40) ^ ((uint64_t)tok << 20) ^ ((uint64_t)(j / 8) << 4) ^
			 (l << 1) ^ kv);

	return (uint8_t)(x >> (j % 8 * 8));
}

/* Every K and V row of positions [from, to) of s: toks[pos] is the token at pos. */
static void kv_write(struct kvpool *p, const struct kvseq *s, uint32_t from, uint32_t to,
		     const uint32_t *toks)
{
	const struct kvpool_config *c = kvpool_config(p);
	size_t rb = kvpool_row_bytes(c->kv_type, c->kv_dim);

	for (uint32_t pos = from; pos < to; pos++) {
		uint8_t *b = kvpool_block(p, s->blocks[pos / c->block_tokens]);
		for (uint32_t l = 0; l < c->n_layers; l++)
			for (uint32_t kv = 0; kv < 2; kv++) {
				uint8_t *row = b + row_off(p, l, kv, pos % c->block_tokens);
				for (size_t j = 0; j < rb; j++)
					row[j] = kv_byte(pos, toks[pos], l, kv, j);
			}
	}
}

static void kv_expect(struct kvpool *p, const struct kvseq *s, uint32_t from, uint32_t to,
		      const uint32_t *toks)
{
	const struct kvpool_config *c = kvpool_config(p);
	size_t rb = kvpool_row_bytes(c->kv_type, c->kv_dim);

	for (uint32_t pos = from; pos < to; pos++) {
		const uint8_t *b = kvpool_block(p, s->blocks[pos / c->block_tokens]);
		for (uint32_t l = 0; l < c->n_layers; l++)
			for (uint32_t kv = 0; kv < 2; kv++) {
				const uint8_t *row = b + row_off(p, l, kv, pos % c->block_tokens);
				for (size_t j = 0; j < rb; j++)
					if (row[j] != kv_byte(pos, toks[pos], l, kv, j))
						fail_msg("position %u (block %u) layer %u %c byte %zu: "
							 "%02x, expected %02x", pos,
							 s->blocks[pos / c->block_tokens], l,
							 kv ? 'V' : 'K', j, row[j],
							 kv_byte(pos, toks[pos], l, kv, j));
			}
	}
}

/* prepare + write the K/V of toks[from..to) + commit. */
static void persist_write(struct kvpool *p, struct kvseq *s, uint32_t from, uint32_t to,
			  const uint32_t *toks)
{
	assert_int_equal(kvseq_prepare(p, s, from, to), 0);
	kv_write(p, s, from, to, toks);
	assert_int_equal(kvseq_commit(p, s, from, to, toks + from), 0);
}

/*
 * A released sequence's full blocks come back after a restart: the same
 * prompt attaches them, and they hold the K/V the dead run wrote. Its
 * partial block comes back as a free block, not in the index.
 */
static void test_restore_round_trip(void **state)
{
	(void)state;
	struct persist ps;
	uint32_t toks[64], ids[4];
	uint64_t key = 0;
	struct kvseq a, b;
	struct kvpool_restored st;
	struct kvpool_stats ss;

	for (uint32_t i = 0; i < 64; i++)
		toks[i] = (i * 37 + 11) % P_VOCAB;
	persist_init(&ps, 16);
	kvseq_init(&a, 3);
	persist_write(ps.p, &a, 0, 56, toks);	/* 3.5 blocks */
	memcpy(ids, a.blocks, sizeof(ids));
	/* Each full block sealed with what its key is made of; the partial one vouches for nothing. */
	for (uint32_t i = 0; i < 3; i++) {
		const struct kvblock_rec *r = rec_of(&ps, ids[i]);
		assert_int_equal(r->state, KVB_SEALED | KVB_REGISTERED);
		assert_true(r->parent == key);
		key = kvpool_key(key, 3, toks + i * P_BT, P_BT);
		assert_true(r->key == key);
		assert_int_equal(r->ns, 3);
		assert_memory_equal(r->tokens, toks + i * P_BT, P_BT * sizeof(uint32_t));
	}
	assert_int_equal(rec_of(&ps, ids[3])->state, 0);
	kvseq_release(ps.p, &a);
	assert_int_equal(stats(ps.p).blocks_cached, 3);

	/* Tearing the pool down is no more than the process exiting: the records stay as they were. */
	uint8_t *snap = malloc(ps.recs_bytes);
	assert_non_null(snap);
	memcpy(snap, ps.recs, ps.recs_bytes);
	kvpool_destroy(ps.p);
	ps.p = NULL;
	assert_memory_equal(ps.recs, snap, ps.recs_bytes);
	free(snap);

	st = persist_restart(&ps);
	assert_int_equal(st.sealed, 3);
	assert_int_equal(st.registered, 3);
	assert_int_equal(st.dropped, 0);
	for (uint32_t i = 0; i < 3; i++)
		assert_true(kvpool_registered(ps.p, ids[i]));
	assert_false(kvpool_registered(ps.p, ids[3]));
	ss = stats(ps.p);
	assert_int_equal(ss.blocks_cached, 3);
	assert_int_equal(ss.blocks_free, 13);
	assert_int_equal(ss.blocks_in_use, 0);
	CHECK(ps.p, NULL, 0);

	/* The same prompt attaches the three full blocks (not the one holding its last token). */
	kvseq_init(&b, 3);
	assert_int_equal(kvseq_attach_prefix(ps.p, &b, toks, 56), 48);
	assert_memory_equal(b.blocks, ids, 3 * sizeof(uint32_t));
	assert_true(b.last_key == key);
	kv_expect(ps.p, &b, 0, 48, toks);
	const struct kvseq *l[] = { &b };
	CHECK(ps.p, l, 1);
	/* The restored pool carries on: the rest is computed and sealed as in any run. */
	persist_write(ps.p, &b, 48, 64, toks);
	assert_int_equal(rec_of(&ps, b.blocks[3])->state, KVB_SEALED | KVB_REGISTERED);
	assert_true(rec_of(&ps, b.blocks[3])->parent == key);
	CHECK(ps.p, l, 1);
	kvseq_release(ps.p, &b);
	CHECK(ps.p, NULL, 0);
	persist_fini(&ps);
}

/*
 * Only a commit seals. A sequence whose K/V are all written but never
 * committed leaves nothing a restart trusts, and neither do the sealed
 * blocks it evicted to get room: their records still add up (key, parent,
 * ns, tokens), so only the cleared state keeps restore from vouching for
 * K/V that now belong to another sequence.
 */
static void test_restore_uncommitted(void **state)
{
	(void)state;
	struct persist ps;
	uint32_t ta[49], tb[112], aid[3];
	struct kvseq a, b;
	struct kvpool_restored st;

	for (uint32_t i = 0; i < 49; i++)
		ta[i] = (i * 7 + 1) % P_VOCAB;
	for (uint32_t i = 0; i < 112; i++)
		tb[i] = (i * 13 + 500) % P_VOCAB;
	persist_init(&ps, 8);
	kvseq_init(&a, 1);
	persist_write(ps.p, &a, 0, 48, ta);
	memcpy(aid, a.blocks, sizeof(aid));
	kvseq_release(ps.p, &a);	/* cached, its last block least recently released */

	/* b takes the 5 free blocks and evicts a's blocks 2 and 1. */
	kvseq_init(&b, 1);
	assert_int_equal(kvseq_prepare(ps.p, &b, 0, 112), 0);
	assert_int_equal(stats(ps.p).evictions, 2);
	assert_int_equal(b.blocks[5], aid[2]);
	assert_int_equal(b.blocks[6], aid[1]);
	for (uint32_t i = 1; i < 3; i++) {
		const struct kvblock_rec *r = rec_of(&ps, aid[i]);
		assert_int_equal(r->state, 0);
		assert_true(r->key == kvpool_key(r->parent, r->ns, r->tokens, P_BT));
	}
	kv_write(ps.p, &b, 0, 112, tb);	/* every position written, none committed */
	for (uint32_t i = 0; i < 7; i++)
		assert_int_equal(rec_of(&ps, b.blocks[i])->state, 0);

	/* The crash comes with b in flight. */
	st = persist_restart(&ps);
	kvseq_release(NULL, &b);	/* the dead run's table */
	assert_int_equal(st.sealed, 1);
	assert_int_equal(st.registered, 1);
	assert_int_equal(st.dropped, 0);
	for (uint32_t id = 0; id < 8; id++) {
		assert_int_equal(kvpool_registered(ps.p, id), id == aid[0]);
		if (id != aid[0])
			assert_int_equal(rec_of(&ps, id)->state, 0);
	}
	assert_int_equal(stats(ps.p).blocks_cached, 1);
	assert_int_equal(stats(ps.p).blocks_free, 7);
	CHECK(ps.p, NULL, 0);

	/* a's chain now ends at its first block, which b never touched; b's prompt finds nothing. */
	kvseq_init(&a, 1);
	assert_int_equal(kvseq_attach_prefix(ps.p, &a, ta, 49), 16);
	assert_int_equal(a.blocks[0], aid[0]);
	kv_expect(ps.p, &a, 0, 16, ta);
	kvseq_init(&b, 1);
	assert_int_equal(kvseq_attach_prefix(ps.p, &b, tb, 112), 0);
	const struct kvseq *l[] = { &a, &b };
	CHECK(ps.p, l, 2);
	kvseq_release(ps.p, &a);
	kvseq_release(ps.p, &b);
	persist_fini(&ps);
}

/*
 * Records that do not check out are dropped (and cleared), one fault each,
 * every other check passing: a token changed, an unknown state, a token
 * id past the vocabulary (the key recomputed to match), a wrong key, the
 * registered bit without the sealed one. A record copied over another
 * registers its key once. A sealed record not in the index checks out but
 * stays free. Token vocab - 1 is still a token.
 */
static void test_restore_corrupt(void **state)
{
	(void)state;
	enum { N = 9 };
	struct persist ps;
	uint32_t toks[N][17], ids[N];
	struct kvseq s[N];
	struct kvpool_restored st;

	persist_init(&ps, 16);
	for (uint32_t k = 0; k < N; k++) {
		for (uint32_t i = 0; i < 17; i++)
			toks[k][i] = k == 8 ? P_VOCAB - 1 - i : (k * 101 + i * 7) % P_VOCAB;
		kvseq_init(&s[k], 0);
		persist_write(ps.p, &s[k], 0, 16, toks[k]);
		ids[k] = s[k].blocks[0];
		assert_int_equal(rec_of(&ps, ids[k])->state, KVB_SEALED | KVB_REGISTERED);
		kvseq_release(ps.p, &s[k]);
	}
	struct kvblock_rec *r;
	rec_of(&ps, ids[0])->tokens[3] ^= 1;
	rec_of(&ps, ids[1])->state = 7;
	r = rec_of(&ps, ids[2]);
	r->tokens[0] = P_VOCAB;
	r->key = kvpool_key(r->parent, r->ns, r->tokens, P_BT);
	rec_of(&ps, ids[3])->key ^= 1ull << 40;
	rec_of(&ps, ids[4])->state = KVB_REGISTERED;
	memcpy(rec_of(&ps, ids[6]), rec_of(&ps, ids[5]), kvpool_rec_bytes(P_BT));
	rec_of(&ps, ids[7])->state = KVB_SEALED;

	st = persist_restart(&ps);
	assert_int_equal(st.dropped, 5);
	assert_int_equal(st.sealed, 4);		/* 5, its copy 6, 7, 8 */
	assert_int_equal(st.registered, 2);	/* one of 5 and 6, and 8 */
	for (uint32_t k = 0; k < 5; k++)
		assert_int_equal(rec_of(&ps, ids[k])->state, 0);
	assert_int_equal(kvpool_registered(ps.p, ids[5]) + kvpool_registered(ps.p, ids[6]), 1);
	uint32_t dup = kvpool_registered(ps.p, ids[5]) ? ids[5] : ids[6];
	uint32_t other = dup == ids[5] ? ids[6] : ids[5];
	assert_int_equal(rec_of(&ps, dup)->state, KVB_SEALED | KVB_REGISTERED);
	assert_int_equal(rec_of(&ps, other)->state, 0);
	assert_false(kvpool_registered(ps.p, ids[7]));
	assert_int_equal(rec_of(&ps, ids[7])->state, 0);
	assert_true(kvpool_registered(ps.p, ids[8]));
	assert_int_equal(rec_of(&ps, ids[8])->state, KVB_SEALED | KVB_REGISTERED);
	assert_int_equal(stats(ps.p).blocks_cached, 2);
	assert_int_equal(stats(ps.p).blocks_free, 14);
	CHECK(ps.p, NULL, 0);

	/* Each prompt finds only what checked out. */
	const struct kvseq *l[N];
	for (uint32_t k = 0; k < N; k++) {
		kvseq_init(&s[k], 0);
		int want = k == 5 || k == 8 ? 16 : 0;
		int got = kvseq_attach_prefix(ps.p, &s[k], toks[k], 17);
		if (got != want)
			fail_msg("prompt %u: %d tokens attached, expected %d", k, got, want);
		l[k] = &s[k];
	}
	assert_int_equal(s[5].blocks[0], dup);
	kv_expect(ps.p, &s[8], 0, 16, toks[8]);
	CHECK(ps.p, l, N);
	for (uint32_t k = 0; k < N; k++)
		kvseq_release(ps.p, &s[k]);
	CHECK(ps.p, NULL, 0);
	persist_fini(&ps);
}

/*
 * Sequences A, B, C (two full blocks each) released B, C, A: the LRU holds
 * B1 B0 C1 C0 A1 A0 (a sequence lets go of its last block first), an
 * order the block ids (A0 A1 B0 B1 C0 C1) do not give. ids[k][i] is block
 * i of sequence k.
 */
static void lru_setup(struct persist *ps, uint32_t toks[3][33], uint32_t ids[3][2])
{
	struct kvseq s[3];
	const int order[3] = { 1, 2, 0 };

	persist_init(ps, 8);
	for (uint32_t k = 0; k < 3; k++) {
		for (uint32_t i = 0; i < 33; i++)
			toks[k][i] = (k * 311 + i * 3) % P_VOCAB;
		kvseq_init(&s[k], 0);
		persist_write(ps->p, &s[k], 0, 32, toks[k]);
		memcpy(ids[k], s[k].blocks, 2 * sizeof(uint32_t));
	}
	for (int i = 0; i < 3; i++)
		kvseq_release(ps->p, &s[order[i]]);
}

/*
 * Allocate every block: the n_free free ones first (no eviction), then the
 * cached ones must be evicted in the order given; then -ENOSPC.
 */
static void expect_alloc_order(struct kvpool *p, uint32_t n_free, const uint32_t *cached,
			       uint32_t n_cached)
{
	uint32_t id;

	for (uint32_t i = 0; i < n_free; i++)
		assert_int_equal(kvpool_alloc(p, &id), 0);
	assert_int_equal(stats(p).evictions, 0);
	for (uint32_t i = 0; i < n_cached; i++) {
		assert_int_equal(kvpool_alloc(p, &id), 0);
		if (id != cached[i])
			fail_msg("eviction %u took block %u, expected %u", i, id, cached[i]);
	}
	assert_int_equal(stats(p).evictions, n_cached);
	assert_int_equal(kvpool_alloc(p, &id), -ENOSPC);
	for (id = 0; id < kvpool_config(p)->n_blocks; id++)
		kvpool_unref(p, id);
	CHECK(p, NULL, 0);
}

/* After a restart the cached blocks are evicted in the order they were released before it. */
static void test_restore_lru_order(void **state)
{
	(void)state;
	struct persist ps;
	uint32_t toks[3][33], ids[3][2];
	struct kvpool_restored st;

	lru_setup(&ps, toks, ids);
	st = persist_restart(&ps);
	assert_int_equal(st.registered, 6);
	const uint32_t want[6] = { ids[1][1], ids[1][0], ids[2][1], ids[2][0], ids[0][1], ids[0][0] };
	expect_alloc_order(ps.p, 2, want, 6);
	persist_fini(&ps);
}

/*
 * A release after a restart sorts after every release before it: B,
 * attached and released in the second run, is evicted last in the third;
 * C and A keep their order from the first.
 */
static void test_restore_lru_continues(void **state)
{
	(void)state;
	struct persist ps;
	uint32_t toks[3][33], ids[3][2];
	struct kvpool_restored st;
	struct kvseq b;

	lru_setup(&ps, toks, ids);
	st = persist_restart(&ps);
	assert_int_equal(st.registered, 6);
	kvseq_init(&b, 0);
	assert_int_equal(kvseq_attach_prefix(ps.p, &b, toks[1], 33), 32);
	kvseq_release(ps.p, &b);	/* LRU: C1 C0 A1 A0 B1 B0 */
	st = persist_restart(&ps);
	assert_int_equal(st.registered, 6);
	const uint32_t want[6] = { ids[2][1], ids[2][0], ids[0][1], ids[0][0], ids[1][1], ids[1][0] };
	expect_alloc_order(ps.p, 2, want, 6);
	persist_fini(&ps);
}

/*
 * A write into a sealed block unseals it first. b's first block is full,
 * sealed and private (a registered the same prefix first); truncating into
 * it and preparing a rewrite in place clears its record before any byte
 * changes, and the commit seals it again under the new key. A registered
 * block is never rewritten: the copy starts unsealed, the original keeps
 * its seal. A crash between the write and the commit trusts only what was
 * sealed.
 */
static void test_restore_truncate_unseals(void **state)
{
	(void)state;
	struct persist ps;
	uint32_t prompt[33], alt[17], alt2[16];
	struct kvseq a, b;
	struct kvpool_restored st;

	for (uint32_t i = 0; i < 33; i++)
		prompt[i] = (i * 5 + 2) % P_VOCAB;
	memcpy(alt, prompt, 8 * sizeof(uint32_t));	/* alt: prompt's first 8 tokens, then others */
	for (uint32_t i = 8; i < 17; i++)
		alt[i] = 900 + i;
	memcpy(alt2, prompt, 4 * sizeof(uint32_t));
	for (uint32_t i = 4; i < 16; i++)
		alt2[i] = 800 + i;
	persist_init(&ps, 16);
	kvseq_init(&a, 2);
	kvseq_init(&b, 2);
	persist_write(ps.p, &a, 0, 16, prompt);
	persist_write(ps.p, &b, 0, 32, prompt);
	uint32_t a0 = a.blocks[0], b0 = b.blocks[0], b1 = b.blocks[1];
	uint64_t k0 = a.last_key;
	assert_false(kvpool_registered(ps.p, b0));	/* -EEXIST: a has the key */
	assert_int_equal(rec_of(&ps, b0)->state, KVB_SEALED);
	assert_true(rec_of(&ps, b0)->key == k0);
	assert_int_equal(rec_of(&ps, b1)->state, KVB_SEALED | KVB_REGISTERED);
	assert_true(rec_of(&ps, b1)->parent == k0);

	/* Private: rewritten in place, unsealed before the write. */
	uint64_t cow = stats(ps.p).cow_copies;
	assert_int_equal(kvseq_prepare(ps.p, &b, 8, 16), 0);
	assert_int_equal(b.blocks[0], b0);
	assert_int_equal(stats(ps.p).cow_copies, cow);
	assert_int_equal(rec_of(&ps, b0)->state, 0);
	assert_int_equal(kvpool_refcount(ps.p, b1), 0);	/* dropped, cached, untouched */
	assert_int_equal(rec_of(&ps, b1)->state, KVB_SEALED | KVB_REGISTERED);
	kv_write(ps.p, &b, 8, 16, alt);
	assert_int_equal(kvseq_commit(ps.p, &b, 8, 16, alt + 8), 0);
	uint64_t kb = kvpool_key(0, 2, alt, P_BT);
	assert_true(b.last_key == kb);
	assert_int_equal(rec_of(&ps, b0)->state, KVB_SEALED | KVB_REGISTERED);
	assert_true(rec_of(&ps, b0)->key == kb);
	assert_memory_equal(rec_of(&ps, b0)->tokens, alt, P_BT * sizeof(uint32_t));

	/* Registered: the write goes to a copy, which vouches for nothing yet. */
	assert_int_equal(kvseq_prepare(ps.p, &a, 4, 16), 0);
	assert_int_equal(stats(ps.p).cow_copies, cow + 1);
	uint32_t copy = a.blocks[0];
	assert_int_not_equal(copy, a0);
	assert_int_equal(rec_of(&ps, copy)->state, 0);
	assert_int_equal(rec_of(&ps, a0)->state, KVB_SEALED | KVB_REGISTERED);
	assert_true(rec_of(&ps, a0)->key == k0);
	kv_write(ps.p, &a, 4, 16, alt2);
	{
		const struct kvseq *l[] = { &a, &b };
		CHECK(ps.p, l, 2);
	}

	/* Crash before a commits. */
	st = persist_restart(&ps);
	kvseq_release(NULL, &a);
	kvseq_release(NULL, &b);
	assert_int_equal(st.sealed, 3);		/* a0, b0 (resealed), b1 */
	assert_int_equal(st.registered, 3);
	assert_int_equal(st.dropped, 0);
	assert_false(kvpool_registered(ps.p, copy));
	assert_int_equal(rec_of(&ps, copy)->state, 0);

	/* prompt: a's original first block and b's second, as written before the crash. */
	kvseq_init(&a, 2);
	assert_int_equal(kvseq_attach_prefix(ps.p, &a, prompt, 33), 32);
	assert_int_equal(a.blocks[0], a0);
	assert_int_equal(a.blocks[1], b1);
	kv_expect(ps.p, &a, 0, 32, prompt);
	/* alt: b's rewritten block, old first half and new second half. */
	kvseq_init(&b, 2);
	assert_int_equal(kvseq_attach_prefix(ps.p, &b, alt, 17), 16);
	assert_int_equal(b.blocks[0], b0);
	kv_expect(ps.p, &b, 0, 16, alt);
	const struct kvseq *l[] = { &a, &b };
	CHECK(ps.p, l, 2);
	kvseq_release(ps.p, &a);
	kvseq_release(ps.p, &b);
	CHECK(ps.p, NULL, 0);
	persist_fini(&ps);
}

/* ---- randomised ---- */

#define R_SEQS 8
#define R_MAXT 1024
#define R_KEYS 32

struct shadow {
	struct kvseq s;
	uint32_t tok[R_MAXT];
	uint64_t mk[R_MAXT];
	uint32_t n;
	int live;
};

struct rnd_state {
	struct kvpool *p;
	uint32_t bt, max_len;
	struct shadow sh[R_SEQS];
	uint32_t base[4][R_MAXT];
	/* Recently completed blocks: key and the markers of its first and last slots. */
	struct { uint64_t key, first, last; int used; } keys[R_KEYS];
	uint64_t rng;
	unsigned enospc, lookups_hit, lookups_miss;
};

static uint32_t rnd(struct rnd_state *r, uint32_t n)
{
	r->rng = mix(r->rng);
	return (uint32_t)((r->rng >> 32) % n);
}

static void verify_seq(struct rnd_state *r, const struct shadow *h)
{
	const struct kvseq *s = &h->s;

	assert_int_equal(s->n_tokens, h->n);
	if (h->n)
		assert_memory_equal(s->tokens, h->tok, h->n * sizeof(uint32_t));
	for (uint32_t i = 0; i < h->n; i++)
		expect_marker(r->p, s, i, h->mk[i]);
}

static void check_all(struct rnd_state *r)
{
	const struct kvseq *l[R_SEQS];
	size_t n = 0;

	for (int i = 0; i < R_SEQS; i++)
		if (r->sh[i].live)
			l[n++] = &r->sh[i].s;
	CHECK(r->p, l, n);
}

/* Positions [from, from + k) get toks; -ENOSPC leaves the sequence at [0, from). */
static int r_append(struct rnd_state *r, struct shadow *h, uint32_t from, const uint32_t *toks,
		    uint32_t k)
{
	struct kvpool_stats before = stats(r->p), after;
	int ret = kvseq_prepare(r->p, &h->s, from, from + k);

	if (ret == -ENOSPC) {
		r->enospc++;
		after = stats(r->p);
		assert_int_equal(h->s.n_tokens, from);
		assert_int_equal(h->s.n_blocks, (from + r->bt - 1) / r->bt);
		assert_int_equal(after.evictions, before.evictions);
		assert_int_equal(after.cow_copies, before.cow_copies);
		if (from == h->n)	/* nothing to truncate: nothing changed at all */
			assert_memory_equal(&before, &after, sizeof(before));
		h->n = from;
		return ret;
	}
	assert_int_equal(ret, 0);
	for (uint32_t i = 0; i < k; i++) {
		uint32_t pos = from + i;
		h->tok[pos] = toks[i];
		h->mk[pos] = next_marker(pos ? h->mk[pos - 1] : h->s.ns, toks[i]);
		put_marker(r->p, &h->s, pos, h->mk[pos]);
	}
	assert_int_equal(kvseq_commit(r->p, &h->s, from, from + k, toks), 0);
	h->n = from + k;

	/* Remember the last full block's key to probe the cache later. */
	uint32_t full = h->n / r->bt;
	if (full) {
		uint64_t key = 0;
		for (uint32_t b = 0; b < full; b++)
			key = kvpool_key(key, h->s.ns, h->tok + b * r->bt, r->bt);
		assert_true(key == h->s.last_key);
		unsigned slot = rnd(r, R_KEYS);
		r->keys[slot].key = key;
		r->keys[slot].first = h->mk[(full - 1) * r->bt];
		r->keys[slot].last = h->mk[full * r->bt - 1];
		r->keys[slot].used = 1;
	}
	return 0;
}

static void r_new(struct rnd_state *r, struct shadow *h)
{
	uint32_t prompt[R_MAXT];
	uint32_t n = 1 + rnd(r, r->max_len);
	const uint32_t *base = r->base[rnd(r, 4)];
	uint32_t keep = rnd(r, 3) ? n : rnd(r, n + 1);	/* often an exact base prefix */
	struct kvpool_stats before = stats(r->p), after;

	for (uint32_t i = 0; i < n; i++)
		prompt[i] = i < keep ? base[i] : rnd(r, 3);
	kvseq_init(&h->s, rnd(r, 4) ? 0 : 1 + rnd(r, 2));
	h->live = 1;
	h->n = 0;
	int hit = kvseq_attach_prefix(r->p, &h->s, prompt, n);
	assert_true(hit >= 0);
	assert_int_equal(hit % r->bt, 0);
	assert_true((uint32_t)hit <= (n - 1) / r->bt * r->bt);
	after = stats(r->p);
	assert_int_equal(after.prefix_hit_tokens - before.prefix_hit_tokens, hit);
	assert_int_equal(after.prefix_hit_blocks - before.prefix_hit_blocks, hit / r->bt);
	assert_int_equal(after.prefix_miss_tokens - before.prefix_miss_tokens, n - hit);
	assert_int_equal(after.prefix_miss_blocks - before.prefix_miss_blocks,
			 (n + r->bt - 1) / r->bt - hit / r->bt);
	for (int i = 0; i < hit; i++) {
		h->tok[i] = prompt[i];
		h->mk[i] = next_marker(i ? h->mk[i - 1] : h->s.ns, prompt[i]);
	}
	h->n = (uint32_t)hit;
	verify_seq(r, h);	/* reused blocks hold exactly what this prompt would compute */
	r_append(r, h, h->n, prompt + hit, n - (uint32_t)hit);
}

static void r_extend(struct rnd_state *r, struct shadow *h, uint32_t from)
{
	uint32_t toks[64];
	uint32_t k = rnd(r, 3) ? 1 : rnd(r, 2 * r->bt + 1);

	if (from + k > r->max_len)
		k = r->max_len - from;
	for (uint32_t i = 0; i < k; i++)
		toks[i] = rnd(r, 3);
	r_append(r, h, from, toks, k);
}

/* h (not live) becomes a fork of a random live sequence; 0 if the one drawn is not live. */
static int r_fork(struct rnd_state *r, struct shadow *h)
{
	struct shadow *src = &r->sh[rnd(r, R_SEQS)];
	if (!src->live)
		return 0;
	kvseq_init(&h->s, 12345);
	assert_int_equal(kvseq_fork(r->p, &h->s, &src->s), 0);
	memcpy(h->tok, src->tok, src->n * sizeof(uint32_t));
	memcpy(h->mk, src->mk, src->n * sizeof(uint64_t));
	h->n = src->n;
	h->live = 1;
	return 1;
}

/* Look up a random key ever registered; 0 if the slot drawn was never used. */
static int r_lookup(struct rnd_state *r)
{
	unsigned k = rnd(r, R_KEYS);
	uint32_t id;
	if (!r->keys[k].used)
		return 0;
	if (kvpool_lookup(r->p, r->keys[k].key, &id) == 0) {
		/* A key still present must still hold its content. */
		struct kvseq one = { .blocks = &id, .n_blocks = 1 };
		expect_marker(r->p, &one, 0, r->keys[k].first);
		expect_marker(r->p, &one, r->bt - 1, r->keys[k].last);
		kvpool_unref(r->p, id);
		r->lookups_hit++;
	} else {
		r->lookups_miss++;
	}
	return 1;
}

static void run_random(uint32_t bt, uint64_t seed, unsigned ops)
{
	struct rnd_state *r = calloc(1, sizeof(*r));
	struct kvpool_stats st;

	assert_non_null(r);
	r->p = make_pool(64, bt, 2, 8, KB_F16);
	r->bt = bt;
	r->max_len = 64 * bt / 4;
	if (r->max_len > R_MAXT)
		r->max_len = R_MAXT;
	r->rng = seed;
	for (int b = 0; b < 4; b++)
		for (uint32_t i = 0; i < R_MAXT; i++)
			r->base[b][i] = rnd(r, 3);

	for (unsigned op = 0; op < ops; op++) {
		struct shadow *h = &r->sh[rnd(r, R_SEQS)];
		unsigned what = rnd(r, 100);

		if (!h->live) {
			if (what < 60) {
				r_new(r, h);
			} else if (!r_fork(r, h)) {
				continue;
			}
		} else if (what < 55) {
			r_extend(r, h, h->n);
		} else if (what < 75) {
			r_extend(r, h, rnd(r, h->n + 1));	/* truncate, maybe rewrite */
		} else if (what < 85) {
			kvseq_release(r->p, &h->s);
			h->live = 0;
		} else if (!r_lookup(r)) {
			continue;
		}
		check_all(r);
		if (h->live)
			verify_seq(r, h);
		if (op % 64 == 0)
			for (int i = 0; i < R_SEQS; i++)
				if (r->sh[i].live)
					verify_seq(r, &r->sh[i]);
	}

	st = stats(r->p);
	/* The run exercised every path it is meant to (one-token blocks are never partial). */
	if (!st.prefix_hit_blocks || !st.evictions || (bt > 1 && !st.cow_copies) || !r->enospc ||
	    !r->lookups_hit || !r->lookups_miss)
		fail_msg("bt %u: hits %llu evictions %llu cow %llu enospc %u lookups %u/%u", bt,
			 (unsigned long long)st.prefix_hit_blocks,
			 (unsigned long long)st.evictions, (unsigned long long)st.cow_copies,
			 r->enospc, r->lookups_hit, r->lookups_miss);

	for (int i = 0; i < R_SEQS; i++)
		if (r->sh[i].live) {
			kvseq_release(r->p, &r->sh[i].s);
			r->sh[i].live = 0;
		}
	CHECK(r->p, NULL, 0);
	st = stats(r->p);
	assert_int_equal(st.blocks_in_use, 0);
	assert_int_equal(st.blocks_free + st.blocks_cached, 64);
	assert_int_equal(st.tokens_stored, 0);
	assert_int_equal(st.slots_allocated, 0);
	kvpool_destroy(r->p);
	free(r);
}

static void test_random_bt1(void **state)
{
	(void)state;
	run_random(1, 1, 20000);
}

static void test_random_bt4(void **state)
{
	(void)state;
	run_random(4, 2, 20000);
}

static void test_random_bt16(void **state)
{
	(void)state;
	run_random(16, 3, 20000);
}

/* Resident pages of [a, a + len) (mincore), page-aligned a. */
static size_t resident_pages(const uint8_t *a, size_t len)
{
	long pg = sysconf(_SC_PAGESIZE);
	size_t n = (len + (size_t)pg - 1) / (size_t)pg, r = 0;
	unsigned char *v = malloc(n);
	assert_non_null(v);
	assert_int_equal(mincore((void *)a, len, v), 0);
	for (size_t i = 0; i < n; i++)
		r += v[i] & 1;
	free(v);
	return r;
}

/*
 * kvpool_prefault(): every page of the pool resident afterwards, what a
 * block held before still there, a second call harmless; refused where the
 * kernel cannot (then skipped, with the reason).
 */
static void test_prefault(void **state)
{
	(void)state;
	struct kvpool *p = make_pool(64, 16, 4, 64, KB_F16);
	size_t bb = kvpool_block_bytes(p);
	uint32_t id;
	assert_int_equal(kvpool_alloc(p, &id), 0);
	uint8_t *b = kvpool_block(p, id);
	for (size_t i = 0; i < bb; i++)
		b[i] = (uint8_t)(i * 7 + 3);
	uint8_t *base = kvpool_block(p, 0);
	size_t total = 64 * bb;
	long pg = sysconf(_SC_PAGESIZE);
	size_t pages = (total + (size_t)pg - 1) / (size_t)pg;
	int rc = kvpool_prefault(p);
	if (rc == -EINVAL) {
		kvpool_destroy(p);
		printf("skipped: MADV_POPULATE_WRITE needs Linux 5.14+\n");
		skip();
	}
	assert_int_equal(rc, 0);
	assert_int_equal(resident_pages(base, total), pages);
	for (size_t i = 0; i < bb; i++)
		if (b[i] != (uint8_t)(i * 7 + 3))
			fail_msg("byte %zu of block %u changed by the prefault", i, id);
	assert_int_equal(kvpool_prefault(p), 0);
	assert_int_equal(kvpool_prefault(NULL), -EINVAL);
	kvpool_destroy(p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_config_validation),
		cmocka_unit_test(test_sizes),
		cmocka_unit_test(test_prefault),
		cmocka_unit_test(test_alloc_refcount),
		cmocka_unit_test(test_register_lookup),
		cmocka_unit_test(test_key),
		cmocka_unit_test(test_prefix_reuse),
		cmocka_unit_test(test_duplicate_prefix),
		cmocka_unit_test(test_lru_eviction),
		cmocka_unit_test(test_cow_fork),
		cmocka_unit_test(test_enospc_rollback),
		cmocka_unit_test(test_check_detects),
		cmocka_unit_test(test_restore_round_trip),
		cmocka_unit_test(test_restore_uncommitted),
		cmocka_unit_test(test_restore_corrupt),
		cmocka_unit_test(test_restore_lru_order),
		cmocka_unit_test(test_restore_lru_continues),
		cmocka_unit_test(test_restore_truncate_unseals),
		cmocka_unit_test(test_random_bt1),
		cmocka_unit_test(test_random_bt4),
		cmocka_unit_test(test_random_bt16),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
