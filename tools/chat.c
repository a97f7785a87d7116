/* chat.c — kvctl chat: the turns of one conversation in a session slot, kept across a daemon restart. */
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
	/* (A restart's -ERESTART and -ENOTCONN are the caller's to handle.) */
	if (err < 0 && err != -ECONNRESET && err != -EPIPE && err != -ERESTART && err != -ENOTCONN)
		fprintf(stderr, "kvctl: reset failed: %s\n", kvc_strerror(err));
	return err < 0 ? err : 0;
}

/* ---------------------------------------------------------------------- */
/* The conversation, as kvctl keeps it.                                   */

static void hist_clear(struct chat *ch)
{
	for (size_t i = 0; i < ch->n_msgs; i++)
		free((char *)ch->msgs[i].text);
	ch->n_msgs = 0;
}

void chat_free(struct chat *ch)
{
	hist_clear(ch);
	free(ch->msgs);
	ch->msgs = NULL;
	ch->cap_msgs = 0;
}

/* Keep a copy of text as the next message; takes text when own. 0 or -ENOMEM. */
static int hist_add(struct chat *ch, uint8_t role, char *text, size_t len, int own)
{
	char *copy = own ? text : malloc(len ? len : 1);
	if (!copy)
		return -ENOMEM;
	if (!own)
		memcpy(copy, text, len);
	if (ch->n_msgs == ch->cap_msgs) {
		size_t cap = ch->cap_msgs ? 2 * ch->cap_msgs : 16;
		struct kvc_message *m = realloc(ch->msgs, cap * sizeof(*m));
		if (!m) {
			free(copy);
			return -ENOMEM;
		}
		ch->msgs = m;
		ch->cap_msgs = cap;
	}
	ch->msgs[ch->n_msgs++] = (struct kvc_message){ .role = role, .text = copy, .len = len };
	return 0;
}

/* The reply t produced, as text: its tokens are still in the arena. NULL: out of memory. */
static char *reply_text(struct kvc_conn *c, const struct turn *t, size_t *len)
{
	const uint32_t *ids = (const uint32_t *)(kvc_arena(c, NULL) + t->out_off);
	size_t n = 0;
	for (uint32_t i = 0; i < t->n; i++) {
		uint32_t k = 0;
		n += kvc_token_bytes(c, ids[i], &k) ? k : 0;
	}
	char *s = malloc(n ? n : 1), *p = s;
	for (uint32_t i = 0; s && i < t->n; i++) {
		uint32_t k;
		const char *b = kvc_token_bytes(c, ids[i], &k);
		if (b) {
			memcpy(p, b, k);
			p += k;
		}
	}
	*len = n;
	return s;
}

/* A turn the slot now holds: the system message first, the user's line, the reply. */
static int hist_turn(struct chat *ch, const char *line, size_t n, const struct turn *t,
		     const struct kvctl_opts *o)
{
	size_t len;
	char *reply = reply_text(ch->c, t, &len);
	int err = !reply ? -ENOMEM : 0;
	if (!err && !ch->n_msgs && o->system)
		err = hist_add(ch, KVD_ROLE_SYSTEM, (char *)o->system, strlen(o->system), 0);
	if (!err)
		err = hist_add(ch, KVD_ROLE_USER, (char *)line, n, 0);
	if (!err)
		return hist_add(ch, KVD_ROLE_ASSISTANT, reply, len, 1);
	free(reply);
	return err;
}

/* ---------------------------------------------------------------------- */
/* A daemon restarted under the conversation.                             */

/* The library forgot the session: the daemon that came back did not have it. */
static int session_lost(struct chat *ch)
{
	uint64_t tok[2];
	return kvc_session_token(ch->c, ch->session, tok) == -ENOENT;
}

/* A new session in place of a lost one; 0, or -errno after saying why. */
static int chat_reopen(struct chat *ch)
{
	int err = kvc_session_open(ch->c, &ch->session);
	if (err)
		fprintf(stderr, "kvctl: cannot open a new session: %s\n", kvc_strerror(err));
	return err;
}

/* The next turn, appended to the slot's conversation if it holds one. */
static int chat_send(struct chat *ch, const char *line, size_t n, const struct kvctl_opts *o,
		     struct turn *t)
{
	uint16_t flags = ch->flags | (ch->history ? KVD_SQE_APPEND : 0);
	/* The system message opens the conversation; later turns come after it. */
	return run_turn(ch->c, ch->session, ch->ud, line, n, ch->history ? NULL : o->system, flags,
			o, t);
}

/* The conversation so far and line as one message list, into a new buffer; its length or -errno. */
static int encode_all(struct chat *ch, const char *line, size_t n, char **out)
{
	if (hist_add(ch, KVD_ROLE_USER, (char *)line, n, 0))
		return -ENOMEM;
	int len = kvc_messages_encode(ch->msgs, ch->n_msgs, NULL, 0);
	*out = len > 0 ? malloc((size_t)len) : NULL;
	if (len > 0 && !*out)
		len = -ENOMEM;
	if (len > 0)
		kvc_messages_encode(ch->msgs, ch->n_msgs, *out, (size_t)len);
	free((char *)ch->msgs[--ch->n_msgs].text);	/* hist_turn() adds it once it is in */
	return len;
}

/*
 * The daemon came back without the conversation: send it all again with
 * line, in a new session if the old one is gone too. 0 or -errno.
 */
static int chat_resend(struct chat *ch, const char *line, size_t n, const struct kvctl_opts *o,
		       struct turn *t)
{
	int err = session_lost(ch) ? chat_reopen(ch) : 0;
	if (err)
		return err;
	fprintf(stderr, "[kvd restarted without the conversation; it is sent again]\n");
	ch->ud += 2;
	if (ch->history && !(kvc_info(ch->c)->features & KVD_FEAT_MESSAGES)) {
		fprintf(stderr, "kvctl: this daemon cannot take a whole conversation (feature messages): "
			"it starts over from this turn\n");
		hist_clear(ch);
		ch->history = 0;
	}
	if (!ch->history)
		return chat_send(ch, line, n, o, t);
	char *msgs;
	int len = encode_all(ch, line, n, &msgs);
	if (len < 0) {
		fprintf(stderr, "kvctl: the conversation cannot be sent again: %s\n", strerror(-len));
		return len;
	}
	err = run_turn(ch->c, ch->session, ch->ud, msgs, (size_t)len, NULL,
		       ch->flags | KVD_SQE_MESSAGES, o, t);
	free(msgs);
	return err;
}

/* The daemon restarted under the turn (or lost the slot's KV with it). */
static int restarted(const struct turn *t)
{
	return t->res == -ERESTART || t->res == -ESTALE;
}

/*
 * One user turn. The daemon restarting under it gives -ERESTART: the
 * session came back as it was before the turn, so the same turn goes again
 * (once); or the session, or its slot's KV, did not come back, and the
 * whole conversation goes again. A turn the user cancelled meanwhile is
 * not sent again. 0, or -errno of the connection.
 */
static int chat_turn(struct chat *ch, const char *line, size_t n, const struct kvctl_opts *o,
		     struct turn *t)
{
	int err = chat_send(ch, line, n, o, t);
	if (err == -ENOTCONN && session_lost(ch))	/* lost since the last turn: no region left */
		return chat_resend(ch, line, n, o, t);
	if (err || !restarted(t) || tool_interrupted)
		return err;
	if (t->shown)
		putchar('\n');
	if (t->res == -ERESTART && !session_lost(ch)) {
		fprintf(stderr, "[kvd restarted; the turn is sent again]\n");
		ch->ud += 2;
		if ((err = chat_send(ch, line, n, o, t)) || !restarted(t) || tool_interrupted)
			return err;
		if (t->shown)
			putchar('\n');
	}
	if (t->res == -ESTALE || session_lost(ch))
		return chat_resend(ch, line, n, o, t);
	return 0;	/* a second restart: the caller reports it */
}

/* /reset, also when a restart lost the session under it. 0, or -errno after saying why. */
static int chat_reset(struct chat *ch)
{
	int err = reset_slot(ch->c, ch->session, ch->ud);
	/* A session the daemon lost holds nothing: a new one is as good as reset. */
	if ((err == -ERESTART || err == -ENOTCONN) && session_lost(ch))
		err = chat_reopen(ch);
	else if (err == -ERESTART)
		err = reset_slot(ch->c, ch->session, ch->ud += 2);
	return err;
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
		int err = chat_reset(ch);
		if (err == -ECONNRESET || err == -EPIPE)
			return err;
		if (err == -ESHUTDOWN)
			return 1;
		if (err < 0)
			return 0;
		ch->history = 0;
		hist_clear(ch);
		if (ch->tty)
			fprintf(stderr, "(history cleared)\n");
		return 0;
	}
	struct turn t;
	int err = chat_turn(ch, line, n, o, &t);
	if (err)
		return err;
	if (turn_shutdown(&t)) {
		if (t.shown)
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
	if (hist_turn(ch, line, n, &t, o)) {
		fprintf(stderr, "\nkvctl: out of memory\n");
		return -ENOMEM;
	}
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
