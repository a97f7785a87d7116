/* bench_bpf.c — decode throughput of a real kvd with its BPF programs attached vs detached, alternating in one run. */
#include <stdio.h>
#include <bpf/bpf.h>
#include <string.h>
#include "bpf/kvd_load.h"
#include "tests/bench_util.h"
#include "tests/lib/proc.h"

/*
 * One daemon started with --bpf=off; this process attaches the programs
 * to it (as kvtop --attach does) for one measurement of each pair, so both
 * sides see the same process, model and cache. Pairs alternate their order
 * (off then on, on then off) so a drift of a shared machine falls on both,
 * and the median of the pairs' ratios is printed beside the ratio of the
 * medians: on a busy machine single runs swing by more than the effect.
 */

#define ROUNDS 8
#define N_OUT 24
#define N_PROMPT 8

/* Decode tokens per second of one streamed request: tokens after the first over the time they took. */
static double decode_rate(const char *sock)
{
	struct kvc_conn *c;
	uint32_t sid, in, out;
	double rate = -1;
	if (kvc_connect(&c, sock) || kvc_session_open(c, &sid) || kvc_arena_alloc(c, N_PROMPT * 4, &in) ||
	    kvc_arena_alloc(c, N_OUT * 4, &out))
		goto out;
	uint32_t *p = (uint32_t *)(kvc_arena(c, NULL) + in);
	for (uint32_t i = 0; i < N_PROMPT; i++)
		p[i] = 400 + 17 * i;
	struct kvd_sqe q;
	kvc_prep_generate(&q, sid, 0, 1, in, N_PROMPT, out, N_OUT);
	q.flags |= KVD_SQE_IGNORE_EOS | KVD_SQE_STREAM;
	kvc_set_spin(c, 0);
	if (kvc_submit(c, &q))
		goto out;
	double t_first = 0;
	for (;;) {
		struct kvd_cqe e;
		int rc = kvc_wait(c, &e, 60000);
		if (rc == -EINTR)
			continue;
		if (rc || e.res < 0)
			goto out;
		if (!t_first)
			t_first = now_s();
		if (!(e.flags & KVD_CQE_MORE)) {
			if (e.n_out == N_OUT)
				rate = (N_OUT - 1) / (now_s() - t_first);
			break;
		}
	}
out:
	kvc_close(c);
	return rate;
}

int main(void)
{
	char dir[128], err[512], why[256];
	struct kvd_proc p;
	struct kp_bpffs fs;
	if (geteuid() != 0 && !kvd_bpf_capable()) {
		printf("bench_bpf: skipped: needs CAP_BPF and CAP_PERFMON (run as root)\n");
		return 0;
	}
	/* Before any thread: it may unshare the mount namespace (the caller's thread only) for a bpf file system of its own. */
	if (kp_bpffs_open(&fs, why, sizeof(why))) {
		printf("bench_bpf: skipped: %s\n", why);
		return 0;
	}
	snprintf(dir, sizeof(dir), "%s/kvd-bench-%d", fs.base, (int)getpid());
	const char *args[] = { "--bpf=off", "--kv-blocks", "64", "--threads", "1", "--log-level", "info", NULL };
	int rc = kp_start(&p, args);
	if (rc) {
		fprintf(stderr, "bench_bpf: cannot start kvd: %s\n", strerror(-rc));
		kp_bpffs_close(&fs);
		return 1;
	}
	/* The kernel counts the programs' run time while this fd is open. */
	int stats_fd = bpf_enable_stats(BPF_STATS_RUN_TIME);
	unsigned long long bpf_ns = 0, bpf_runs = 0, tokens_on = 0;
	double off[ROUNDS], on[ROUNDS], ratio[ROUNDS];
	int n_off = 0, n_on = 0, rounds = bench_pick(ROUNDS, 2);
	decode_rate(p.sock);	/* warm: pages of the model in, threads up */
	for (int i = 0; i < 2 * rounds && rc == 0; i++) {
		int attached = (i % 4 == 1) || (i % 4 == 2);	/* off on, on off, ... */
		struct kvd_bpf *b = NULL;
		if (attached && (rc = kvd_bpf_load(&b, p.pid, dir, (gid_t)-1, err, sizeof(err)))) {
			fprintf(stderr, "bench_bpf: %s\n", err);
			break;
		}
		double r = decode_rate(p.sock);
		if (b) {
			unsigned long long ns, runs;
			if (kvd_bpf_run_stats(b, &ns, &runs) == 0) {
				bpf_ns += ns;
				bpf_runs += runs;
				tokens_on += N_OUT;
			}
		}
		kvd_bpf_unload(b);
		if (r <= 0) {
			fprintf(stderr, "bench_bpf: generation failed\n");
			rc = -EIO;
			break;
		}
		if (attached)
			on[n_on++] = r;
		else
			off[n_off++] = r;
		if (i % 2)
			ratio[i / 2] = on[n_on - 1] / off[n_off - 1];
	}
	kp_cleanup(&p);
	kp_bpffs_close(&fs);
	if (rc)
		return 1;
	double mo = median(off, n_off), ma = median(on, n_on), mr = median(ratio, rounds);
	printf("decode throughput, one request of %d tokens, 1 compute thread, %d pairs of runs%s\n", N_OUT,
	       rounds, bench_mark());
	printf("%-22s %12s %12s %12s\n", "", "median tok/s", "min", "max");
	printf("%-22s %12.2f %12.2f %12.2f\n", "bpf detached", mo, off[0], off[n_off - 1]);
	printf("%-22s %12.2f %12.2f %12.2f\n", "bpf attached", ma, on[0], on[n_on - 1]);
	printf("attached / detached    %.4f  (%+.2f %%) ratio of medians\n", ma / mo, 100 * (ma / mo - 1));
	printf("                       %.4f  (%+.2f %%) median of the pairs' ratios; target: no more than 2 %% lower\n",
	       mr, 100 * (mr - 1));
	if (stats_fd >= 0 && tokens_on)
		printf("in the programs: %.2f runs and %.2f us per token, %.0f ns per run (uprobe traps not included)\n",
		       (double)bpf_runs / tokens_on, bpf_ns / 1e3 / tokens_on, bpf_runs ? (double)bpf_ns / bpf_runs : 0);
	if (stats_fd >= 0)
		close(stats_fd);
	return 0;
}
