/* admit.h — SQE -> request: the pure checks of one SQE copy, and draining a connection's SQ. */
#ifndef KVD_ADMIT_H
#define KVD_ADMIT_H

#include <stdint.h>
#include "uapi/kvd.h"

struct server;
struct conn;

/* The opcode, flags and priority of q: 0 or -EINVAL. */
int validate_sqe_op(const struct kvd_sqe *q);
/*
 * The rest of a PREFILL, DECODE, GENERATE or RESET SQE, against nothing but
 * itself and the size of the arena it points into: fields its opcode does
 * not take are zero, sampling parameters in range, buffers inside the
 * arena. 0, -EINVAL or -EFAULT.
 */
int validate_sqe(const struct kvd_sqe *q, uint32_t arena_bytes);

/*
 * Engine thread, srv->lock held (and dropped while SQEs are read and text
 * tokenized): every SQE c has queued becomes a request or an error
 * completion.
 */
void admit_drain_sq(struct server *srv, struct conn *c);

#endif
