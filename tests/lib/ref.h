/* ref.h — the tests' reference generator: one sequence to completion in process, as the daemon would run it. */
/*
 * What a daemon's tokens are compared with: the engine's own one-sequence
 * generator (engine/generate.c, the loop of `kvd --prompt`), in process.
 */
#ifndef KVD_TESTS_LIB_REF_H
#define KVD_TESTS_LIB_REF_H

#include <stdint.h>

struct fixture;
struct sampler_params;

/*
 * Generate after prompt (n,) on fx's engine with sampler sp (NULL:
 * greedy): at most max_out tokens into out (max_out,), stopping after an
 * end-of-generation token (kept; *eos set to 1) unless ignore_eos. The
 * prompt is prefilled in one step when it fits the engine's rows, else in
 * chunks (batch invariance makes that the same). Returns the tokens
 * written, or -errno; the sequence's blocks are given back either way.
 */
int ref_generate(struct fixture *fx, const struct sampler_params *sp, const uint32_t *prompt,
		 uint32_t n, uint32_t max_out, int ignore_eos, uint32_t *out, int *eos);

#endif
