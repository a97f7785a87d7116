/*
 * fuzz_ctrl.c — the control-message parser: a sequence of datagrams
 * (HELLO, SESSION_OPEN/CLOSE, STATS and garbage) on one connection of a
 * real in-process server. Input: records of [u16 len | bit 15: the engine
 * thread frees closed sessions afterwards][len bytes]. Every reply must be
 * well formed, and the hang-up at the end must give back everything.
 */
#include "tests/fuzz/harness.h"

static void check_reply(const void *msg, size_t len)
{
	struct kvd_msg_hdr h;
	if (len < sizeof(h))
		fz_die("reply", "shorter than a header");
	memcpy(&h, msg, sizeof(h));
	if (h.magic != KVD_MAGIC || !(h.flags & KVD_MSGF_REPLY) || h.len != len || h.status > 0)
		fz_die("reply", "malformed header");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct server *srv = fz_server();
	int client;
	struct conn *c = fz_conn_new(srv, &client);
	struct fz_in in = { data, size };
	uint8_t msg[SRV_RXBUF + 64];
	while (in.left) {
		uint32_t rec = fz_take(&in, 2);
		size_t len = rec & 0x7fff;
		if (len > in.left)
			len = in.left;
		/* Longer than any message: what a MSG_TRUNC receive hands over. */
		size_t n = len < sizeof(msg) ? len : sizeof(msg);
		memcpy(msg, in.p, n);
		in.p += len;
		in.left -= len;
		ctrl_handle_msg(srv, c, msg, n);
		fz_drain_replies(client, check_reply);
		if (rec & 0x8000) {
			pthread_mutex_lock(&srv->lock);
			release_closed_sessions(srv, c);
			pthread_mutex_unlock(&srv->lock);
		}
	}
	pthread_mutex_lock(&srv->lock);
	release_closed_sessions(srv, c);
	pthread_mutex_unlock(&srv->lock);
	fz_drain_replies(client, check_reply);
	fz_conn_free(srv, c, client);
	return 0;
}
