/* test_bpf.c — kvd's BPF metrics against its own STATS: exact counters, bpftool dumps, kvtop output, pins removed, perf's SDT events. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <sys/stat.h>
#include <bpf/bpf.h>
#include "bpf/kvd_load.h"
#include "uapi/kvd_metrics.h"
#include "tests/lib/proc.h"

/*
 * Runs as root (CI does) and skips with the reason otherwise. Every daemon
 * here pins under a private directory (KVD_BPF_PIN_DIR), never the real
 * /sys/fs/bpf/kvd, so a kvd running on the machine is left alone; where
 * /sys/fs/bpf has no bpf file system, that directory is on one this test
 * mounts in a mount namespace of its own (kp_bpffs_open), which also checks
 * that the daemon, kvtop and bpftool take pins outside /sys/fs/bpf.
 */

#define KVTOP "build/kvtop"

static char why_skip[256];
static char pin_dir[128];
static struct kp_bpffs fs;
static struct kvd_proc P;

static int can_bpf(void)
{
	if (geteuid() != 0 && !kvd_bpf_capable()) {
		snprintf(why_skip, sizeof(why_skip), "needs CAP_BPF and CAP_PERFMON (run as root)");
		return 0;
	}
	return kp_bpffs_open(&fs, why_skip, sizeof(why_skip)) == 0;
}

static int dir_gone(const char *dir)
{
	struct stat st;
	return stat(dir, &st) && errno == ENOENT;
}

static int read_one(const char *dir, const char *map, void *key, void *val)
{
	char path[160];
	snprintf(path, sizeof(path), "%s/%s", dir, map);
	int fd = bpf_obj_get(path);
	if (fd < 0)
		return -errno;
	int rc = bpf_map_lookup_elem(fd, key, val) ? -errno : 0;
	close(fd);
	return rc;
}

static struct kvd_counters counters(const char *dir)
{
	struct kvd_counters c = { 0 };
	__u32 zero = 0;
	assert_int_equal(read_one(dir, "counters", &zero, &c), 0);
	return c;
}

static __u64 hist_count(const char *dir, __u32 uid, __u32 kind)
{
	struct kvd_hist_key k = { uid, kind };
	struct kvd_hist h = { 0 };
	int rc = read_one(dir, "hists", &k, &h);
	if (rc == -ENOENT)
		return 0;
	assert_int_equal(rc, 0);
	__u64 n = 0;
	for (int i = 0; i < KVD_HIST_SLOTS; i++)
		n += h.slots[i];
	assert_int_equal(n, h.count);
	return n;
}

static struct kvd_stats_rep stats(const char *sock)
{
	struct kvc_conn *c;
	struct kvd_stats_rep st = { 0 };
	assert_int_equal(kvc_connect(&c, sock), 0);
	assert_int_equal(kvc_stats(c, &st), 0);
	kvc_close(c);
	return st;
}

/* Run cmd; its stdout into buf (NUL-terminated); the exit status, or -1. */
static int run(const char *cmd, char *buf, size_t cap)
{
	FILE *f = popen(cmd, "r");
	if (!f)
		return -1;
	size_t n = fread(buf, 1, cap - 1, f);
	buf[n] = 0;
	int st = pclose(f);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ---- fixtures: one daemon with its programs loaded by itself (--bpf=on) ---- */

static int setup_daemon(void **state)
{
	(void)state;
	if (why_skip[0])
		return 0;
	snprintf(pin_dir, sizeof(pin_dir), "%s/kvd-test-%d", fs.base, (int)getpid());
	/* A small pool: three concurrent requests preempt one another and evict cached blocks. */
	const char *args[] = { "--bpf=on", "--kv-blocks", "7", "--threads", "2", "--log-level", "info", NULL };
	int rc = kp_start_ex(&P, args, kp_pin_dir_env, pin_dir);
	if (rc)
		print_error("cannot start kvd: %s\n", strerror(-rc));
	return rc ? -1 : 0;
}

static int teardown_daemon(void **state)
{
	(void)state;
	kp_cleanup(&P);
	return 0;
}

/* The daemon of a bpf_own_daemon test, static so that a failed test's teardown still stops it. */
static struct kvd_proc q;

static int teardown_own(void **state)
{
	(void)state;
	kp_cleanup(&q);
	return 0;
}

#define SKIP_UNLESS_BPF()                                           \
	do {                                                        \
		if (why_skip[0]) {                                  \
			print_message("skipped: %s\n", why_skip);   \
			skip();                                     \
		}                                                   \
	} while (0)

/* Forty ids well inside any vocabulary: two full KV blocks of 16 and a part. */
static void prompt(uint32_t *p, uint32_t n, uint32_t salt)
{
	for (uint32_t i = 0; i < n; i++)
		p[i] = 300 + (i * 37 + salt * 101) % 4000;
}

/* N tokens across M requests: the token counter moves by N, TTFT and requests by M, cache counters as STATS. */
static void test_exact_counters(void **state)
{
	(void)state;
	SKIP_UNLESS_BPF();
	uint32_t a[40], b[40], cc[40];
	prompt(a, 40, 1);
	prompt(b, 40, 2);
	prompt(cc, 40, 1);	/* the same as a: its two full blocks hit when a's are cached */
	const uint32_t *prompts[] = { a, b, cc };
	const uint32_t n_prompt[] = { 40, 40, 40 };
	const uint32_t max_out[] = { 9, 5, 3 };
	const __u64 M = 3, N = 9 + 5 + 3;
	const __u32 uid = (__u32)getuid();

	struct kvd_counters c0 = counters(pin_dir);
	struct kvd_stats_rep s0 = stats(P.sock);
	__u64 ttft0 = hist_count(pin_dir, KVD_UID_ALL, KVD_HIST_TTFT);
	__u64 uttft0 = hist_count(pin_dir, uid, KVD_HIST_TTFT);
	/* Twice: the second round finds the first round's prefixes cached (or evicted). */
	for (int round = 0; round < 2; round++)
		assert_int_equal(kp_generate(P.sock, 3, prompts, n_prompt, max_out), (int)N);
	struct kvd_counters c1 = counters(pin_dir);
	struct kvd_stats_rep s1 = stats(P.sock);

	assert_int_equal(c1.tokens - c0.tokens, 2 * N);
	assert_int_equal(s1.tokens_generated - s0.tokens_generated, 2 * N);
	assert_int_equal(c1.first_tokens - c0.first_tokens, 2 * M);
	assert_int_equal(hist_count(pin_dir, KVD_UID_ALL, KVD_HIST_TTFT) - ttft0, 2 * M);
	assert_int_equal(hist_count(pin_dir, uid, KVD_HIST_TTFT) - uttft0, 2 * M);
	assert_int_equal(c1.requests - c0.requests, 2 * M);
	assert_int_equal(s1.requests - s0.requests, 2 * M);
	/* Loaded before the daemon served anything: the totals themselves agree. */
	assert_int_equal(c1.tokens, s1.tokens_generated);
	assert_int_equal(c1.requests, s1.requests);
	assert_int_equal(c1.prefill_tokens, s1.tokens_prefilled);
	assert_int_equal(c1.prefix_hit_tokens, s1.prefix_hit_tokens);
	assert_int_equal(c1.prefix_miss_tokens, s1.prefix_miss_tokens);
	assert_int_equal(c1.evictions, s1.evictions);
	assert_int_equal(c1.preemptions, s1.preemptions);
	assert_int_equal(c1.steps, s1.steps);
	assert_true(c1.prefix_hit_tokens > 0);	/* c and round two reuse cached blocks */
	print_message("tokens %llu, requests %llu, prefix hit %llu / miss %llu, evictions %llu, preemptions %llu\n",
		      c1.tokens, c1.requests, c1.prefix_hit_tokens, c1.prefix_miss_tokens, c1.evictions,
		      c1.preemptions);

	/* Per uid: every token and request of this test is this uid's; nothing is left in flight. */
	struct kvd_uid_stats u = { 0 };
	assert_int_equal(read_one(pin_dir, "uids", (void *)&uid, &u), 0);
	assert_int_equal(u.tokens, c1.tokens);
	assert_int_equal(u.requests, c1.requests);
	assert_int_equal(u.inflight, 0);

	/* The pool gauge accounts for every block. */
	struct kvd_pool pl = { 0 };
	__u32 zero = 0;
	assert_int_equal(read_one(pin_dir, "pool", &zero, &pl), 0);
	assert_true(pl.updates > 0);
	assert_int_equal(pl.in_use + pl.cached + pl.free, s1.kv_blocks_total);
}

/* bpftool prints the maps with their field names (the BTF travels with them). */
static void test_bpftool_dump(void **state)
{
	(void)state;
	SKIP_UNLESS_BPF();
	if (system("command -v bpftool >/dev/null 2>&1 && command -v python3 >/dev/null 2>&1")) {
		print_message("skipped: bpftool or python3 missing\n");
		skip();
	}
	const uint32_t *prompts[1];
	uint32_t a[20];
	prompt(a, 20, 7);
	prompts[0] = a;
	assert_int_equal(kp_generate(P.sock, 1, prompts, (uint32_t[]){ 20 }, (uint32_t[]){ 4 }), 4);
	struct kvd_counters c = counters(pin_dir);
	char cmd[512], out[4096];
	/* Each dump must be JSON whose "formatted" entries name the fields of uapi/kvd_metrics.h. */
	snprintf(cmd, sizeof(cmd),
		 "bpftool -j map dump pinned %s/counters | python3 -c '"
		 "import json,sys; d=json.load(sys.stdin); v=d[0][\"formatted\"][\"value\"]; "
		 "print(v[\"tokens\"], v[\"requests\"], v[\"prefix_miss_tokens\"])'",
		 pin_dir);
	assert_int_equal(run(cmd, out, sizeof(out)), 0);
	unsigned long long tok, req, miss;
	assert_int_equal(sscanf(out, "%llu %llu %llu", &tok, &req, &miss), 3);
	assert_int_equal(tok, c.tokens);
	assert_int_equal(req, c.requests);
	assert_int_equal(miss, c.prefix_miss_tokens);

	snprintf(cmd, sizeof(cmd),
		 "bpftool -j map dump pinned %s/hists | python3 -c '"
		 "import json,sys; d=json.load(sys.stdin)\n"
		 "for e in d:\n"
		 "  k=e[\"formatted\"][\"key\"]; v=e[\"formatted\"][\"value\"]\n"
		 "  assert len(v[\"slots\"])==%d and sum(v[\"slots\"])==v[\"count\"]\n"
		 "  print(k[\"uid\"], k[\"kind\"], v[\"count\"])'",
		 pin_dir, KVD_HIST_SLOTS);
	assert_int_equal(run(cmd, out, sizeof(out)), 0);
	int found = 0;
	for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
		unsigned long long uid, kind, count;
		assert_int_equal(sscanf(line, "%llu %llu %llu", &uid, &kind, &count), 3);
		if (uid == KVD_UID_ALL && kind == KVD_HIST_TTFT) {
			assert_int_equal(count, c.first_tokens);
			found = 1;
		}
	}
	assert_true(found);

	snprintf(cmd, sizeof(cmd),
		 "bpftool -j map dump pinned %s/pool | python3 -c '"
		 "import json,sys; v=json.load(sys.stdin)[0][\"formatted\"][\"value\"]; "
		 "print(v[\"in_use\"]+v[\"cached\"]+v[\"free\"])'",
		 pin_dir);
	assert_int_equal(run(cmd, out, sizeof(out)), 0);
	assert_int_equal(strtoull(out, NULL, 10), stats(P.sock).kv_blocks_total);
}

/* One sample line of the Prometheus text: name{labels} value. */
static int prom_value(const char *text, const char *series, double *v)
{
	size_t n = strlen(series);
	for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
		if (!strncmp(l, series, n) && l[n] == ' ')
			return sscanf(l + n + 1, "%lf", v) == 1 ? 0 : -EINVAL;
	return -ENOENT;
}

/* Every line is a comment (HELP/TYPE) or "name[{labels}] number"; TYPE comes before a family's samples. */
static void check_prom_syntax(char *text)
{
	char family[128] = "";
	for (char *l = strtok(text, "\n"); l; l = strtok(NULL, "\n")) {
		if (!strncmp(l, "# HELP ", 7))
			continue;
		if (!strncmp(l, "# TYPE ", 7)) {
			char type[32];
			assert_int_equal(sscanf(l + 7, "%127s %31s", family, type), 2);
			assert_true(!strcmp(type, "counter") || !strcmp(type, "gauge") || !strcmp(type, "histogram"));
			continue;
		}
		assert_true(l[0] != '#');
		assert_true(!strncmp(l, "kvd_", 4));
		assert_true(family[0] && !strncmp(l, family, strlen(family)));
		const char *sp = strrchr(l, ' ');
		assert_non_null(sp);
		char *end;
		strtod(sp + 1, &end);
		assert_true(*end == 0 && end != sp + 1);
		const char *br = strchr(l, '{');
		if (br && br < sp)
			assert_true(sp[-1] == '}');
	}
}

static void test_kvtop_agrees(void **state)
{
	(void)state;
	SKIP_UNLESS_BPF();
	if (access(KVTOP, X_OK) || system("command -v python3 >/dev/null 2>&1")) {
		print_message("skipped: %s or python3 missing\n", KVTOP);
		skip();
	}
	uint32_t a[24];
	prompt(a, 24, 3);
	const uint32_t *prompts[] = { a };
	assert_int_equal(kp_generate(P.sock, 1, prompts, (uint32_t[]){ 24 }, (uint32_t[]){ 6 }), 6);
	struct kvd_stats_rep st = stats(P.sock);	/* idle now: nothing moves until the next request */
	char cmd[1024];
	static char out[1 << 18];
	snprintf(cmd, sizeof(cmd),
		 "%s --socket %s --pin-dir %s --once --json | python3 -c '"
		 "import json,sys; d=json.load(sys.stdin); c=d[\"counters\"]; s=d[\"stats\"]\n"
		 "assert d[\"bpf\"] is True and d[\"uids\"]\n"
		 "assert d[\"hists\"][\"ttft\"][\"count\"]==c[\"first_tokens\"]\n"
		 "print(c[\"tokens\"], c[\"requests\"], c[\"prefix_hit_tokens\"], c[\"evictions\"], s[\"tokens_generated\"], s[\"requests\"], d[\"pool\"][\"total\"])'",
		 KVTOP, P.sock, pin_dir);
	assert_int_equal(run(cmd, out, sizeof(out)), 0);
	unsigned long long tok, req, hit, ev, stok, sreq, total;
	assert_int_equal(sscanf(out, "%llu %llu %llu %llu %llu %llu %llu", &tok, &req, &hit, &ev, &stok, &sreq, &total), 7);
	assert_int_equal(tok, st.tokens_generated);
	assert_int_equal(stok, st.tokens_generated);
	assert_int_equal(req, st.requests);
	assert_int_equal(sreq, st.requests);
	assert_int_equal(hit, st.prefix_hit_tokens);
	assert_int_equal(ev, st.evictions);
	assert_int_equal(total, st.kv_blocks_total);

	snprintf(cmd, sizeof(cmd), "%s --socket %s --pin-dir %s --prometheus", KVTOP, P.sock, pin_dir);
	assert_int_equal(run(cmd, out, sizeof(out)), 0);
	double v, inf, cnt;
	assert_int_equal(prom_value(out, "kvd_tokens_total", &v), 0);
	assert_int_equal((__u64)v, st.tokens_generated);
	assert_int_equal(prom_value(out, "kvd_daemon_tokens_generated_total", &v), 0);
	assert_int_equal((__u64)v, st.tokens_generated);
	assert_int_equal(prom_value(out, "kvd_requests_total", &v), 0);
	assert_int_equal((__u64)v, st.requests);
	assert_int_equal(prom_value(out, "kvd_prefix_hit_tokens_total", &v), 0);
	assert_int_equal((__u64)v, st.prefix_hit_tokens);
	assert_int_equal(prom_value(out, "kvd_ttft_seconds_bucket{le=\"+Inf\"}", &inf), 0);
	assert_int_equal(prom_value(out, "kvd_ttft_seconds_count", &cnt), 0);
	assert_true(inf == cnt && cnt > 0);
	char series[64];
	snprintf(series, sizeof(series), "kvd_uid_tokens_total{uid=\"%u\"}", (unsigned)getuid());
	assert_int_equal(prom_value(out, series, &v), 0);
	assert_int_equal((__u64)v, st.tokens_generated);
	/* Buckets never decrease. */
	double prev = 0;
	for (int i = 0; i < KVD_HIST_SLOTS - 1; i++) {
		snprintf(series, sizeof(series), "kvd_ttft_seconds_bucket{le=\"%g\"}", ldexp(1e-6, i));
		assert_int_equal(prom_value(out, series, &v), 0);
		assert_true(v >= prev);
		prev = v;
	}
	assert_true(inf >= prev);
	check_prom_syntax(out);
}

/* SIGTERM: the daemon unpins on its way out; SIGKILL leaves pins that the next loader clears. */
static void test_unpinned_on_exit(void **state)
{
	(void)state;
	SKIP_UNLESS_BPF();
	char dir[128];
	snprintf(dir, sizeof(dir), "%s/kvd-test-exit-%d", fs.base, (int)getpid());
	const char *on[] = { "--bpf=on", "--kv-blocks", "16", "--threads", "1", "--log-level", "info", NULL };
	assert_int_equal(kp_start_ex(&q, on, kp_pin_dir_env, dir), 0);
	assert_false(dir_gone(dir));
	kp_kill(&q, SIGKILL);
	kp_cleanup(&q);	/* its socket and log; the pins stay */
	assert_false(dir_gone(dir));	/* stale: nobody unpinned */
	assert_int_equal(kp_start_ex(&q, on, kp_pin_dir_env, dir), 0);	/* clears them: the loader is dead */
	struct kvd_meta m;
	__u32 zero = 0;
	assert_int_equal(read_one(dir, "meta", &zero, &m), 0);
	assert_int_equal(m.daemon_pid, (__u32)q.pid);
	assert_int_equal(m.loader_pid, (__u32)q.pid);
	int st = kp_kill(&q, SIGTERM);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	assert_true(dir_gone(dir));
	kp_cleanup(&q);
}

/* kvtop --attach loads the programs into a daemon that did not, and takes them away on exit. */
static void test_kvtop_attach(void **state)
{
	(void)state;
	SKIP_UNLESS_BPF();
	if (access(KVTOP, X_OK))
		skip();
	char dir[128], pid[16];
	snprintf(dir, sizeof(dir), "%s/kvd-test-attach-%d", fs.base, (int)getpid());
	const char *off[] = { "--bpf=off", "--kv-blocks", "16", "--threads", "1", "--log-level", "info", NULL };
	assert_int_equal(kp_start_ex(&q, off, kp_pin_dir_env, dir), 0);
	assert_true(dir_gone(dir));
	snprintf(pid, sizeof(pid), "%d", (int)q.pid);
	pid_t top = fork();
	assert_true(top >= 0);
	if (top == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		int null = open("/dev/null", O_WRONLY);
		dup2(null, 1);
		execl(KVTOP, KVTOP, "--socket", q.sock, "--pin-dir", dir, "--attach", pid, "--interval", "0.2",
		      (char *)NULL);
		_exit(127);
	}
	char meta[160];
	snprintf(meta, sizeof(meta), "%s/meta", dir);
	for (int64_t end = kp_now_ms() + kw_ms(60000); access(meta, F_OK) && kp_now_ms() < end;)
		kp_sleep_ms(20);
	assert_int_equal(access(meta, F_OK), 0);
	kp_sleep_ms(kw_ms(200));	/* the meta pin is the last one: the links are in place */
	uint32_t a[20];
	prompt(a, 20, 5);
	const uint32_t *prompts[] = { a };
	assert_int_equal(kp_generate(q.sock, 1, prompts, (uint32_t[]){ 20 }, (uint32_t[]){ 7 }), 7);
	struct kvd_counters c = counters(dir);
	assert_int_equal(c.tokens, 7);
	assert_int_equal(c.first_tokens, 1);
	assert_int_equal(c.requests, 1);
	struct kvd_meta m;
	__u32 zero = 0;
	assert_int_equal(read_one(dir, "meta", &zero, &m), 0);
	assert_int_equal(m.daemon_pid, (__u32)q.pid);
	assert_int_equal(m.loader_pid, (__u32)top);
	kill(top, SIGTERM);
	int st;
	assert_int_equal(waitpid(top, &st, 0), top);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	assert_true(dir_gone(dir));
	/* Detached: the daemon goes on serving. */
	assert_int_equal(kp_generate(q.sock, 1, prompts, (uint32_t[]){ 20 }, (uint32_t[]){ 2 }), 2);
	kp_cleanup(&q);
}

/* perf sees the probes: sdt_kvd:* listed after buildid-cache --add, and perf record counts kvd:token. */
static void test_perf_sdt(void **state)
{
	(void)state;
	SKIP_UNLESS_BPF();
	if (system("command -v perf >/dev/null 2>&1")) {
		print_message("skipped: perf is missing (Debian package linux-perf)\n");
		skip();
	}
	char tmp[] = "/tmp/kvd-perf.XXXXXX", cmd[768];
	static char out[1 << 16];
	assert_non_null(mkdtemp(tmp));
	/* Hardware counters: virtual machines often have none, which perf reports as such. */
	assert_int_equal(run("perf stat -x, -e instructions true 2>&1", out, sizeof(out)), 0);
	if (strstr(out, "not supported") || strstr(out, "not counted"))
		print_message("note: no hardware counters here: perf stat -e instructions says %s", out);
	else
		assert_true(strtoull(out, NULL, 10) > 0);
	/* The daemon this pass runs ($KVD_BIN: the sanitizer pass has its own). */
	snprintf(cmd, sizeof(cmd), "perf --buildid-dir %s/cache buildid-cache --add %s 2>&1 && "
		 "perf --buildid-dir %s/cache list 2>/dev/null | grep -c 'sdt_kvd:'", tmp, kp_bin(), tmp);
	assert_int_equal(run(cmd, out, sizeof(out)), 0);
	assert_true(atoi(out) >= 17);
	/* perf probe makes a uprobe event of the SDT note; it is global, so it is deleted right after. */
	snprintf(cmd, sizeof(cmd), "perf --buildid-dir %s/cache probe -q -x %s sdt_kvd:token 2>&1", tmp,
		 kp_bin());
	if (run(cmd, out, sizeof(out)) != 0) {
		print_message("skipped: perf probe cannot add sdt_kvd:token here: %s\n", out);
		skip();
	}
	const char *off[] = { "--bpf=off", "--kv-blocks", "16", "--threads", "1", "--log-level", "info", NULL };
	int rc = kp_start(&q, off);
	if (!rc) {
		char target[16], data[64];
		snprintf(target, sizeof(target), "%d", (int)q.pid);
		snprintf(data, sizeof(data), "%s/perf.data", tmp);
		pid_t rec = fork();
		if (rec == 0) {
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			int null = open("/dev/null", O_WRONLY);
			dup2(null, 1);
			dup2(null, 2);
			execlp("perf", "perf", "record", "-q", "-e", "sdt_kvd:token", "-p", target, "-o", data,
			       (char *)NULL);
			_exit(127);
		}
		kp_sleep_ms(kw_ms(1500));	/* perf attaches */
		uint32_t a[8];
		prompt(a, 8, 9);
		const uint32_t *prompts[] = { a };
		rc = kp_generate(q.sock, 1, prompts, (uint32_t[]){ 8 }, (uint32_t[]){ 11 });
		if (rec > 0) {
			kill(rec, SIGINT);	/* perf record writes its file and exits */
			waitpid(rec, NULL, 0);
		}
		kp_cleanup(&q);
	}
	run("perf probe -q -d sdt_kvd:token 2>&1", out, sizeof(out));
	assert_int_equal(rc, 11);
	snprintf(cmd, sizeof(cmd), "perf script -i %s/perf.data 2>/dev/null | grep -c 'sdt_kvd:token'", tmp);
	run(cmd, out, sizeof(out));
	assert_int_equal(atoi(out), 11);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", tmp);
	assert_int_equal(system(cmd), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_exact_counters),
		cmocka_unit_test(test_bpftool_dump),
		cmocka_unit_test(test_kvtop_agrees),
	};
	const struct CMUnitTest alone[] = {
		cmocka_unit_test_teardown(test_unpinned_on_exit, teardown_own),
		cmocka_unit_test_teardown(test_kvtop_attach, teardown_own),
		cmocka_unit_test_teardown(test_perf_sdt, teardown_own),
	};
	can_bpf();	/* first: it may unshare the mount namespace, which moves only the calling thread */
	int failed = cmocka_run_group_tests_name("bpf_shared_daemon", tests, setup_daemon, teardown_daemon);
	failed += cmocka_run_group_tests_name("bpf_own_daemon", alone, NULL, NULL);
	kp_bpffs_close(&fs);
	return failed ? 1 : 0;
}
