/* loop.h — kvd's event loop: io_uring behind a few calls, callbacks carrying their own data. */
#ifndef KVD_LOOP_H
#define KVD_LOOP_H

#include <linux/time_types.h>
#include <stdint.h>
#include <sys/socket.h>

struct loop;
struct loop_op;

/*
 * Called once per completion: res is the operation's result (>= 0 or
 * -errno); more is nonzero while a multishot operation stays armed.
 */
typedef void (*loop_cb)(struct loop *l, struct loop_op *op, int res, int more);

/* One outstanding operation; owned by the caller, which must keep it alive while armed. */
struct loop_op {
	loop_cb cb;
	void *data;
	int armed;	/* set while the kernel may still complete it */
	struct __kernel_timespec ts;	/* loop_timeout's, alive while armed */
};

/* Returns 0 or -errno (-ENOSYS etc. when io_uring is unavailable). */
int loop_create(struct loop **out, unsigned entries);
void loop_destroy(struct loop *l);

/* Each arms op; completions arrive through op->cb. Return 0 or -errno (-EBUSY if op is armed). */
int loop_accept_multishot(struct loop *l, struct loop_op *op, int fd);
int loop_poll_multishot(struct loop *l, struct loop_op *op, int fd);
int loop_recvmsg(struct loop *l, struct loop_op *op, int fd, struct msghdr *msg);
int loop_read(struct loop *l, struct loop_op *op, int fd, void *buf, unsigned len);
int loop_timeout(struct loop *l, struct loop_op *op, unsigned msec);
/* Ask the kernel to cancel op; its callback still runs (res -ECANCELED) before it is free. */
int loop_cancel(struct loop *l, struct loop_op *op);

/* Submit what is queued and dispatch completions, waiting for one first when wait. */
int loop_run_once(struct loop *l, int wait);

#endif
