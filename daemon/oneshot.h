/* oneshot.h — kvd's modes that run once and exit: --prompt (in-process generation) and --info. */
#ifndef KVD_ONESHOT_H
#define KVD_ONESHOT_H

#include <stdint.h>

struct kvd_options;
struct model;
struct backend;
struct kvpool;

/* Reserve a KV pool for a request of tokens positions (main.c's, which logs its size). */
typedef int (*oneshot_pool_fn)(const struct kvd_options *o, const struct model *m,
			       struct backend *be, uint32_t tokens, struct kvpool **out);

/*
 * --prompt: encode o->prompt (in the chat template with --chat), reserve a
 * pool with make_pool for it and o->n_predict tokens, generate them with
 * o->sp, stream the text to stdout and the speeds to stderr (with
 * n_predict 0: prefill only, no text, and stderr says so). A prefill past
 * a second shows its progress on stderr when that is a terminal. Messages
 * go to stderr; returns 0 or -errno.
 */
int oneshot_prompt(const struct kvd_options *o, struct model *m, struct backend *be,
		   oneshot_pool_fn make_pool);

/*
 * --info: the model's metadata on stdout, and what it needs in memory at
 * o's KV type: weight bytes (mapped), KV bytes per token, the largest
 * context MemAvailable holds.
 */
void oneshot_info(const struct model *m, const struct kvd_options *o);

#endif
