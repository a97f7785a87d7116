/* kvclient_priv.h — what libkvclient's own files share and the version script keeps local. */
#ifndef KVD_KVCLIENT_PRIV_H
#define KVD_KVCLIENT_PRIV_H

#include <stdint.h>

struct kvc_conn;

/* Free the arena reservations made since kvc_arena_alloc(c, 0, &mark) gave mark. */
void kvc__arena_release(struct kvc_conn *c, uint32_t mark);

#endif
