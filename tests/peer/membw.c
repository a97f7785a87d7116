/* membw.c — the machine's DRAM read bandwidth: threads streaming over a buffer far larger than the LLC (a benchmark probe). */
/*
 * Decode of a small model reads every weight once per token, so its ceiling
 * is this bandwidth divided by the model's tensor bytes (the roofline
 * tests/bench_peer.sh prints). Each thread first-touches its own slice (so
 * its pages sit on its node), then every pass all threads read their slices
 * between two barriers; the pass's bandwidth is the whole buffer over the
 * time between the barriers, and the median of the passes is reported.
 *
 *   membw [MiB (default 1024)] [threads (default 2)] [passes (default 15)]
 *
 * The last line is "read_GBps X" for scripts.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define MAX_THREADS 64
#define MAX_PASSES 101

/* 16 bytes, an SSE2 load on x86-64: two cores of them outrun DRAM many times over. */
typedef uint64_t u64x2 __attribute__((vector_size(16)));

struct probe {
	u64x2 *buf;		/* (n,) the whole buffer */
	size_t n;		/* u64x2 elements */
	int threads, passes;
	pthread_barrier_t bar;
	double t[MAX_PASSES + 1];	/* barrier times, written by thread 0 */
};

struct worker {
	struct probe *p;
	int idx;
	pthread_t tid;
	u64x2 sink;		/* the sum, kept so the loads are not dropped */
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Sum of v (n,) with four independent chains (a cache line a step), so loads set the pace. */
static u64x2 read_slice(const u64x2 *v, size_t n)
{
	u64x2 a = { 0 }, b = { 0 }, c = { 0 }, d = { 0 };
	size_t i = 0;
	for (; i + 4 <= n; i += 4) {
		a += v[i];
		b += v[i + 1];
		c += v[i + 2];
		d += v[i + 3];
	}
	for (; i < n; i++)
		a += v[i];
	return a + b + c + d;
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct probe *p = w->p;
	size_t per = p->n / (size_t)p->threads, lo = per * (size_t)w->idx;
	size_t len = w->idx == p->threads - 1 ? p->n - lo : per;
	u64x2 *v = p->buf + lo;

	for (size_t i = 0; i < len; i++)
		v[i] = (u64x2){ i, i + 1 };
	for (int pass = 0; pass <= p->passes; pass++) {
		pthread_barrier_wait(&p->bar);
		if (w->idx == 0)
			p->t[pass] = now_s();
		if (pass < p->passes)
			w->sink += read_slice(v, len);
	}
	return NULL;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Runs the passes; their GB/s into gbps (passes,). Returns 0 or -errno. */
static int probe_run(struct probe *p, double *gbps)
{
	struct worker w[MAX_THREADS];
	int started = 0, rc = 0;

	if ((rc = -pthread_barrier_init(&p->bar, NULL, (unsigned)p->threads)))
		return rc;
	for (int i = 0; i < p->threads; i++) {
		w[i] = (struct worker){ .p = p, .idx = i };
		if (i > 0 && (rc = -pthread_create(&w[i].tid, NULL, worker_main, &w[i])))
			break;
		started = i + 1;
	}
	if (!rc)
		worker_main(&w[0]);
	for (int i = 1; i < started; i++)
		pthread_join(w[i].tid, NULL);
	pthread_barrier_destroy(&p->bar);
	if (rc)
		return rc;
	u64x2 all = { 0 };
	for (int i = 0; i < p->threads; i++)
		all += w[i].sink;
	double bytes = (double)p->n * sizeof(u64x2);
	for (int pass = 0; pass < p->passes; pass++)
		gbps[pass] = bytes / (p->t[pass + 1] - p->t[pass]) * 1e-9;
	/* Printed so no compiler can prove the sums unused. */
	printf("checksum %llx\n", (unsigned long long)(all[0] ^ all[1]));
	return 0;
}

int main(int argc, char **argv)
{
	long mib = argc > 1 ? atol(argv[1]) : 1024;
	struct probe p = { .threads = argc > 2 ? atoi(argv[2]) : 2,
			   .passes = argc > 3 ? atoi(argv[3]) : 15 };
	double gbps[MAX_PASSES];

	if (mib < 1 || p.threads < 1 || p.threads > MAX_THREADS || p.passes < 1 ||
	    p.passes > MAX_PASSES) {
		fprintf(stderr, "usage: membw [MiB >= 1] [threads 1..%d] [passes 1..%d]\n",
			MAX_THREADS, MAX_PASSES);
		return 2;
	}
	size_t bytes = (size_t)mib << 20;
	p.n = bytes / sizeof(u64x2);
	p.buf = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p.buf == MAP_FAILED) {
		fprintf(stderr, "membw: cannot map %ld MiB: %s\n", mib, strerror(errno));
		return 1;
	}
	/* Huge pages where the kernel allows, so TLB misses do not count as DRAM time. */
	madvise(p.buf, bytes, MADV_HUGEPAGE);
	int rc = probe_run(&p, gbps);
	munmap(p.buf, bytes);
	if (rc) {
		fprintf(stderr, "membw: %s\n", strerror(-rc));
		return 1;
	}
	qsort(gbps, (size_t)p.passes, sizeof(double), cmp_double);
	double med = p.passes % 2 ? gbps[p.passes / 2] :
				    (gbps[p.passes / 2 - 1] + gbps[p.passes / 2]) / 2;
	printf("DRAM read, %ld MiB buffer, %d threads, %d passes: median %.2f GB/s (min %.2f, max %.2f)\n",
	       mib, p.threads, p.passes, med, gbps[0], gbps[p.passes - 1]);
	printf("read_GBps %.3f\n", med);
	return 0;
}
