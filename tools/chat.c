/* chat.c — kvctl chat: the turns of one conversation in a session slot. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include "shm/kvclient.h"
#include "tools/chat.h"
#include "tools/common.h"
#include "tools/turn.h"

/* Wait for the CQE of user_data ud, skipping others; its res, or -errno of the wait. */
static int wait_for(struct kvc_conn *c, uint64_t ud)
{
	struct kvd_cqe cqe;
	for (;;) {
		int err = kvc_wait(c, &cqe, -1);
		if (err == -EINTR)
			continue;
		if (err)
			return err;
		if (cqe.user_data == ud && !(cqe.flags & KVD_CQE_MORE))
			return cqe.res;
	}
}

/* /reset: forget the conversation the slot holds; 0, or -errno after saying why. */
static int reset_slot(struct kvc_conn *c, uint32_t session, uint64_t ud)
{
	struct kvd_sqe sqe;
	kvc_prep_reset(&sqe, session, SLOT, ud);
	int err = kvc_submit(c, &sqe);
	if (!err)
		err = wait_for(c, ud);
	if (err < 0 && err != -ECONNRESET && err != -EPIPE)
		fprintf(stderr, "kvctl: reset failed: %s\n", kvc_strerror(err));
	return err < 0 ? err : 0;
}

/*
 * One line of input: /reset, or a user turn and its streamed reply. 0 to
 * go on, 1 when the daemon is shutting down, -errno when the connection
 * is lost.
 */
static int chat_line(struct chat *ch, const char *line, size_t n, const struct kvctl_opts *o)
{
	ch->ud += 2;
	if (!strcmp(line, "/reset")) {
		int err = reset_slot(ch->c, ch->session, ch->ud);
		if (err == -ECONNRESET || err == -EPIPE)
			return err;
		if (err == -ESHUTDOWN)
			return 1;
		if (err < 0)
			return 0;
		ch->history = 0;
		if (ch->tty)
			fprintf(stderr, "(history cleared)\n");
		return 0;
	}
	struct turn t;
	uint16_t flags = ch->flags | (ch->history ? KVD_SQE_APPEND : 0);
	/* The system message opens the conversation; later turns come after it. */
	int err = run_turn(ch->c, ch->session, ch->ud, line, n, ch->history ? NULL : o->system,
			   flags, o, &t);
	if (err)
		return err;
	if (turn_shutdown(&t)) {
		if (t.n)
			putchar('\n');
		return 1;
	}
	if (t.res < 0) {
		report_error(ch->c, &t, o);
		if (t.res == -E2BIG && ch->history)
			fprintf(stderr, "kvctl: the conversation is full; /reset starts over\n");
		return 0;
	}
	ch->history = 1;
	putchar('\n');
	if (t.flags & KVD_CQE_CANCELLED)
		fprintf(stderr, "(cancelled)\n");
	fflush(stdout);
	return 0;
}

int chat_loop(struct chat *ch, const struct kvctl_opts *o)
{
	char *line = NULL;
	size_t cap = 0;
	int rc = 0;
	while (!rc) {
		if (ch->tty) {
			fputs("> ", stdout);
			fflush(stdout);
		}
		tool_interrupted = 0;
		ssize_t n = getline(&line, &cap, stdin);
		if (n < 0) {
			if (ch->tty)
				putchar('\n');
			break;
		}
		while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
			line[--n] = '\0';
		if (n > 0)
			rc = chat_line(ch, line, (size_t)n, o);
	}
	free(line);
	return rc;
}
