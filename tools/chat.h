/* chat.h — kvctl chat: the turns of one conversation in a session slot. */
#ifndef KVD_TOOLS_CHAT_H
#define KVD_TOOLS_CHAT_H

#include <stdint.h>
#include "tools/turn.h"

struct chat {
	struct kvc_conn	*c;
	uint32_t	session;
	uint64_t	ud;
	uint16_t	flags;		/* TEXT|CHAT and what text_flags() added */
	int		history;	/* the slot holds earlier turns: APPEND to them */
	int		tty;
};

/* Turns until end of input: 0, 1 when the daemon shuts down, -errno when it went away. */
int chat_loop(struct chat *ch, const struct kvctl_opts *o);

#endif
