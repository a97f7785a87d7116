/* turn.h — kvctl's streamed turn: one text request submitted, its tokens printed as they come. */
#ifndef KVD_TOOLS_TURN_H
#define KVD_TOOLS_TURN_H

#include <stddef.h>
#include <stdint.h>
#include "shm/kvclient.h"

#define SLOT		0	/* kvctl uses one sequence slot of its session */

/* What the command line asked for. */
struct kvctl_opts {
	const char		*socket;	/* NULL: the library's default */
	uint32_t		max_tokens;
	struct kvc_sampling	sp;
	int			raw;
	int			json;
	unsigned int		poll_us;	/* --poll: busy-poll window after each completion; 0: off */
	int			chat;		/* generate --chat: the prompt is a user turn */
	const char		*system;	/* --system: a system message (chat only) */
	int			special;	/* --special: special tokens' spellings are tokens */
};

/* What became of one turn. */
struct turn {
	uint32_t	n;		/* tokens produced (prefill only: positions cached) */
	uint32_t	flags;		/* of the final CQE */
	uint32_t	aux;		/* of the final CQE: -E2BIG's positions needed */
	int		res;		/* the final CQE's res: n, or -errno */
	uint32_t	shown;		/* tokens printed, a failed turn's streamed ones too */
	uint32_t	out_off;	/* where the ids are in the arena */
	double		t_submit, t_first, t_last, t_end;
};

/*
 * Put text (and system, when not NULL) in the arena, submit one turn as
 * user_data ud: a GENERATE streaming o->max_tokens with flags | STREAM, or
 * a PREFILL for -n 0; print its tokens as they come (a progress line on
 * stderr while a long prefill runs, with KVD_SQE_PROGRESS in flags); a
 * SIGINT (tool_interrupted) sends CANCEL as ud + 1. The request's own
 * failure lands in t->res; returns 0 or -errno when the connection fails.
 */
int run_turn(struct kvc_conn *c, uint32_t session, uint64_t ud, const char *text, size_t len,
	     const char *system, uint16_t flags, const struct kvctl_opts *o, struct turn *t);

/* Decode speed: tokens after the first over the time they took. */
double turn_rate(const struct turn *t);

/* Whether the daemon's shutdown, not the user or the request, ended the turn. */
int turn_shutdown(const struct turn *t);

/* Why the final CQE stopped: "eos", "length", "cancelled", "shutdown" or "none". */
const char *stop_name(uint32_t flags);

/* The request's failure as one line on stderr, in kvd's terms. */
void report_error(struct kvc_conn *c, const struct turn *t, const struct kvctl_opts *o);

#endif
