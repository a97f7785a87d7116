/*
 * test_kvresume.c — libkvclient across a daemon restart (shm/kvresume.c),
 * against a fake daemon in a thread that speaks just enough of uapi/kvd.h
 * to play both runs: the one that dies with requests in flight, and the
 * one that gives the sessions back with replays. It never runs a request,
 * so which were applied is what the script says: the fates the library
 * deduces from the replays (applied and replayed, applied before a
 * replayed one of its slot, not applied) are checked one by one, with the
 * region's remapping, the tokens and the doorbell a dead daemon refuses.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include "shm/kvclient.h"
#include "tests/lib/wait.h"

#define SQ	8
#define CQ	16
#define ARENA	4096
#define SID_A	0x100u		/* the fake's first session, table index 0 */
#define SID_B	0x201u		/* its second, index 1 */
#define WAIT_MS	60000		/* a hang, not a speed: nothing here takes more than a moment */

/* One connection's region as the fake daemon holds it. */
struct fake_region {
	int		memfd;
	int		kick[2], call[2];	/* socketpairs: [0] the daemon's end, [1] the client's */
	uint8_t		*base;			/* (layout.region_bytes,) */
	struct kvd_session_open_rep layout;
	int		sent;			/* its fds went with an open's reply */
};

struct fake {
	int		listen_fd;
	char		path[108];
	int		ctl[2];		/* a byte from the test: drop the connection ("crash") */
	int		ack[2];		/* a byte back once it is dropped */
	pthread_t	thread;

	/* The script. */
	uint32_t	features;	/* granted in HELLO (of what is asked) */
	uint64_t	tok_a[2], tok_b[2];	/* the tokens the first run hands out */
	uint64_t	tok_a2[2];	/* the one a resume of A hands out instead */
	struct kvd_cqe	replays[8];	/* posted before the reply to a resume of A */
	int		n_replays;
	int		resume_b;	/* the status of a resume of B: 0 resumes it */
	uint32_t	arena2;		/* the arena of later connections; 0: ARENA */
	int		need_wakeup;	/* the SQ says the daemon sleeps: clients kick */
	int		consume;	/* take SQEs off the SQ (and never complete them) */

	/* What happened. */
	int		conns;		/* connections accepted */
	int		n_opens;	/* fresh opens on the current connection */
	struct kvd_session_open_req last_resume;
	struct fake_region rg;		/* the current connection's */
};

/* ---------------------------------------------------------------------- */
/* The fake daemon.                                                       */

static void region_free(struct fake_region *r)
{
	if (r->base)
		munmap(r->base, r->layout.region_bytes);
	for (int i = 0; i < 2; i++) {
		if (r->kick[i] >= 0)
			close(r->kick[i]);
		if (r->call[i] >= 0)
			close(r->call[i]);
	}
	if (r->memfd >= 0)
		close(r->memfd);
	memset(r, 0, sizeof(*r));
	r->memfd = r->kick[0] = r->kick[1] = r->call[0] = r->call[1] = -1;
}

/* A region as kvd lays it out: SQ and CQ headers, SQEs, CQEs, arena, each 64-aligned. */
static int region_make(struct fake *f, struct fake_region *r)
{
	uint32_t arena = f->conns > 1 && f->arena2 ? f->arena2 : ARENA;
	struct kvd_session_open_rep *l = &r->layout;
	l->sq_entries = SQ;
	l->cq_entries = CQ;
	l->arena_bytes = arena;
	l->sq_off = 0;
	l->cq_off = sizeof(struct kvd_ring_hdr);
	l->sqes_off = 2 * sizeof(struct kvd_ring_hdr);
	l->cqes_off = l->sqes_off + SQ * sizeof(struct kvd_sqe);
	l->arena_off = l->cqes_off + CQ * sizeof(struct kvd_cqe);
	l->region_bytes = l->arena_off + arena;
	r->memfd = memfd_create("fake-kvd", MFD_CLOEXEC);
	if (r->memfd < 0 || ftruncate(r->memfd, (off_t)l->region_bytes) ||
	    socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, r->kick) ||
	    socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, r->call))
		return -errno;
	r->base = mmap(NULL, l->region_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, r->memfd, 0);
	if (r->base == MAP_FAILED) {
		r->base = NULL;
		return -errno;
	}
	struct kvd_ring_hdr *sq = (void *)(r->base + l->sq_off), *cq = (void *)(r->base + l->cq_off);
	sq->ring_entries = SQ;
	sq->ring_mask = SQ - 1;
	sq->flags = f->need_wakeup ? KVD_RING_NEED_WAKEUP : 0;
	cq->ring_entries = CQ;
	cq->ring_mask = CQ - 1;
	return 0;
}

static void post_cqe(struct fake_region *r, const struct kvd_cqe *e)
{
	struct kvd_ring_hdr *cq = (void *)(r->base + r->layout.cq_off);
	struct kvd_cqe *cqes = (void *)(r->base + r->layout.cqes_off);
	cqes[cq->tail & (CQ - 1)] = *e;
	__atomic_store_n(&cq->tail, cq->tail + 1, __ATOMIC_RELEASE);
}

static void reply(int fd, void *msg, size_t len, uint16_t type, uint32_t seq, int status,
		  const int *fds, int nfds)
{
	struct kvd_msg_hdr *h = msg;
	*h = (struct kvd_msg_hdr){ .magic = KVD_MAGIC, .type = type, .flags = KVD_MSGF_REPLY,
				   .len = (uint32_t)len, .seq = seq, .status = status };
	struct iovec iov = { msg, len };
	union {
		char buf[CMSG_SPACE(3 * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	if (nfds) {
		memset(&u, 0, sizeof(u));
		mh.msg_control = u.buf;
		mh.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
		struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
		memcpy(CMSG_DATA(cm), fds, (size_t)nfds * sizeof(int));
	}
	if (sendmsg(fd, &mh, MSG_NOSIGNAL) != (ssize_t)len)
		fprintf(stderr, "fake kvd: reply not sent: %s\n", strerror(errno));
}

static void fake_hello(struct fake *f, int fd, const struct kvd_hello_req *rq)
{
	struct kvd_hello_rep r;
	memset(&r, 0, sizeof(r));
	r.abi_version = KVD_ABI_VERSION;
	r.features = rq->features & f->features;
	r.vocab_size = 1000;
	r.ctx_len = 4096;
	r.bos_id = r.eos_id = r.eot_id = ~0U;
	r.max_sessions = 16;
	r.max_sq_entries = SQ;
	r.max_cq_entries = CQ;
	r.max_arena_bytes = ARENA;
	r.kv_block_tokens = 16;
	r.kv_blocks_total = 64;
	snprintf(r.model_name, sizeof(r.model_name), "fake");
	snprintf(r.backend, sizeof(r.backend), "cpu");
	r.max_tokens = 4096;
	r.max_slots = 4;
	r.daemon_pid = (uint32_t)f->conns;	/* tells the runs apart */
	reply(fd, &r, sizeof(r), KVD_MSG_HELLO, rq->hdr.seq, 0, NULL, 0);
}

/* The reply to an open of session id with token tok, the region's fds on the first. */
static void open_reply(struct fake *f, int fd, uint32_t seq, uint32_t id, const uint64_t tok[2],
		       uint32_t flags)
{
	struct kvd_session_open_rep r;
	int first = !f->rg.sent;
	if (!f->rg.base && region_make(f, &f->rg)) {
		reply(fd, &r, sizeof(r.hdr), KVD_MSG_SESSION_OPEN, seq, -EMFILE, NULL, 0);
		return;
	}
	r = f->rg.layout;
	r.session_id = id;
	r.flags = flags | (first ? KVD_OPENF_FDS : 0);
	memcpy(r.resume_token, tok, sizeof(r.resume_token));
	r.restored_slots = flags & KVD_OPENF_RESUMED ? 2 : 0;
	r.lost_slots = flags & KVD_OPENF_RESUMED ? 1 : 0;
	int fds[3] = { f->rg.memfd, f->rg.kick[1], f->rg.call[1] };
	size_t len = f->features & KVD_FEAT_RESUME ? sizeof(r) : offsetof(struct kvd_session_open_rep,
									 resume_token);
	reply(fd, &r, len, KVD_MSG_SESSION_OPEN, seq, 0, fds, first ? 3 : 0);
	if (first) {	/* in flight to the client now: the fake keeps only its own ends */
		f->rg.sent = 1;
		close(f->rg.kick[1]);
		close(f->rg.call[1]);
		f->rg.kick[1] = f->rg.call[1] = -1;
	}
}

static void fake_open(struct fake *f, int fd, const struct kvd_session_open_req *rq)
{
	static const uint64_t none[2];
	if (!(rq->flags & KVD_OPEN_RESUME)) {
		int a = f->n_opens++ == 0;
		open_reply(f, fd, rq->hdr.seq, a ? SID_A : SID_B, a ? f->tok_a : f->tok_b, 0);
		return;
	}
	f->last_resume = *rq;
	if (!memcmp(rq->token, f->tok_a, sizeof(f->tok_a)) && !f->rg.base && region_make(f, &f->rg))
		return;
	if (!memcmp(rq->token, f->tok_a, sizeof(f->tok_a))) {
		/* Before the reply, as kvd does: the client finds them there when it gets it. */
		for (int i = 0; i < f->n_replays; i++)
			post_cqe(&f->rg, &f->replays[i]);
		open_reply(f, fd, rq->hdr.seq, SID_A, f->tok_a2[0] || f->tok_a2[1] ? f->tok_a2 : none,
			   KVD_OPENF_RESUMED);
	} else if (!memcmp(rq->token, f->tok_b, sizeof(f->tok_b)) && !f->resume_b) {
		open_reply(f, fd, rq->hdr.seq, SID_B, f->tok_b, KVD_OPENF_RESUMED);
	} else {
		struct kvd_msg_hdr h;
		reply(fd, &h, sizeof(h), KVD_MSG_SESSION_OPEN, rq->hdr.seq,
		      f->resume_b ? f->resume_b : -ESTALE, NULL, 0);
	}
}

/* Serve one connection until the client hangs up or the test says crash (1). */
static int fake_serve(struct fake *f, int fd)
{
	union {
		struct kvd_msg_hdr hdr;
		struct kvd_hello_req hello;
		struct kvd_session_open_req open;
		uint8_t bytes[512];
	} m;
	for (;;) {
		struct pollfd p[2] = { { fd, POLLIN, 0 }, { f->ctl[0], POLLIN, 0 } };
		if (poll(p, 2, f->consume ? 1 : -1) < 0)
			continue;
		if (f->consume && f->rg.base) {
			struct kvd_ring_hdr *sq = (void *)(f->rg.base + f->rg.layout.sq_off);
			__atomic_store_n(&sq->head, __atomic_load_n(&sq->tail, __ATOMIC_ACQUIRE),
					 __ATOMIC_RELEASE);
		}
		char b;
		if (p[1].revents && read(f->ctl[0], &b, 1) == 1)
			return b == 'c';
		if (!p[0].revents)
			continue;
		ssize_t n = recv(fd, &m, sizeof(m), 0);
		if (n <= 0)
			return 0;
		if (m.hdr.type == KVD_MSG_HELLO) {
			fake_hello(f, fd, &m.hello);
		} else if (m.hdr.type == KVD_MSG_SESSION_OPEN) {
			fake_open(f, fd, &m.open);
		} else {
			struct kvd_msg_hdr h;	/* SESSION_CLOSE: fine; anything else is not served */
			reply(fd, &h, sizeof(h), m.hdr.type, m.hdr.seq,
			      m.hdr.type == KVD_MSG_SESSION_CLOSE ? 0 : -EOPNOTSUPP, NULL, 0);
		}
	}
}

static void *fake_main(void *arg)
{
	struct fake *f = arg;
	for (;;) {
		int fd = accept4(f->listen_fd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0)
			return NULL;	/* shut down by fake_stop() */
		__atomic_add_fetch(&f->conns, 1, __ATOMIC_SEQ_CST);
		f->n_opens = 0;
		int crashed = fake_serve(f, fd);
		/* Everything of the connection goes, as with a daemon that died. */
		close(fd);
		region_free(&f->rg);
		if (crashed && write(f->ack[1], "k", 1) != 1)
			return NULL;
	}
}

static struct fake *fake_start(uint32_t features)
{
	struct fake *f = calloc(1, sizeof(*f));
	assert_non_null(f);
	f->features = features;
	f->rg.memfd = f->rg.kick[0] = f->rg.kick[1] = f->rg.call[0] = f->rg.call[1] = -1;
	f->tok_a[0] = 0x1111;
	f->tok_a[1] = 0xaaaa;
	f->tok_b[0] = 0x2222;
	f->tok_b[1] = 0xbbbb;
	snprintf(f->path, sizeof(f->path), "/tmp/kvd-fake.%d.%p.sock", (int)getpid(), (void *)f);
	unlink(f->path);
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", f->path);
	f->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	assert_true(f->listen_fd >= 0);
	assert_int_equal(bind(f->listen_fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(f->listen_fd, 8), 0);
	assert_int_equal(pipe(f->ctl), 0);
	assert_int_equal(pipe(f->ack), 0);
	assert_int_equal(pthread_create(&f->thread, NULL, fake_main, f), 0);
	return f;
}

/* Drop the current connection as a crash would, and wait until it is gone. */
static void fake_crash(struct fake *f)
{
	char b;
	assert_int_equal(write(f->ctl[1], "c", 1), 1);
	assert_int_equal(read(f->ack[0], &b, 1), 1);
}

static void fake_stop(struct fake *f)
{
	shutdown(f->listen_fd, SHUT_RDWR);
	assert_int_equal(write(f->ctl[1], "q", 1), 1);	/* out of a connection it serves */
	pthread_join(f->thread, NULL);
	close(f->listen_fd);
	unlink(f->path);
	close(f->ctl[0]);
	close(f->ctl[1]);
	close(f->ack[0]);
	close(f->ack[1]);
	region_free(&f->rg);
	free(f);
}

/* ---------------------------------------------------------------------- */
/* Helpers.                                                               */

static void submit(struct kvc_conn *c, uint8_t op, uint32_t sid, uint32_t slot, uint64_t ud)
{
	struct kvd_sqe q;
	kvc_prep(&q, op, sid, slot, ud);
	assert_int_equal(kvc_submit(c, &q), 0);
}

/* The next CQE must be ud's final one with res and flags. */
static void expect(struct kvc_conn *c, uint64_t ud, int res, uint32_t flags)
{
	struct kvd_cqe e;
	assert_int_equal(kvc_wait(c, &e, WAIT_MS), 0);
	print_message("  ud %llu: res %d flags %#x\n", (unsigned long long)e.user_data, e.res, e.flags);
	assert_int_equal(e.user_data, ud);
	assert_int_equal(e.res, res);
	assert_int_equal(e.flags, flags);
}

static const uint8_t *fake_arena(const struct fake *f)
{
	return f->rg.base + f->rg.layout.arena_off;
}

/* ---------------------------------------------------------------------- */
/* Tests.                                                                 */

#define RS	KVD_CQE_RESTARTED
#define RP	KVD_CQE_REPLAY

/*
 * Seven requests in flight on two sessions when the daemon goes; the new
 * one gives A back with a replay of slot 0's second request (and one of
 * slot 2 whose completion was seen already) and has lost B. Slot 0's
 * first request was applied (its result lost), its second replayed, its
 * third not applied; everything else is -ERESTART, in submission order.
 */
static void test_settle_fates(void **state)
{
	(void)state;
	struct fake *f = fake_start(KVD_FEAT_ALL);
	struct kvc_conn *c;
	uint32_t a, b;
	uint64_t tok[2];
	f->tok_a2[0] = 0x3333;
	f->tok_a2[1] = 0xcccc;
	f->replays[0] = (struct kvd_cqe){ .user_data = 2, .res = 17, .slot = 0, .aux = 3,
					  .flags = KVD_CQE_PREFIX_HIT | RP };
	f->replays[1] = (struct kvd_cqe){ .user_data = 99, .res = 5, .slot = 2, .flags = RP };
	f->n_replays = 2;
	f->resume_b = -ESTALE;
	assert_int_equal(kvc_connect(&c, f->path), 0);
	kvc_set_reconnect(c, WAIT_MS);
	assert_int_equal(kvc_session_open(c, &a), 0);
	assert_int_equal(kvc_session_open(c, &b), 0);
	assert_int_equal(a, SID_A);
	assert_int_equal(b, SID_B);
	assert_int_equal(kvc_session_token(c, a, tok), 0);
	assert_true(tok[0] == 0x1111 && tok[1] == 0xaaaa);
	uint8_t *arena = kvc_arena(c, NULL);
	memcpy(arena, "the prompt", 11);
	int sock = kvc_socket_fd(c), call = kvc_call_fd(c);

	submit(c, KVD_OP_GENERATE, a, 0, 1);
	submit(c, KVD_OP_PREFILL, a, 0, 2);
	submit(c, KVD_OP_DECODE, a, 0, 3);
	submit(c, KVD_OP_GENERATE, a, 1, 4);
	submit(c, KVD_OP_NOP, a, 0, 5);
	submit(c, KVD_OP_RESET, a, 2, 6);
	submit(c, KVD_OP_GENERATE, b, 0, 7);
	fake_crash(f);

	expect(c, 1, 0, RP | RS);
	expect(c, 2, 17, KVD_CQE_PREFIX_HIT | RP | RS);
	expect(c, 3, -ERESTART, RS);
	expect(c, 4, -ERESTART, RS);
	expect(c, 5, -ERESTART, RS);
	expect(c, 6, -ERESTART, RS);
	expect(c, 7, -ERESTART, RS);
	struct kvd_cqe e;
	assert_int_equal(kvc_peek(c, &e), -EAGAIN);

	/* A came back with the same sizes asked, under its new token; B is forgotten. */
	assert_int_equal(f->last_resume.flags, KVD_OPEN_RESUME);
	assert_int_equal(f->last_resume.sq_entries, SQ);
	assert_int_equal(f->last_resume.cq_entries, CQ);
	assert_int_equal(f->last_resume.arena_bytes, ARENA);
	assert_int_equal(kvc_session_token(c, a, tok), 0);
	assert_true(tok[0] == 0x3333 && tok[1] == 0xcccc);
	assert_int_equal(kvc_session_token(c, b, tok), -ENOENT);
	/* The same addresses and fd numbers, the new daemon's region and facts under them. */
	assert_ptr_equal(kvc_arena(c, NULL), arena);
	assert_string_equal((const char *)fake_arena(f), "the prompt");
	assert_int_equal(kvc_socket_fd(c), sock);
	assert_int_equal(kvc_call_fd(c), call);
	assert_int_equal(kvc_info(c)->daemon_pid, 2);

	/* The new SQ starts at 0: a submit lands in its first slot. */
	submit(c, KVD_OP_DECODE, a, 0, 8);
	const struct kvd_ring_hdr *sq = (const void *)(f->rg.base + f->rg.layout.sq_off);
	const struct kvd_sqe *sqes = (const void *)(f->rg.base + f->rg.layout.sqes_off);
	assert_int_equal(__atomic_load_n(&sq->tail, __ATOMIC_ACQUIRE), 1);
	assert_int_equal(sqes[0].user_data, 8);
	kvc_close(c);
	fake_stop(f);
}

/*
 * Completions the dead daemon posted and nobody took come first, as they
 * were; a request they completed is not in flight any more, so its replay
 * (it was the slot's last) is dropped rather than delivered twice.
 */
static void test_settle_after_posted(void **state)
{
	(void)state;
	struct fake *f = fake_start(KVD_FEAT_ALL);
	struct kvc_conn *c;
	uint32_t a;
	f->replays[0] = (struct kvd_cqe){ .user_data = 1, .res = 4, .slot = 0, .flags = RP };
	f->n_replays = 1;
	assert_int_equal(kvc_connect(&c, f->path), 0);
	kvc_set_reconnect(c, WAIT_MS);
	assert_int_equal(kvc_session_open(c, &a), 0);
	submit(c, KVD_OP_GENERATE, a, 0, 1);
	submit(c, KVD_OP_GENERATE, a, 1, 2);
	post_cqe(&f->rg, &(struct kvd_cqe){ .user_data = 1, .res = 1, .flags = KVD_CQE_MORE });
	post_cqe(&f->rg, &(struct kvd_cqe){ .user_data = 1, .res = 4, .flags = KVD_CQE_LENGTH });
	fake_crash(f);
	expect(c, 1, 1, KVD_CQE_MORE);
	expect(c, 1, 4, KVD_CQE_LENGTH);
	expect(c, 2, -ERESTART, RS);
	struct kvd_cqe e;
	assert_int_equal(kvc_peek(c, &e), -EAGAIN);
	kvc_close(c);
	fake_stop(f);
}

/*
 * Reconnecting off: the hang-up is -ECONNRESET; kvc_reconnect() by hand
 * then does what the library would have (an event loop's way), and refuses
 * (-EISCONN) while the daemon is there. A daemon without RESUME gives no
 * token and nothing back: every request in flight is -ERESTART.
 */
static void test_reconnect_by_hand(void **state)
{
	(void)state;
	struct fake *f = fake_start(KVD_FEAT_ALL & ~KVD_FEAT_RESUME);
	struct kvc_conn *c;
	struct kvd_cqe e;
	uint32_t a;
	uint64_t tok[2];
	assert_int_equal(kvc_connect(&c, f->path), 0);
	kvc_set_reconnect(c, 0);
	assert_int_equal(kvc_session_open(c, &a), 0);	/* a 96-byte reply */
	assert_int_equal(kvc_session_token(c, a, tok), -EOPNOTSUPP);
	assert_int_equal(kvc_reconnect(c), -EISCONN);
	submit(c, KVD_OP_GENERATE, a, 0, 1);
	submit(c, KVD_OP_NOP, a, 0, 2);
	fake_crash(f);
	assert_int_equal(kvc_wait(c, &e, WAIT_MS), -ECONNRESET);
	assert_int_equal(kvc_reconnect(c), 0);
	assert_int_equal(kvc_peek(c, &e), 0);
	assert_true(e.user_data == 1 && e.res == -ERESTART && e.flags == RS);
	assert_int_equal(kvc_peek(c, &e), 0);
	assert_true(e.user_data == 2 && e.res == -ERESTART && e.flags == RS);
	assert_int_equal(kvc_peek(c, &e), -EAGAIN);
	/* The session is gone; until one is opened there is no region to submit to. */
	assert_int_equal(kvc_session_token(c, a, tok), -ENOENT);
	struct kvd_sqe q;
	kvc_prep(&q, KVD_OP_NOP, a, 0, 3);
	assert_int_equal(kvc_submit(c, &q), -ENOTCONN);
	uint8_t *arena = kvc_arena(c, NULL);
	assert_int_equal(kvc_session_open(c, &a), 0);
	assert_ptr_equal(kvc_arena(c, NULL), arena);
	assert_int_equal(kvc_submit(c, &q), 0);
	kvc_close(c);
	fake_stop(f);
}

/* A new daemon whose region would not have the old layout fails the reconnect: -EPROTO. */
static void test_reconnect_layout_changed(void **state)
{
	(void)state;
	struct fake *f = fake_start(KVD_FEAT_ALL);
	struct kvc_conn *c;
	struct kvd_cqe e;
	uint32_t a;
	f->arena2 = ARENA / 2;
	assert_int_equal(kvc_connect(&c, f->path), 0);
	kvc_set_reconnect(c, 0);
	assert_int_equal(kvc_session_open(c, &a), 0);
	submit(c, KVD_OP_GENERATE, a, 0, 1);
	fake_crash(f);
	assert_int_equal(kvc_wait(c, &e, WAIT_MS), -ECONNRESET);
	assert_int_equal(kvc_reconnect(c), -EPROTO);
	kvc_close(c);
	fake_stop(f);
}

/*
 * A daemon that sleeps (NEED_WAKEUP) is kicked by a submit; once it is
 * dead the kick is refused. Reconnecting off, that submit says -EPIPE;
 * on, it reconnects, and the request, which never ran, goes to the new
 * daemon's SQ while the one before it gets -ERESTART.
 */
static void test_submit_finds_daemon_gone(void **state)
{
	(void)state;
	struct fake *f = fake_start(KVD_FEAT_ALL);
	struct kvc_conn *c;
	struct kvd_sqe q;
	uint32_t a;
	f->need_wakeup = 1;
	assert_int_equal(kvc_connect(&c, f->path), 0);
	kvc_set_reconnect(c, 0);
	assert_int_equal(kvc_session_open(c, &a), 0);
	submit(c, KVD_OP_GENERATE, a, 0, 1);
	fake_crash(f);
	kvc_prep(&q, KVD_OP_DECODE, a, 0, 2);
	assert_int_equal(kvc_submit(c, &q), -EPIPE);

	kvc_set_reconnect(c, WAIT_MS);
	assert_int_equal(kvc_submit(c, &q), 0);
	expect(c, 1, -ERESTART, RS);
	struct kvd_cqe e;
	assert_int_equal(kvc_peek(c, &e), -EAGAIN);
	const struct kvd_ring_hdr *sq = (const void *)(f->rg.base + f->rg.layout.sq_off);
	const struct kvd_sqe *sqes = (const void *)(f->rg.base + f->rg.layout.sqes_off);
	assert_int_equal(__atomic_load_n(&sq->tail, __ATOMIC_ACQUIRE), 1);
	assert_int_equal(sqes[0].user_data, 2);
	kvc_close(c);
	fake_stop(f);
}

/*
 * A program that saved its token reopens its session on a new connection:
 * the same id, the slot counts, and the replays left in the CQ for it.
 * An unknown token is -ESTALE.
 */
static void test_session_resume(void **state)
{
	(void)state;
	struct fake *f = fake_start(KVD_FEAT_ALL);
	struct kvc_conn *c;
	struct kvd_cqe e;
	uint32_t a, restored = 0, lost = 0;
	uint64_t tok[2], other[2] = { 0x4444, 0xdddd };
	f->replays[0] = (struct kvd_cqe){ .user_data = 5, .res = 9, .slot = 1, .flags = RP };
	f->n_replays = 1;
	assert_int_equal(kvc_connect(&c, f->path), 0);
	assert_int_equal(kvc_session_open(c, &a), 0);
	assert_int_equal(kvc_session_token(c, a, tok), 0);
	kvc_close(c);

	assert_int_equal(kvc_connect(&c, f->path), 0);
	assert_int_equal(kvc_session_resume(c, other, &a, NULL, NULL), -ESTALE);
	assert_int_equal(kvc_session_resume(c, tok, &a, &restored, &lost), 0);
	assert_int_equal(a, SID_A);
	assert_int_equal(restored, 2);
	assert_int_equal(lost, 1);
	assert_int_equal(kvc_peek(c, &e), 0);
	assert_true(e.user_data == 5 && e.res == 9 && e.flags == RP);
	uint64_t again[2];
	assert_int_equal(kvc_session_token(c, a, again), 0);	/* the given one: the reply had none */
	assert_true(again[0] == tok[0] && again[1] == tok[1]);
	kvc_close(c);
	fake_stop(f);
}

/* Two threads on one connection while the daemon restarts under them twice. */
struct race {
	struct kvc_conn	*c;
	struct fake	*f;
	uint32_t	sid;
	int		n;		/* requests the submitter sends */
	int		sent;		/* so far */
	int		errors;		/* submits that failed for good */
};

#define RACE_N 600

static void *race_submit(void *arg)
{
	struct race *r = arg;
	struct kvd_sqe q;
	for (int ud = 1; ud <= r->n; ud++) {
		kvc_prep(&q, KVD_OP_DECODE, r->sid, (uint32_t)ud % 4, (uint64_t)ud);
		int err;
		while ((err = kvc_submit(r->c, &q)) == -EAGAIN)
			usleep(50);
		r->errors += err != 0;
		__atomic_store_n(&r->sent, ud, __ATOMIC_RELEASE);
		if (ud % 8 == 0)
			usleep(100);
	}
	return NULL;
}

static void *race_crash(void *arg)
{
	struct race *r = arg;
	for (int k = 1; k <= 3; k++) {
		/* A third of the way, two thirds, and once all are sent: the last settles the rest. */
		while (__atomic_load_n(&r->sent, __ATOMIC_ACQUIRE) < r->n * k / 3)
			usleep(200);
		fake_crash(r->f);
	}
	return NULL;
}

/*
 * A submitting thread and a consuming one share the connection while the
 * daemon goes twice under them and then once more after the last submit;
 * both may run the reconnect (the consumer sees the hang-up, the
 * submitter a refused kick). The fake consumes SQEs and completes none:
 * every request gets exactly one final CQE, -ERESTART, from one reconnect
 * or another, and the in-flight table grows past the SQ's size; no wait
 * sleeps through a reconnect that settled its requests.
 */
static void test_two_threads(void **state)
{
	(void)state;
	struct fake *f = fake_start(KVD_FEAT_ALL);
	struct race r = { .f = f, .n = RACE_N };
	pthread_t sub, crash;
	static uint8_t seen[RACE_N + 1];
	f->consume = 1;
	f->need_wakeup = 1;
	assert_int_equal(kvc_connect(&r.c, f->path), 0);
	kvc_set_reconnect(r.c, WAIT_MS);
	assert_int_equal(kvc_session_open(r.c, &r.sid), 0);
	assert_int_equal(pthread_create(&sub, NULL, race_submit, &r), 0);
	assert_int_equal(pthread_create(&crash, NULL, race_crash, &r), 0);
	int got = 0, bad = 0;
	int64_t longest = 0;
	while (got < RACE_N) {
		struct kvd_cqe e;
		int64_t t0 = kw_now_ms();
		int err = kvc_wait(r.c, &e, WAIT_MS);
		int64_t took = kw_now_ms() - t0;
		longest = took > longest ? took : longest;
		if (err) {
			print_message("  kvc_wait: %s after %d CQEs\n", kvc_strerror(err), got);
			break;
		}
		bad += e.user_data < 1 || e.user_data > RACE_N || seen[e.user_data]++ ||
		       e.res != -ERESTART || e.flags != RS;
		got++;
	}
	pthread_join(sub, NULL);
	pthread_join(crash, NULL);
	print_message("  %d CQEs, %d wrong, %d connections; longest kvc_wait() %lld ms\n", got, bad,
		      f->conns, (long long)longest);
	assert_int_equal(r.errors, 0);
	/*
	 * A reconnect by the submitter settles the consumer's requests while it
	 * may be asleep in poll(): it must be woken (kvc__wake()), not left to
	 * sleep out its timeout with the CQEs there (it did, in about a third
	 * of runs). Half the timeout is no speed limit: a wake takes a moment.
	 */
	assert_true(longest < WAIT_MS / 2);
	assert_int_equal(got, RACE_N);
	assert_int_equal(bad, 0);
	kvc_close(r.c);
	fake_stop(f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_settle_fates),
		cmocka_unit_test(test_settle_after_posted),
		cmocka_unit_test(test_reconnect_by_hand),
		cmocka_unit_test(test_reconnect_layout_changed),
		cmocka_unit_test(test_submit_finds_daemon_gone),
		cmocka_unit_test(test_session_resume),
		cmocka_unit_test(test_two_threads),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
