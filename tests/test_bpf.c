/* test_bpf.c — kvd's BPF metrics against its own STATS: exact counters, bpftool dumps, kvtop output, pins per daemon, perf's SDT events. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <grp.h>
#include <math.h>
#include <pwd.h>
#include <sys/stat.h>
#include <bpf/bpf.h>
#include "bpf/kvd_load.h"
#include "bpf/kvd_pin.h"
#include "uapi/kvd_metrics.h"
#include "tests/lib/proc.h"

/*
 * Runs as root (CI does) and skips with the reason otherwise. Every daemon
 * here pins under a private directory (KVD_BPF_PIN_DIR), never the real
 * /sys/fs/bpf/kvd, so a kvd running on the machine is left alone; where
 * /sys/fs/bpf has no bpf file system, that directory is on one this test
 * mounts in a mount namespace of its own (kp_bpffs_open), which also checks
 * that the daemon, kvtop and bpftool take pins outside /sys/fs/bpf.
 *
 * The tests of the default layout, /sys/fs/bpf/kvd/<instance>/, need pins
 * where they would really go: this test mounts a bpf file system of its own
 * on /sys/fs/bpf, in its private mount namespace (private_sys_bpf), so the
 * host's pins are never seen or touched either.
 */

#define KVTOP "build/kvtop"

static char why_skip[256];
static char why_no_sys[256];	/* why /sys/fs/bpf is not ours: the instance tests skip */
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

/*
 * A bpf file system of this process's own on /sys/fs/bpf (mode 0755, so
 * that an unprivileged reader may pass through to a group's pins), in the
 * private mount namespace kp_bpffs_open() made, or one made here. Before
 * any thread, as kp_bpffs_open().
 */
static void private_sys_bpf(void)
{
	if (why_skip[0]) {
		snprintf(why_no_sys, sizeof(why_no_sys), "%s", why_skip);
		return;
	}
	if (!fs.own && (unshare(CLONE_NEWNS) || mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL))) {
		snprintf(why_no_sys, sizeof(why_no_sys), "no private mount namespace: %s", strerror(errno));
		return;
	}
	if (mount("bpf", "/sys/fs/bpf", "bpf", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755"))
		snprintf(why_no_sys, sizeof(why_no_sys), "cannot mount a bpf file system on /sys/fs/bpf: %s",
			 strerror(errno));
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

/* ---- one pin directory per daemon: /sys/fs/bpf/kvd/<instance>/ ---- */

#define SKIP_UNLESS_SYS_BPF()                                       \
	do {                                                        \
		SKIP_UNLESS_BPF();                                  \
		if (why_no_sys[0]) {                                \
			print_message("skipped: %s\n", why_no_sys); \
			skip();                                     \
		}                                                   \
	} while (0)

/* The names kvd and kvtop both derive: stable, readable, one per socket path, $KVD_BPF_PIN_DIR first. */
static void test_pin_names(void **state)
{
	(void)state;
	char a[256], b[256], dir[] = "/tmp/kvd-pin.XXXXXX", p[160], q[160];
	assert_non_null(mkdtemp(dir));
	assert_true(kvd_pin_dir(a, sizeof(a), NULL, KVD_PIN_SYSTEM_SOCKET) > 0);
	assert_string_equal(a, KVD_PIN_DIR "/kvd");
	/* One socket however it is spelt: through "..", relatively, through a symlink. */
	snprintf(p, sizeof(p), "%s/my daemon!.sock", dir);
	assert_true(kvd_pin_dir(a, sizeof(a), NULL, p) > 0);
	snprintf(q, sizeof(q), "%s/../%s/my daemon!.sock", dir, strrchr(dir, '/') + 1);
	assert_true(kvd_pin_dir(b, sizeof(b), NULL, q) > 0);
	assert_string_equal(a, b);
	snprintf(q, sizeof(q), "%s/link", dir);
	assert_int_equal(symlink(dir, q), 0);
	snprintf(q, sizeof(q), "%s/link/my daemon!.sock", dir);
	assert_true(kvd_pin_dir(b, sizeof(b), NULL, q) > 0);
	assert_string_equal(a, b);
	char cwd[512];
	assert_non_null(getcwd(cwd, sizeof(cwd)));
	assert_int_equal(chdir(dir), 0);
	int rel = kvd_pin_dir(b, sizeof(b), NULL, "my daemon!.sock");
	assert_int_equal(chdir(cwd), 0);
	assert_true(rel > 0);
	assert_string_equal(a, b);
	/* Readable, and a valid instance: the file name, sanitised, and a hash of the path. */
	const char *inst = a + strlen(KVD_PIN_DIR "/");
	assert_true(kvd_pin_instance_valid(inst));
	assert_int_equal(strncmp(inst, "my_daemon_-", 11), 0);
	assert_int_equal(strlen(inst), 11 + 8);
	/* Another directory, another instance. */
	assert_true(kvd_pin_dir(b, sizeof(b), NULL, "/tmp/kvd.sock") > 0);
	assert_true(kvd_pin_dir(a, sizeof(a), NULL, "/var/tmp/kvd.sock") > 0);
	assert_string_not_equal(a, b);
	/* Named instances; bad names refused. */
	assert_true(kvd_pin_dir(a, sizeof(a), "llama-2.big_1", "/tmp/x.sock") > 0);
	assert_string_equal(a, KVD_PIN_DIR "/llama-2.big_1");
	assert_int_equal(kvd_pin_dir(a, sizeof(a), "../etc", NULL), -EINVAL);
	assert_int_equal(kvd_pin_dir(a, sizeof(a), ".hidden", NULL), -EINVAL);
	assert_int_equal(kvd_pin_dir(a, sizeof(a), "a/b", NULL), -EINVAL);
	assert_int_equal(kvd_pin_dir(a, sizeof(a), "", NULL), -EINVAL);
	/* $KVD_BPF_PIN_DIR wins over both. */
	setenv("KVD_BPF_PIN_DIR", "/elsewhere/pins", 1);
	assert_true(kvd_pin_dir(a, sizeof(a), "named", "/tmp/x.sock") > 0);
	unsetenv("KVD_BPF_PIN_DIR");
	assert_string_equal(a, "/elsewhere/pins");
	/* kvd refuses a bad name before it loads anything. */
	char cmd[512], out[2048];
	snprintf(cmd, sizeof(cmd), "KVD_CONFIG=/dev/null %s --instance ../etc --print-config 2>&1", kp_bin());
	assert_true(run(cmd, out, sizeof(out)) > 0);
	if (!strstr(out, "instance: '../etc' is not a name"))
		fail_msg("kvd --instance ../etc said: %s", out);
	snprintf(cmd, sizeof(cmd), "KVD_CONFIG=/dev/null %s --instance big.one --print-config 2>&1", kp_bin());
	assert_int_equal(run(cmd, out, sizeof(out)), 0);
	assert_non_null(strstr(out, "instance = big.one"));
	snprintf(q, sizeof(q), "%s/link", dir);
	unlink(q);
	rmdir(dir);
}

/* The group a test daemon gives its socket and pins: nobody's primary group, which root is not in. */
static int nobody_ids(uid_t *uid, gid_t *gid, char *name, size_t len)
{
	const struct passwd *pw = getpwnam("nobody");
	const struct group *g = pw ? getgrgid(pw->pw_gid) : NULL;
	if (!g || pw->pw_gid == 0)
		return -ENOENT;
	*uid = pw->pw_uid;
	*gid = pw->pw_gid;
	snprintf(name, len, "%s", g->gr_name);
	return 0;
}

/* kvtop --once --json on sock (the pins found from it alone); "pin_dir daemon_pid requests" in out. */
static int kvtop_json(const char *prefix, const char *sock, char *out, size_t cap)
{
	char cmd[768];
	snprintf(cmd, sizeof(cmd),
		 "%s %s --socket %s --once --json 2>&1 | python3 -c '"
		 "import json,sys; d=json.load(sys.stdin)\n"
		 "print(d[\"pin_dir\"], d[\"daemon_pid\"] if d[\"bpf\"] else -1,"
		 " d[\"counters\"][\"requests\"] if d[\"bpf\"] else d[\"bpf_error\"])'",
		 prefix, KVTOP, sock);
	return run(cmd, out, cap);
}

static void check_pins(const char *dir, gid_t gid)
{
	struct stat st;
	char path[320];
	assert_int_equal(stat(dir, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0750);
	assert_int_equal(st.st_gid, gid);
	static const char *const maps[] = { "counters", "pool", "hists", "uids", "meta" };
	for (size_t i = 0; i < sizeof(maps) / sizeof(maps[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, maps[i]);
		assert_int_equal(stat(path, &st), 0);
		assert_int_equal(st.st_mode & 07777, 0640);
		assert_int_equal(st.st_gid, gid);
	}
}

/* kvtop as nobody: B's maps (its group) are read; A's (root's group) are refused as "permission denied". */
static void check_nobody(const struct kvd_proc *a, const struct kvd_proc *b, uid_t uid, gid_t gid)
{
	char prefix[96], out[1024];
	if (system("command -v setpriv >/dev/null 2>&1")) {
		print_message("skipped the unprivileged reads: setpriv is missing\n");
		return;
	}
	snprintf(prefix, sizeof(prefix), "setpriv --reuid=%u --regid=%u --clear-groups", (unsigned)uid,
		 (unsigned)gid);
	assert_int_equal(kvtop_json(prefix, b->sock, out, sizeof(out)), 0);
	if (strstr(out, "refuses bpf()")) {
		print_message("skipped the unprivileged reads: this kernel refuses bpf() to users: %s", out);
		return;
	}
	unsigned pid, req;
	assert_int_equal(sscanf(out, "%*s %u %u", &pid, &req), 2);
	assert_int_equal(pid, (unsigned)b->pid);
	assert_int_equal(req, 1);
	char cmd[512];
	int rc;
	snprintf(cmd, sizeof(cmd), "%s %s --socket %s --once 2>&1", prefix, KVTOP, a->sock);
	assert_int_equal(run(cmd, out, sizeof(out)), 1);
	if (!strstr(out, "permission denied reading the BPF maps") || !strstr(out, "group root's"))
		fail_msg("kvtop as nobody on root's pins said: %s", out);
	/* /sys/fs/bpf as systemd mounts it (0700): the message names the directory in the way. */
	assert_int_equal(chmod("/sys/fs/bpf", 0700), 0);
	snprintf(cmd, sizeof(cmd), "%s %s --socket %s --once 2>&1", prefix, KVTOP, b->sock);
	rc = run(cmd, out, sizeof(out));
	assert_int_equal(chmod("/sys/fs/bpf", 0755), 0);
	assert_int_equal(rc, 0);	/* the daemon still answers: its STATS are shown */
	if (!strstr(out, "permission denied reading the BPF maps") || !strstr(out, "/sys/fs/bpf (mode "))
		fail_msg("kvtop as nobody behind a closed /sys/fs/bpf said: %s", out);
}

/* The daemons of the instance tests: whatever an assertion left running is stopped by the teardown. */
/* A map pinned at dir/name that is not kvd's: 0, or -errno. */
static int pin_foreign(const char *dir, const char *name)
{
	char path[192];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	int fd = bpf_map_create(BPF_MAP_TYPE_ARRAY, "foreign", 4, 4, 1, NULL);
	if (fd < 0)
		return -errno;
	int rc = bpf_obj_pin(fd, path) ? -errno : 0;
	close(fd);
	return rc;
}

/* The log of d, NUL-terminated, into buf. */
static void read_log(const struct kvd_proc *d, char *buf, size_t cap)
{
	buf[0] = 0;
	FILE *f = fopen(d->log, "r");
	if (f) {
		buf[fread(buf, 1, cap - 1, f)] = 0;
		fclose(f);
	}
}

/* The foreign directory of test_foreign_dir, static so that a failed test's teardown removes it. */
static char foreign_dir[128];

static int teardown_foreign(void **state)
{
	(void)state;
	kp_cleanup(&q);
	if (foreign_dir[0]) {
		const char *names[] = { "foreign", "pool", "counters", "hists", "uids", "meta" };
		char path[192];
		for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
			snprintf(path, sizeof(path), "%s/%s", foreign_dir, names[i]);
			unlink(path);
		}
		rmdir(foreign_dir);
		foreign_dir[0] = 0;
	}
	return 0;
}

/*
 * $KVD_BPF_PIN_DIR naming a directory kvd did not make: its mode, owner and
 * other pins are its owner's, before, during and after; a pin of one of
 * kvd's names that is no kvd map is in the way, not stale.
 */
static void test_foreign_dir(void **state)
{
	(void)state;
	SKIP_UNLESS_BPF();
	snprintf(foreign_dir, sizeof(foreign_dir), "%s/kvd-test-foreign-%d", fs.base, (int)getpid());
	assert_int_equal(mkdir(foreign_dir, 0700), 0);
	assert_int_equal(chmod(foreign_dir, 0700), 0);
	assert_int_equal(pin_foreign(foreign_dir, "foreign"), 0);
	struct stat before, st;
	assert_int_equal(stat(foreign_dir, &before), 0);
	uid_t nuid;
	gid_t gid;
	char group[64];
	const char *on[] = { "--bpf=on", "--kv-blocks", "16", "--threads", "1", "--socket-group", group, NULL };
	if (nobody_ids(&nuid, &gid, group, sizeof(group)) || gid == before.st_gid) {
		gid = (gid_t)-1;
		on[5] = NULL;	/* no other group here: the modes alone are checked */
	}
	assert_int_equal(kp_start_ex(&q, on, kp_pin_dir_env, foreign_dir), 0);
	struct kvd_meta m;
	__u32 zero = 0;
	assert_int_equal(read_one(foreign_dir, "meta", &zero, &m), 0);
	assert_int_equal(m.daemon_pid, (__u32)q.pid);
	assert_int_equal(stat(foreign_dir, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0700);
	assert_int_equal(st.st_uid, before.st_uid);
	assert_int_equal(st.st_gid, before.st_gid);
	/* kvd's own pins still go to the socket's group. */
	static const char *const maps[] = { "counters", "pool", "hists", "uids", "meta" };
	char path[192];
	for (size_t i = 0; i < sizeof(maps) / sizeof(maps[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", foreign_dir, maps[i]);
		assert_int_equal(stat(path, &st), 0);
		assert_int_equal(st.st_mode & 07777, 0640);
		if (gid != (gid_t)-1)
			assert_int_equal(st.st_gid, gid);
	}
	assert_int_equal(kp_stop(&q), 0);
	/* Unpinned, and the directory left as it was, the foreign pin in it. */
	snprintf(path, sizeof(path), "%s/meta", foreign_dir);
	assert_int_equal(access(path, F_OK), -1);
	assert_int_equal(stat(foreign_dir, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0700);
	assert_int_equal(st.st_uid, before.st_uid);
	assert_int_equal(st.st_gid, before.st_gid);
	snprintf(path, sizeof(path), "%s/foreign", foreign_dir);
	assert_int_equal(access(path, F_OK), 0);

	/* A "pool" that is not kvd's: refused by name, and left there. */
	assert_int_equal(pin_foreign(foreign_dir, "pool"), 0);
	const char *only[] = { "--bpf=on", "--kv-blocks", "16", "--threads", "1", NULL };
	assert_int_equal(kp_start_ex(&q, only, kp_pin_dir_env, foreign_dir), -ECHILD);
	char log[8192];
	read_log(&q, log, sizeof(log));
	snprintf(path, sizeof(path), "%s/pool is in the way and is not a kvd map", foreign_dir);
	if (!strstr(log, path))
		fail_msg("kvd did not say '%s':\n%s", path, log);
	kp_cleanup(&q);
	snprintf(path, sizeof(path), "%s/pool", foreign_dir);
	assert_int_equal(access(path, F_OK), 0);
	snprintf(path, sizeof(path), "%s/foreign", foreign_dir);
	assert_int_equal(access(path, F_OK), 0);
}

static struct kvd_proc inst_a, inst_b;

static int teardown_pair(void **state)
{
	(void)state;
	if (!why_no_sys[0])
		chmod("/sys/fs/bpf", 0755);	/* ours (private_sys_bpf), never the host's */
	kp_cleanup(&inst_a);
	kp_cleanup(&inst_b);
	return 0;
}

/* Two daemons on two sockets: two pin directories, and kvtop --socket B shows B's numbers only. */
static void test_two_daemons(void **state)
{
	(void)state;
	SKIP_UNLESS_SYS_BPF();
	if (access(KVTOP, X_OK) || system("command -v python3 >/dev/null 2>&1")) {
		print_message("skipped: %s or python3 missing\n", KVTOP);
		skip();
	}
	uid_t nuid = 0;
	gid_t ngid = 0;
	char group[64];
	if (nobody_ids(&nuid, &ngid, group, sizeof(group))) {
		print_message("skipped: no user nobody with a group of its own\n");
		skip();
	}
	const char *on_a[] = { "--bpf=on", "--kv-blocks", "16", "--threads", "1", NULL };
	const char *on_b[] = { "--bpf=on", "--kv-blocks", "16", "--threads", "1", "--socket-group", group, NULL };
	struct kvd_proc *a = &inst_a, *b = &inst_b;
	char da[256], db[256], out[1024];
	/* kvd.service's umask: the modes must not depend on it. */
	mode_t mask = umask(077);
	int rc = kp_start(a, on_a);
	if (!rc)
		rc = kp_start(b, on_b);
	umask(mask);
	assert_int_equal(rc, 0);
	assert_true(kvd_pin_dir(da, sizeof(da), NULL, a->sock) > 0);
	assert_true(kvd_pin_dir(db, sizeof(db), NULL, b->sock) > 0);
	assert_string_not_equal(da, db);
	assert_false(dir_gone(da));
	assert_false(dir_gone(db));
	check_pins(da, getegid());
	check_pins(db, ngid);
	struct stat st;
	assert_int_equal(stat(KVD_PIN_DIR, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0755);	/* made by the first daemon: all may pass */

	uint32_t p[12];
	prompt(p, 12, 11);
	const uint32_t *prompts[] = { p };
	assert_int_equal(kp_generate(b->sock, 1, prompts, (uint32_t[]){ 12 }, (uint32_t[]){ 3 }), 3);
	/* The request to B is counted in B's maps, and A's stay at zero. */
	unsigned pid, req;
	char dir[256];
	assert_int_equal(kvtop_json("", b->sock, out, sizeof(out)), 0);
	assert_int_equal(sscanf(out, "%255s %u %u", dir, &pid, &req), 3);
	assert_string_equal(dir, db);
	assert_int_equal(pid, (unsigned)b->pid);
	assert_int_equal(req, 1);
	assert_int_equal(kvtop_json("", a->sock, out, sizeof(out)), 0);
	assert_int_equal(sscanf(out, "%255s %u %u", dir, &pid, &req), 3);
	assert_string_equal(dir, da);
	assert_int_equal(pid, (unsigned)a->pid);
	assert_int_equal(req, 0);
	check_nobody(a, b, nuid, ngid);

	assert_int_equal(kp_stop(a), 0);
	assert_int_equal(kp_stop(b), 0);
	assert_true(dir_gone(da));
	assert_true(dir_gone(db));
}

/* A second daemon of the same --instance leaves the first's pins alone: a warning, or a refusal with --bpf=on. */
static void test_same_instance(void **state)
{
	(void)state;
	SKIP_UNLESS_SYS_BPF();
	char name[32], dir[256], arg[48];
	snprintf(name, sizeof(name), "test-%d", (int)getpid());
	snprintf(arg, sizeof(arg), "--instance=%s", name);
	const char *on[] = { "--bpf=on", arg, "--kv-blocks", "16", "--threads", "1", NULL };
	const char *aut[] = { "--bpf=auto", arg, "--kv-blocks", "16", "--threads", "1", NULL };
	struct kvd_proc *a = &inst_a, *b = &inst_b;
	assert_int_equal(kp_start(a, on), 0);
	assert_true(kvd_pin_dir(dir, sizeof(dir), name, NULL) > 0);
	assert_string_equal(dir + strlen(KVD_PIN_DIR "/"), name);
	/* bpf=on: the second one does not start. */
	assert_int_equal(kp_start(b, on), -ECHILD);
	kp_cleanup(b);
	/* bpf=auto: it serves, without metrics, and says why. */
	assert_int_equal(kp_start(b, aut), 0);
	char log[8192] = "";
	FILE *f = fopen(b->log, "r");
	assert_non_null(f);
	log[fread(log, 1, sizeof(log) - 1, f)] = 0;
	fclose(f);
	if (!strstr(log, "which is running") || !strstr(log, "--instance"))
		fail_msg("the second daemon's log does not say why it has no metrics:\n%s", log);
	assert_int_equal(kp_stop(b), 0);
	/* Still the first one's, even after the second went away. */
	struct kvd_meta m;
	__u32 zero = 0;
	assert_int_equal(read_one(dir, "meta", &zero, &m), 0);
	assert_int_equal(m.daemon_pid, (__u32)a->pid);
	assert_int_equal(kp_stop(a), 0);
	assert_true(dir_gone(dir));
}

/* ESC bytes in what kvtop cmd writes to a terminal (a pty), or -1. */
static int pty_escapes(const char *cmd)
{
	char line[1024], out[64];
	snprintf(line, sizeof(line),
		 "python3 -c 'import os,subprocess,sys\n"
		 "m,s=os.openpty()\n"
		 "p=subprocess.Popen(sys.argv[1],shell=True,stdin=subprocess.DEVNULL,stdout=s,stderr=s)\n"
		 "os.close(s)\n"
		 "o=b\"\"\n"
		 "while True:\n"
		 "  try: d=os.read(m,65536)\n"
		 "  except OSError: break\n"
		 "  if not d: break\n"
		 "  o+=d\n"
		 "p.wait(); print(o.count(b\"\\x1b\") if p.returncode==0 else -1)' '%s'", cmd);
	return run(line, out, sizeof(out)) == 0 ? atoi(out) : -1;
}

/* kvtop --once: no escape sequences into a pipe or with $NO_COLOR, colors on a terminal. */
static void test_kvtop_plain(void **state)
{
	(void)state;
	SKIP_UNLESS_BPF();
	if (access(KVTOP, X_OK) || system("command -v python3 >/dev/null 2>&1")) {
		print_message("skipped: %s or python3 missing\n", KVTOP);
		skip();
	}
	char cmd[512];
	static char out[1 << 16];
	snprintf(cmd, sizeof(cmd), "%s --socket %s --pin-dir %s --once", KVTOP, P.sock, pin_dir);
	assert_int_equal(run(cmd, out, sizeof(out)), 0);
	assert_non_null(strstr(out, "time to first token"));	/* the whole dashboard, BPF part too */
	assert_null(strchr(out, '\033'));
	assert_true(pty_escapes(cmd) > 0);
	snprintf(cmd, sizeof(cmd), "NO_COLOR=1 %s --socket %s --pin-dir %s --once", KVTOP, P.sock, pin_dir);
	assert_int_equal(pty_escapes(cmd), 0);
}

/* q on kvtop's input ends the dashboard, with status 0. */
static void test_kvtop_q(void **state)
{
	(void)state;
	SKIP_UNLESS_BPF();
	if (access(KVTOP, X_OK))
		skip();
	int in[2];
	assert_int_equal(pipe(in), 0);
	pid_t top = fork();
	assert_true(top >= 0);
	if (top == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		int null = open("/dev/null", O_WRONLY);
		dup2(in[0], 0);
		dup2(null, 1);
		close(in[1]);
		execl(KVTOP, KVTOP, "--socket", P.sock, "--pin-dir", pin_dir, "--interval", "3600", (char *)NULL);
		_exit(127);
	}
	close(in[0]);
	assert_int_equal(write(in[1], "q", 1), 1);
	int st = 0;
	pid_t w = 0;
	/* An hour between refreshes: only the q ends it within the bound. */
	for (int64_t end = kp_now_ms() + kw_ms(60000); (w = waitpid(top, &st, WNOHANG)) == 0 && kp_now_ms() < end;)
		kp_sleep_ms(20);
	if (w == 0) {
		kill(top, SIGKILL);
		waitpid(top, &st, 0);
	}
	close(in[1]);
	assert_int_equal(w, top);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
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
		cmocka_unit_test(test_kvtop_plain),
		cmocka_unit_test(test_kvtop_q),
	};
	const struct CMUnitTest alone[] = {
		cmocka_unit_test_teardown(test_unpinned_on_exit, teardown_own),
		cmocka_unit_test_teardown(test_kvtop_attach, teardown_own),
		cmocka_unit_test_teardown(test_foreign_dir, teardown_foreign),
		cmocka_unit_test_teardown(test_perf_sdt, teardown_own),
		cmocka_unit_test(test_pin_names),
		cmocka_unit_test_teardown(test_two_daemons, teardown_pair),
		cmocka_unit_test_teardown(test_same_instance, teardown_pair),
	};
	unsetenv("KVD_BPF_PIN_DIR");	/* the derived directories are under test; each daemon is given its own */
	can_bpf();	/* first: it may unshare the mount namespace, which moves only the calling thread */
	private_sys_bpf();
	int failed = cmocka_run_group_tests_name("bpf_shared_daemon", tests, setup_daemon, teardown_daemon);
	failed += cmocka_run_group_tests_name("bpf_own_daemon", alone, NULL, NULL);
	if (!why_no_sys[0])
		umount2("/sys/fs/bpf", MNT_DETACH);
	kp_bpffs_close(&fs);
	return failed ? 1 : 0;
}
