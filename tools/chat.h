/* chat.h — kvctl chat: the turns of one conversation in a session slot. */
#ifndef KVD_TOOLS_CHAT_H
#define KVD_TOOLS_CHAT_H

#include <stdint.h>
#include "tools/turn.h"

struct chat {
	struct kvc_conn	*c;
	uint32_t	session;	/* a new one after a restart that lost the old */
	uint64_t	ud;
	uint16_t	flags;		/* TEXT|CHAT and what text_flags() added */
	int		history;	/* the slot holds earlier turns: APPEND to them */
	int		tty;
	/* The conversation the slot holds, to send again to a daemon that lost it. */
	struct kvc_message *msgs;	/* (n_msgs,) texts malloc'ed */
	size_t		n_msgs, cap_msgs;
};

/*
 * Turns until end of input: 0, 1 when the daemon shuts down, -errno when it
 * went away. With reconnecting on (kvc_set_reconnect()), a turn the daemon
 * restarted under is sent again: as it was when the session came back, or
 * as the whole conversation so far (KVD_SQE_MESSAGES) in a new session
 * when the daemon lost it.
 */
int chat_loop(struct chat *ch, const struct kvctl_opts *o);

/* Free what chat_loop() kept of the conversation. */
void chat_free(struct chat *ch);

#endif
