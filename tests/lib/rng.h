/* rng.h — the tests' one random number generator: a 64-bit LCG, fixed seeds, reproducible failures. */
/*
 * Knuth's MMIX constants, the generator most suites already used, so their
 * data stay what they were: rng_u32() is the state's top 31 bits after a
 * step (ids as `rng_u32() % vocab`), rng_unit() a double in [0, 1),
 * rng_sym() a float in [-1, 1) from 24 bits. Not for anything secret.
 */
#ifndef KVD_TESTS_LIB_RNG_H
#define KVD_TESTS_LIB_RNG_H

#include <stdint.h>

struct rng {
	uint64_t s;
};

static inline struct rng rng_make(uint64_t seed)
{
	return (struct rng){ seed };
}

/* Step and return the whole state. */
static inline uint64_t rng_next(struct rng *r)
{
	r->s = r->s * 6364136223846793005ull + 1442695040888963407ull;
	return r->s;
}

static inline uint32_t rng_u32(struct rng *r)
{
	return (uint32_t)(rng_next(r) >> 33);
}

/* Below n (n > 0); the modulo bias is irrelevant at test sizes. */
static inline uint32_t rng_below(struct rng *r, uint32_t n)
{
	return rng_u32(r) % n;
}

static inline double rng_unit(struct rng *r)
{
	return (double)(rng_next(r) >> 11) * 0x1p-53;
}

static inline float rng_sym(struct rng *r)
{
	return (float)((rng_next(r) >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

/* n token ids below vocab, the same for the same seed (a small seed is spread over the state first). */
static inline void rng_tokens(uint32_t *ids, uint32_t n, uint32_t vocab, uint64_t seed)
{
	struct rng r = rng_make(seed * 0x9e3779b97f4a7c15ull + 1);
	for (uint32_t i = 0; i < n; i++)
		ids[i] = rng_below(&r, vocab);
}

#endif
