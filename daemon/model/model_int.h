/* model_int.h — what model.c and model_rope.c share: metadata lookups by architecture-relative key. */
#ifndef KVD_MODEL_INT_H
#define KVD_MODEL_INT_H

#include <stddef.h>
#include <stdint.h>
#include "daemon/model/model.h"

/* "<arch>.<suffix>" into key; -ENAMETOOLONG when it does not fit. */
int model_key(const struct model *m, const char *suffix, char *key, size_t len);
/* The value of <arch>.<suffix>: 0, -ENOENT when absent, or -EINVAL with err naming the key. */
int model_get_u32(const struct model *m, const char *suffix, uint32_t *v, char *err, size_t errlen);
int model_get_f32(const struct model *m, const char *suffix, float *v, char *err, size_t errlen);

/*
 * RoPE scaling from metadata (rope.scaling.*): sets hp.rope_scaling,
 * rope_factor, rope_orig_ctx, max_ctx and m->rope's scaling fields, and for
 * llama3 metadata computes m->rope_factors_own. Needs hp's rot_dim, theta
 * and train_ctx. 0, or -errno with err naming the key.
 */
int model_rope_load(struct model *m, char *err, size_t errlen);

#endif
