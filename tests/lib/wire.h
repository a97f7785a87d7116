/* wire.h — a raw client: the kvd wire protocol by hand, written from uapi/kvd.h alone. */
/*
 * Not libkvclient: a test that must say what a library never would
 * (malformed messages, odd ring sizes, a tail no producer could write)
 * drives the daemon through this. HELLO and SESSION_OPEN over SOCK_SEQPACKET,
 * the region mapped from the first SESSION_OPEN's memfd, SQEs pushed and
 * CQEs read the way a client library does, kicks and waits included.
 * Every function returns 0 (or a count) or -errno.
 */
#ifndef KVD_TESTS_LIB_WIRE_H
#define KVD_TESTS_LIB_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include "uapi/kvd.h"

struct wire {
	int fd;				/* the SOCK_SEQPACKET connection */
	int memfd, kick_fd, call_fd;	/* from the first SESSION_OPEN */
	uint8_t *region;		/* (region_bytes,) shared with the daemon */
	size_t region_bytes;
	struct kvd_ring_hdr *sq, *cq;
	struct kvd_sqe *sqes;		/* (sq_entries,) */
	struct kvd_cqe *cqes;		/* (cq_entries,) */
	uint8_t *arena;			/* (arena_bytes,) */
	uint32_t arena_bytes, sq_entries, cq_entries;
	uint32_t sq_tail;		/* ours; published to sq->tail */
	uint32_t cq_head;		/* ours; published to cq->head */
	uint32_t seq;			/* of the last control message */
	uint32_t session;		/* the first session's id */
	struct kvd_hello_rep hello;
};

static inline struct kvd_msg_hdr wire_hdr(uint16_t type, size_t len)
{
	return (struct kvd_msg_hdr){ .magic = KVD_MAGIC, .type = type, .len = (uint32_t)len };
}

/* An unconnected client (fds -1, nothing mapped). */
void wire_init(struct wire *r);
/* Unmap and close everything; r is as wire_init() left it. */
void wire_close(struct wire *r);
/* A SOCK_SEQPACKET connection to sock, nothing said yet. */
int wire_connect(struct wire *r, const char *sock);
/*
 * One datagram within timeout_ms: its length, 0 at EOF, or -errno
 * (-ETIMEDOUT). Passed fds go to fds (at most 4, *nfds of them); with fds
 * NULL they are closed.
 */
int wire_recv(struct wire *r, void *buf, size_t cap, int *fds, int *nfds, int timeout_ms);
/* Send req (its header's seq is filled in here) and take the reply: its length or -errno. */
int wire_call(struct wire *r, void *req, size_t len, void *rep, size_t cap, int *fds, int *nfds);
/* HELLO at this ABI with features; the reply in r->hello. */
int wire_hello(struct wire *r, uint32_t features);
/* SESSION_OPEN; the first one also maps the region. 0 (id in *id), the reply's status or -errno. */
int wire_session_open(struct wire *r, uint32_t sq, uint32_t cq, uint32_t *id);
/* Connect, HELLO, SESSION_OPEN with sq/cq entries (0: defaults) into r->session. */
int wire_open(struct wire *r, const char *sock, uint32_t sq, uint32_t cq);
int wire_stats(struct wire *r, struct kvd_stats_rep *st);
/* Kick the daemon if it said it sleeps. */
int wire_kick_if_asleep(struct wire *r);
/* Publish one SQE; -EAGAIN when the SQ is full. */
int wire_submit(struct wire *r, const struct kvd_sqe *q);
/* Take one CQE if there is one (1), else 0. */
int wire_peek(struct wire *r, struct kvd_cqe *out);
/*
 * Wait for a CQE the way a client library sleeps: 0 with a CQE,
 * -ETIMEDOUT, -ECONNRESET when the daemon hung up.
 */
int wire_wait(struct wire *r, struct kvd_cqe *out, int timeout_ms);
/* Wait for ud's final CQE, passing over its MORE ones; another request's CQE is -EPROTO. */
int wire_finish(struct wire *r, uint64_t ud, struct kvd_cqe *fin, int timeout_ms);

#endif
