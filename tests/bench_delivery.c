/*
 * bench_delivery.c — how long a completion takes to reach a client (a
 * benchmark, not a test): from the producer publishing a CQE to the
 * consumer holding it, through kvd's shared-memory CQ to a polling reader,
 * to a reader sleeping on the call eventfd (the NEED_WAKEUP protocol), and
 * the same 32-byte payload through a SOCK_SEQPACKET socketpair, in one run.
 * Producer and consumer are two threads, as the daemon and a client would be.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "shm/kvring.h"
#include "tests/bench_util.h"
#include "uapi/kvd.h"

#define N 4000
#define GAP_US 150	/* between completions: an engine step's order of magnitude */
#define CQ_ENTRIES 256

enum mode { POLLING, SLEEPING, SOCKET, N_MODES };
static const char *const names[N_MODES] = { "shared CQ, polling client", "shared CQ, sleeping client (eventfd)", "SOCK_SEQPACKET socketpair" };

struct chan {
	enum mode mode;
	struct kvd_ring_hdr *cq;
	struct kvd_cqe *cqes;
	int efd;
	int sv[2];
	double lat_us[N];
};

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void pause_until(uint64_t t)
{
	while (now_ns() < t)
		;
}

static void *producer(void *arg)
{
	struct chan *ch = arg;
	uint32_t tail = 0;
	uint64_t next = now_ns() + 1000000;
	for (int i = 0; i < N; i++) {
		pause_until(next);
		next += GAP_US * 1000ull;
		struct kvd_cqe cqe = { .user_data = now_ns(), .res = i };
		if (ch->mode == SOCKET) {
			if (send(ch->sv[0], &cqe, sizeof(cqe), 0) != sizeof(cqe))
				perror("send");
			continue;
		}
		while (kvring_space(ch->cq, tail) == 0)
			;
		ch->cqes[tail & (CQ_ENTRIES - 1)] = cqe;
		kvring_publish(ch->cq, ++tail);
		if (ch->mode == SLEEPING && kvring_needs_wakeup(ch->cq)) {
			uint64_t one = 1;
			if (write(ch->efd, &one, sizeof(one)) < 0)
				perror("eventfd write");
		}
	}
	return NULL;
}

static void consume(struct chan *ch)
{
	uint32_t head = 0;
	for (int i = 0; i < N; i++) {
		struct kvd_cqe cqe;
		if (ch->mode == SOCKET) {
			if (recv(ch->sv[1], &cqe, sizeof(cqe), 0) != sizeof(cqe))
				perror("recv");
		} else {
			while (kvring_ready(ch->cq, head) == 0) {
				if (ch->mode == POLLING)
					continue;
				/* Sleep only after saying so, and after one more look. */
				kvring_set_need_wakeup(ch->cq);
				if (kvring_ready(ch->cq, head) == 0) {
					struct pollfd p = { ch->efd, POLLIN, 0 };
					poll(&p, 1, -1);
					uint64_t v;
					if (read(ch->efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
						perror("eventfd read");
				}
				kvring_clear_need_wakeup(ch->cq);
			}
			cqe = ch->cqes[head & (CQ_ENTRIES - 1)];
			kvring_consume(ch->cq, ++head);
		}
		ch->lat_us[i] = (double)(now_ns() - cqe.user_data) / 1000.0;
	}
}

int main(void)
{
	static struct chan ch[N_MODES];
	struct {
		struct kvd_ring_hdr hdr;
		struct kvd_cqe e[CQ_ENTRIES];
	} *ring = aligned_alloc(64, sizeof(*ring) * N_MODES);
	if (!ring)
		return 1;
	double p50[N_MODES], p99[N_MODES];
	for (int m = 0; m < N_MODES; m++) {
		ch[m].mode = (enum mode)m;
		ch[m].cq = &ring[m].hdr;
		ch[m].cqes = ring[m].e;
		kvring_init(ch[m].cq, CQ_ENTRIES);
		ch[m].efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		if (ch[m].efd < 0 || socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ch[m].sv))
			return 1;
		pthread_t th;
		pthread_create(&th, NULL, producer, &ch[m]);
		consume(&ch[m]);
		pthread_join(th, NULL);
		/* The first 100 warm caches and page tables. */
		qsort(ch[m].lat_us + 100, N - 100, sizeof(double), cmp_double);
		p50[m] = ch[m].lat_us[100 + (N - 100) / 2];
		p99[m] = ch[m].lat_us[100 + (N - 100) * 99 / 100];
	}
	/* A few seconds in all: quick mode runs it whole. */
	printf("completion delivery, %d completions %d us apart (after 100 warm-up)%s\n", N, GAP_US,
	       bench_quick() ? " [QUICK: run in full]" : "");
	printf("| path                                   | p50 (us) | p99 (us) | p99 socket / p99 path |\n");
	printf("|----------------------------------------|----------|----------|-----------------------|\n");
	for (int m = 0; m < N_MODES; m++)
		printf("| %-38s | %8.2f | %8.2f | %21.1f |\n", names[m], p50[m], p99[m], p99[SOCKET] / p99[m]);
	printf("targets: polling p99 >= 50x lower than the socket; sleeping no worse than the socket\n");
	free(ring);
	return 0;
}
