/* oneshot.h — kvd's modes that run once and exit: --prompt (in-process generation) and --info. */
#ifndef KVD_ONESHOT_H
#define KVD_ONESHOT_H

struct kvd_options;
struct model;
struct backend;
struct kvpool;

/*
 * --prompt: encode o->prompt (in the chat template with --chat), generate
 * up to o->n_predict tokens with o->sp, stream the text to stdout and the
 * speeds to stderr. Messages go to stderr; returns 0 or -errno.
 */
int oneshot_prompt(const struct kvd_options *o, struct model *m, struct backend *be,
		   struct kvpool *pool);

/* --info: the model's metadata on stdout. */
void oneshot_info(const struct model *m);

#endif
