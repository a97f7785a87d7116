/* loop.c — the io_uring backend of the event loop: prep, submit, dispatch. */
#include <errno.h>
#include <liburing.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/serve/loop.h"

struct loop {
	struct io_uring ring;
};

int loop_create(struct loop **out, unsigned entries)
{
	struct loop *l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	int rc = io_uring_queue_init(entries, &l->ring, 0);
	if (rc) {
		free(l);
		return rc;
	}
	*out = l;
	return 0;
}

void loop_destroy(struct loop *l)
{
	if (!l)
		return;
	io_uring_queue_exit(&l->ring);
	free(l);
}

/* An SQE for op, submitting first if the ring is full. */
static struct io_uring_sqe *get_sqe(struct loop *l, struct loop_op *op)
{
	if (op->armed)
		return NULL;
	struct io_uring_sqe *sqe = io_uring_get_sqe(&l->ring);
	if (!sqe) {
		io_uring_submit(&l->ring);
		sqe = io_uring_get_sqe(&l->ring);
	}
	return sqe;
}

static int arm(struct loop_op *op, struct io_uring_sqe *sqe)
{
	io_uring_sqe_set_data(sqe, op);
	op->armed = 1;
	return 0;
}

int loop_accept_multishot(struct loop *l, struct loop_op *op, int fd)
{
	struct io_uring_sqe *sqe = get_sqe(l, op);
	if (!sqe)
		return op->armed ? -EBUSY : -EAGAIN;
	io_uring_prep_multishot_accept(sqe, fd, NULL, NULL, SOCK_CLOEXEC);
	return arm(op, sqe);
}

int loop_poll_multishot(struct loop *l, struct loop_op *op, int fd)
{
	struct io_uring_sqe *sqe = get_sqe(l, op);
	if (!sqe)
		return op->armed ? -EBUSY : -EAGAIN;
	io_uring_prep_poll_multishot(sqe, fd, POLLIN);
	return arm(op, sqe);
}

int loop_recvmsg(struct loop *l, struct loop_op *op, int fd, struct msghdr *msg)
{
	struct io_uring_sqe *sqe = get_sqe(l, op);
	if (!sqe)
		return op->armed ? -EBUSY : -EAGAIN;
	io_uring_prep_recvmsg(sqe, fd, msg, MSG_CMSG_CLOEXEC);
	return arm(op, sqe);
}

int loop_read(struct loop *l, struct loop_op *op, int fd, void *buf, unsigned len)
{
	struct io_uring_sqe *sqe = get_sqe(l, op);
	if (!sqe)
		return op->armed ? -EBUSY : -EAGAIN;
	io_uring_prep_read(sqe, fd, buf, len, (uint64_t)-1);
	return arm(op, sqe);
}

int loop_timeout(struct loop *l, struct loop_op *op, unsigned msec)
{
	struct io_uring_sqe *sqe = get_sqe(l, op);
	if (!sqe)
		return op->armed ? -EBUSY : -EAGAIN;
	/* The kernel reads the timespec when the SQE is submitted: each op keeps its own. */
	op->ts.tv_sec = msec / 1000;
	op->ts.tv_nsec = (long long)(msec % 1000) * 1000000LL;
	io_uring_prep_timeout(sqe, &op->ts, 0, 0);
	return arm(op, sqe);
}

int loop_cancel(struct loop *l, struct loop_op *op)
{
	if (!op->armed)
		return 0;
	struct io_uring_sqe *sqe = io_uring_get_sqe(&l->ring);
	if (!sqe) {
		io_uring_submit(&l->ring);
		sqe = io_uring_get_sqe(&l->ring);
		if (!sqe)
			return -EAGAIN;
	}
	io_uring_prep_cancel(sqe, op, 0);
	/* The cancel's own completion carries no op. */
	io_uring_sqe_set_data(sqe, NULL);
	return 0;
}

int loop_run_once(struct loop *l, int wait)
{
	struct io_uring_cqe *cqe;
	int rc = wait ? io_uring_submit_and_wait(&l->ring, 1) : io_uring_submit(&l->ring);
	if (rc < 0 && rc != -EINTR && rc != -ETIME)
		return rc;
	while (io_uring_peek_cqe(&l->ring, &cqe) == 0) {
		struct loop_op *op = io_uring_cqe_get_data(cqe);
		int res = cqe->res;
		int more = (cqe->flags & IORING_CQE_F_MORE) != 0;
		/* Mark the CQE seen before the callback, which may re-arm or free op. */
		io_uring_cqe_seen(&l->ring, cqe);
		if (!op)
			continue;
		if (!more)
			op->armed = 0;
		op->cb(l, op, res, more);
	}
	return 0;
}
