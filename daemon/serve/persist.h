/*
 * persist.h — KV that survives a restart. The pool's blocks live in one
 * memfd, and a second, versioned state memfd holds what makes them usable
 * again: a record per block (engine/kvpool.h, struct kvblock_rec: the
 * prefix index) and a record per sequence slot of every open session (its
 * tokens at its last request boundary, its pending token, the final CQE of
 * that request). Both memfds go to systemd's file-descriptor store, or are
 * files in --state-dir, and come back at the next start, where everything
 * in them is checked before anything is trusted: a state memfd is as
 * untrusted as a client's message.
 *
 * Only committed state is written: a block record vouches for K/V only
 * once the step that wrote them is over (kvpool's seal), a slot record
 * only at a request's end, written into the older of two copies whose
 * checksum and generation say which one is whole. A crash at any
 * instruction leaves, for every slot, the state after one of its completed
 * requests, and the final CQE of that request to replay.
 */
#ifndef KVD_PERSIST_H
#define KVD_PERSIST_H

#include <stdint.h>
#include <sys/types.h>
#include "daemon/engine/kvpool.h"
#include "uapi/kvd.h"

struct persist;
struct server;
struct server_config;
struct session;

/* What the saved state must have been made by to be trusted. */
struct persist_geom {
	uint64_t model_id;		/* model_identity() */
	struct kvpool_config pool;
	uint32_t ctx_len;
	uint32_t vocab;
};

/*
 * Find the two memfds systemd kept (or the files in cfg->state_dir) and
 * check the state's header against g; make them afresh when there are none
 * or they do not match (one log line says why). *out is NULL, with 0, when
 * nothing is to be kept (!persist_wanted(cfg)). -errno when the state directory cannot be used
 * (another kvd holds it).
 */
int persist_open(struct persist **out, const struct server_config *cfg, const struct persist_geom *g);
/* Whether cfg asks for the KV to be kept and there is somewhere to keep it. */
int persist_wanted(const struct server_config *cfg);
/* The fd the pool's blocks are to be mapped from (kvpool_create_fd). */
int persist_pool_fd(const struct persist *ps);
/*
 * The pool made on that fd: its block records from now on, and, when the
 * state matched, the prefix index they describe back (kvpool_restore).
 */
void persist_attach(struct persist *ps, struct kvpool *pool);
/*
 * In server_create, once the engine exists: every session the state kept
 * becomes an orphan (srv->orphans) holding what the prefix index gives back
 * of its slots' KV, waiting for a client to reopen it by token. Logs what
 * came back.
 */
void persist_restore_sessions(struct persist *ps, struct server *srv);
void persist_close(struct persist *ps);

/*
 * For tests and fuzzing: recompute every checksum of a state image (len
 * bytes, as the state file holds it: the header's, and each slot copy's
 * that is in use), so that a mutation reaches the checks behind them. An
 * image too short for its own header is left as it is.
 */
void persist_image_reseal(uint8_t *image, size_t len);

/* ---- as the daemon runs, srv->lock held ---- */

/* s (new, uid's) gets a token and its record; without room it is simply not kept (token 0). */
void persist_session_open(struct persist *ps, struct session *s, uid_t uid);
/* Slot k of s after a request ended: its state and the request's final CQE, kept. */
void persist_slot_save(struct persist *ps, struct session *s, uint32_t k);
/* s is gone (closed, or its client hung up): forget it. */
void persist_session_drop(struct persist *ps, struct session *s);

#endif
