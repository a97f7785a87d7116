/* kvseq.c — sequences' block tables in the KV pool: prefix attach, prepare (copy-on-write), commit and register, fork. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/engine/kvpool_int.h"
#include "daemon/probes.h"
#include "kernels/backend.h"

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
		else
			rec_set_state(p, b, 0);	/* rewritten in place: sealed no more */
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
		kvpool_seal(p, s->blocks[i], s->last_key, s->ns, key, s->tokens + (size_t)i * bt);
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

/* ---- invariants ---- */

int kvseq_check(const struct kvpool *p, const struct kvseq *s, size_t k, uint32_t *refs,
		uint32_t *owner, char *err, size_t len)
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
