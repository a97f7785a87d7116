/* logits.h — what the suites compute from a row of logits: its argmax and its log-softmax in double. */
#ifndef KVD_TESTS_LIB_LOGITS_H
#define KVD_TESTS_LIB_LOGITS_H

#include <math.h>
#include <stdint.h>

/* The index of the largest of x (n,); the lowest index wins ties, as the backends' argmax. */
static inline uint32_t logits_argmax(const float *x, uint32_t n)
{
	uint32_t best = 0;
	for (uint32_t i = 1; i < n; i++)
		if (x[i] > x[best])
			best = i;
	return best;
}

/* out (n,) = log softmax of x (n,), in double. */
static inline void logits_log_softmax(double *out, const float *x, uint32_t n)
{
	double max = x[0], sum = 0;
	for (uint32_t i = 1; i < n; i++)
		max = x[i] > max ? x[i] : max;
	for (uint32_t i = 0; i < n; i++)
		sum += exp(x[i] - max);
	double lse = max + log(sum);
	for (uint32_t i = 0; i < n; i++)
		out[i] = x[i] - lse;
}

#endif
