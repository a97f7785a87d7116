/* server_config.h — what the server is told at start: socket, limits, prefix sharing, the reload hook. */
#ifndef KVD_SERVER_CONFIG_H
#define KVD_SERVER_CONFIG_H

#include <stdint.h>
#include <sys/types.h>

#define SRV_MAX_SESSIONS 64	/* per connection, hard cap */
#define SRV_MAX_SLOTS 64	/* per session, hard cap */

struct server_config {
	const char *socket_path;
	gid_t socket_gid;	/* (gid_t)-1: leave the group */
	uint32_t max_sessions;	/* per connection */
	uint32_t max_slots;	/* per session */
	uint32_t max_tokens;	/* per request, prompt plus generated */
	uint32_t max_inflight;	/* requests in flight per connection */
	uint32_t max_uid_conns;		/* connections of one uid */
	uint32_t max_uid_sessions;	/* sessions of one uid, all connections together */
	uint32_t max_uid_inflight;	/* requests in flight of one uid */
	uint64_t max_uid_arena;		/* shared-region bytes of one uid */
	uint32_t sq_entries;	/* defaults granted to SESSION_OPEN */
	uint32_t cq_entries;
	uint32_t arena_bytes;
	uint32_t max_arena_bytes; /* per connection */
	uint32_t max_batch_rows; /* rows in one engine step */
	uint32_t drain_timeout_ms;
	int prefix_global;	/* one prefix-cache namespace for everyone */
	int no_prefix_cache;	/* never reuse cached blocks (for comparisons) */
	uint32_t kv_quota;	/* KV blocks one uid may hold; 0: no quota */
	/* KV that survives a restart (serve/persist.h) */
	int no_persist;		/* never keep the pool and sessions across a restart */
	const char *state_dir;	/* keep them as files here (without systemd's fd store) */
	uint32_t state_records;	/* sequence slots the state can hold, all sessions together */
	uint32_t resume_timeout_s; /* a restored session nobody reopens is let go after this */
	/*
	 * SIGHUP: write the values that may change live into *live (a copy of
	 * the running config); the server installs it. NULL: nothing to reload.
	 */
	void (*reload)(void *arg, struct server_config *live);
	void *reload_arg;
};

#endif
