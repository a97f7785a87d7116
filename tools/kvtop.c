/* kvtop.c — live metrics of kvd from its pinned BPF maps and its STATS: dashboard, JSON, Prometheus text. */
#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <bpf/bpf.h>
#include "bpf/kvd_load.h"
#include "bpf/kvd_pin.h"
#include "uapi/kvd_metrics.h"
#include "shm/kvclient.h"
#include "tools/common.h"
#include "tools/snap.h"

struct opts {
	const char *socket;	/* NULL: the library's default */
	const char *instance;
	const char *pin_dir;	/* --pin-dir, else pin_buf */
	char pin_buf[256];
	double interval;
	int once, json, prometheus;
	int screen;		/* live dashboard on a terminal: clear it between refreshes */
	pid_t attach;
};

/* An escape sequence, or nothing when colors are off (a pipe, $NO_COLOR). */
static int color_on;
#define C(seq) (color_on ? (seq) : "")

static void take(struct snap *s, struct kvc_conn *c, const struct opts *o)
{
	memset(s, 0, sizeof(*s));
	s->t = tool_now_s();
	s->bpf_err = snap_read_bpf(o->pin_dir, s);
	s->have_stats = c && kvc_stats(c, &s->st) == 0;
}

/*
 * Why there are no maps to show, in words: missing, not readable by this
 * user (the pins are the socket group's, mode 0640), or bpf() itself refused
 * (kernels before 6.5 deny every bpf() call to users without CAP_BPF while
 * kernel.unprivileged_bpf_disabled is set; later ones only loading).
 */
/* The first directory above dir this user may not pass through: 1 and its name and stat in up, st; else 0. */
static int closed_above(const char *dir, char *up, size_t len, struct stat *st)
{
	for (const char *p = strchr(dir + 1, '/'); p; p = strchr(p + 1, '/')) {
		snprintf(up, len, "%.*s", (int)(p - dir), dir);
		if (access(up, X_OK) && errno == EACCES)
			return !stat(up, st);
	}
	return 0;
}

static void bpf_why(char *buf, size_t len, int err, const char *dir)
{
	struct stat st;
	char sysctl[8] = "?";
	FILE *f;
	if (err == -ENOENT) {
		snprintf(buf, len, "no BPF maps in %s (kvd --bpf, or kvtop --attach PID, loads them)", dir);
	} else if (err == -EACCES) {
		char up[256];
		const struct group *g = stat(dir, &st) ? NULL : getgrgid(st.st_gid);
		if (closed_above(dir, up, sizeof(up), &st))
			snprintf(buf, len, "permission denied reading the BPF maps in %s: %s (mode %04o) lets "
				 "no one else through (systemd mounts /sys/fs/bpf 0700; chmod o+x %s "
				 "admits readers without letting them list it), or run kvtop as root", dir, up,
				 (unsigned)(st.st_mode & 07777), up);
		else if (g)
			snprintf(buf, len, "permission denied reading the BPF maps in %s: they are group %s's "
				 "(the daemon's socket group): join it, or run kvtop as root", dir, g->gr_name);
		else
			snprintf(buf, len, "permission denied reading the BPF maps in %s: join the daemon's "
				 "socket group, or run kvtop as root", dir);
	} else if (err == -EPERM) {
		if ((f = fopen("/proc/sys/kernel/unprivileged_bpf_disabled", "r"))) {
			if (!fgets(sysctl, sizeof(sysctl), f))
				snprintf(sysctl, sizeof(sysctl), "?");
			sysctl[strcspn(sysctl, "\n")] = 0;
			fclose(f);
		}
		snprintf(buf, len, "the kernel refuses bpf() to this user (kernel.unprivileged_bpf_disabled = %s): "
			 "run kvtop as root or with CAP_BPF to read %s", sysctl, dir);
	} else {
		snprintf(buf, len, "cannot read the BPF maps in %s: %s", dir, strerror(-err));
	}
}

/* ---- JSON ---- */

static void json_hist(const struct kvd_hist *h)
{
	printf("{\"count\":%llu,\"sum_s\":%.9f,\"p50_s\":%g,\"p90_s\":%g,\"p99_s\":%g,\"slots\":[",
	       snap_hist_total(h), h->sum_ns * 1e-9, snap_hist_quantile(h, .5), snap_hist_quantile(h, .9),
	       snap_hist_quantile(h, .99));
	for (int i = 0; i < KVD_HIST_SLOTS; i++)
		printf("%s%llu", i ? "," : "", h->slots[i]);
	printf("]}");
}

static void print_json(const struct snap *s, const struct opts *o)
{
	const struct kvd_counters *c = &s->ctr;
	__u64 used, cached, total;
	const char *src;
	snap_pool_figures(s, &used, &cached, &total, &src);
	printf("{\"time\":%lld,\"bpf\":%s,\"pin_dir\":", (long long)time(NULL), s->have_bpf ? "true" : "false");
	tool_json_string(stdout, o->pin_dir, strlen(o->pin_dir));	/* any path, now that $KVD_BPF_PIN_DIR picks it */
	if (!s->have_bpf) {
		char why[1024];
		bpf_why(why, sizeof(why), s->bpf_err, o->pin_dir);
		printf(",\"bpf_error\":");
		tool_json_string(stdout, why, strlen(why));
	}
	if (s->have_bpf) {
		printf(",\"daemon_pid\":%u,\"loader_pid\":%u", s->meta.daemon_pid, s->meta.loader_pid);
		printf(",\"counters\":{\"tokens\":%llu,\"first_tokens\":%llu"
		       ",\"requests\":%llu,\"submitted\":%llu,\"cancels\":%llu"
		       ",\"prefill_tokens\":%llu,\"prefix_hit_tokens\":%llu"
		       ",\"prefix_miss_tokens\":%llu,\"evictions\":%llu"
		       ",\"preemptions\":%llu,\"steps\":%llu,\"kv_allocs\":%llu"
		       ",\"kv_frees\":%llu,\"connects\":%llu,\"disconnects\":%llu}",
		       c->tokens, c->first_tokens, c->requests, c->submitted, c->cancels, c->prefill_tokens,
		       c->prefix_hit_tokens, c->prefix_miss_tokens, c->evictions, c->preemptions, c->steps,
		       c->kv_allocs, c->kv_frees, c->connects, c->disconnects);
		printf(",\"requests_in_flight\":%llu,\"prefix_hit_rate\":%.4f", snap_inflight(s),
		       snap_hit_rate(c->prefix_hit_tokens, c->prefix_miss_tokens));
		printf(",\"hists\":{");
		for (int k = 0; k < KVD_HIST_LAST; k++) {
			printf("%s\"%s\":", k ? "," : "", snap_hist_names[k]);
			json_hist(&s->h[k]);
		}
		printf("},\"uids\":[");
		for (uint32_t i = 0; i < s->n_uids; i++) {
			const struct uid_row *r = &s->uids[i];
			printf("%s{\"uid\":%u,\"tokens\":%llu,\"requests\":%llu"
			       ",\"inflight\":%llu,\"prefill_tokens\":%llu"
			       ",\"prefix_hit_tokens\":%llu,\"prefix_miss_tokens\":%llu"
			       ",\"cancels\":%llu",
			       i ? "," : "", r->uid, r->st.tokens, r->st.requests, r->st.inflight,
			       r->st.prefill_tokens, r->st.prefix_hit_tokens, r->st.prefix_miss_tokens,
			       r->st.cancels);
			for (int k = 0; k < KVD_HIST_LAST; k++) {
				if (k == KVD_HIST_STEP || k == KVD_HIST_PREFILL)
					continue;	/* steps belong to no client */
				printf(",\"%s\":", snap_hist_names[k]);
				json_hist(&r->h[k]);
			}
			printf("}");
		}
		printf("]");
	}
	printf(",\"pool\":{\"source\":\"%s\",\"in_use\":%llu,\"cached\":%llu"
	       ",\"free\":%llu,\"total\":%llu}",
	       src, used, cached, total - used - cached, total);
	if (s->have_stats) {
		const struct kvd_stats_rep *t = &s->st;
		printf(",\"stats\":{\"requests\":%llu,\"tokens_prefilled\":%llu,\"tokens_generated\":%llu,"
		       "\"kv_blocks_total\":%llu,\"kv_blocks_used\":%llu,\"kv_blocks_cached\":%llu,"
		       "\"prefix_hit_tokens\":%llu,\"prefix_miss_tokens\":%llu,\"evictions\":%llu,"
		       "\"preemptions\":%llu,\"connections\":%u,\"sessions\":%u,\"steps\":%llu}",
		       (unsigned long long)t->requests, (unsigned long long)t->tokens_prefilled,
		       (unsigned long long)t->tokens_generated, (unsigned long long)t->kv_blocks_total,
		       (unsigned long long)t->kv_blocks_used, (unsigned long long)t->kv_blocks_cached,
		       (unsigned long long)t->prefix_hit_tokens, (unsigned long long)t->prefix_miss_tokens,
		       (unsigned long long)t->evictions, (unsigned long long)t->preemptions,
		       t->connections, t->sessions, (unsigned long long)t->steps);
	} else {
		printf(",\"stats\":null");
	}
	printf("}\n");
}

/* ---- the dashboard ---- */

static void fmt_time(char *buf, size_t len, double s)
{
	if (s <= 0)
		snprintf(buf, len, "-");
	else if (s < 1e-3)
		snprintf(buf, len, "%.0fus", s * 1e6);
	else if (s < 1)
		snprintf(buf, len, "%.1fms", s * 1e3);
	else
		snprintf(buf, len, "%.2fs", s);
}

static void bar(__u64 used, __u64 cached, __u64 total, int width)
{
	int u = total ? (int)((used * (__u64)width + total - 1) / total) : 0;
	int c = total ? (int)((cached * (__u64)width + total - 1) / total) : 0;
	if (u + c > width)
		c = width - u;
	/* in use green, cached yellow, free dim dots; without colors #, = and . */
	if (color_on) {
		printf("[\033[42m%*s\033[43m%*s\033[0m\033[2m", u, "", c, "");
		for (int i = u + c; i < width; i++)
			fputs("\u00b7", stdout);
		printf("\033[0m]");
		return;
	}
	printf("[%.*s%.*s%.*s]", u, "########################################################",
	       c, "========================================================",
	       width - u - c, "........................................................");
}

static void lat_row(const char *label, const struct kvd_hist *h)
{
	char a[16], b[16], c[16], m[16];
	__u64 n = snap_hist_total(h);
	fmt_time(a, sizeof(a), snap_hist_quantile(h, .5));
	fmt_time(b, sizeof(b), snap_hist_quantile(h, .9));
	fmt_time(c, sizeof(c), snap_hist_quantile(h, .99));
	fmt_time(m, sizeof(m), n ? h->sum_ns * 1e-9 / (double)n : 0);
	printf("  %-18s %9s %9s %9s %9s %10llu\n", label, a, b, c, m, n);
}

/* The TTFT histogram, only the slots from the first to the last non-empty one. */
static void mini_hist(const struct kvd_hist *h, int width)
{
	int lo = -1, hi = -1;
	__u64 max = 0;
	for (int i = 0; i < KVD_HIST_SLOTS; i++)
		if (h->slots[i]) {
			lo = lo < 0 ? i : lo;
			hi = i;
			max = h->slots[i] > max ? h->slots[i] : max;
		}
	if (lo < 0) {
		printf("  (no requests yet)\n");
		return;
	}
	for (int i = lo; i <= hi; i++) {
		char t[16];
		fmt_time(t, sizeof(t), ldexp(1e-6, i));
		int w = (int)((h->slots[i] * (__u64)width + max - 1) / max);
		printf("  < %-8s %s", t, C("\033[36m"));
		for (int k = 0; k < w; k++)
			fputs("\u2587", stdout);
		printf("%s %llu\n", C("\033[0m"), h->slots[i]);
	}
}

static void dashboard(const struct snap *s, const struct snap *prev, const struct opts *o)
{
	double dt = prev ? s->t - prev->t : 0;
	__u64 tok = s->have_bpf ? s->ctr.tokens : s->st.tokens_generated;
	__u64 ptok = !prev ? tok : prev->have_bpf ? prev->ctr.tokens : prev->st.tokens_generated;
	double tps = dt > 0 && tok >= ptok ? (double)(tok - ptok) / dt : 0;
	char clock[16];
	time_t now = time(NULL);
	strftime(clock, sizeof(clock), "%H:%M:%S", localtime(&now));
	char why[1024];
	if (o->screen)
		printf("\033[H\033[2J");	/* home, clear */
	else if (prev)
		printf("\n");
	printf("%skvtop%s  daemon %s%s%s", C("\033[1m"), C("\033[0m"), s->have_stats ? "" : C("\033[31m"),
	       s->have_stats ? "up" : "unreachable", s->have_stats ? "" : C("\033[0m"));
	if (s->have_bpf) {
		printf(" (pid %u)  bpf maps %s%s   %s\n\n", s->meta.daemon_pid, o->pin_dir,
		       s->meta.loader_pid == s->meta.daemon_pid ? " (loaded by kvd)" : " (loaded by kvtop)",
		       clock);
	} else {
		bpf_why(why, sizeof(why), s->bpf_err, o->pin_dir);
		printf("   %s\n  %s\n\n", clock, why);
	}
	__u64 hit = s->have_bpf ? s->ctr.prefix_hit_tokens : s->st.prefix_hit_tokens;
	__u64 miss = s->have_bpf ? s->ctr.prefix_miss_tokens : s->st.prefix_miss_tokens;
	printf("  tokens/s %s%8.1f%s   in flight %4llu   requests %8llu"
	       "   tokens %10llu\n",
	       C("\033[1m"), tps, C("\033[0m"), s->have_bpf ? snap_inflight(s) : 0,
	       s->have_bpf ? s->ctr.requests : s->st.requests, tok);
	__u64 used, cached, total;
	const char *src;
	snap_pool_figures(s, &used, &cached, &total, &src);
	printf("  KV pool  ");
	bar(used, cached, total, 40);
	printf(" %llu used, %llu cached, %llu free\n", used, cached,
	       total - used - cached);
	printf("  prefix hit rate %5.1f %%  (%llu of %llu prompt tokens)   evictions %llu"
	       "   preemptions %llu\n\n",
	       100 * snap_hit_rate(hit, miss), hit, hit + miss,
	       s->have_bpf ? s->ctr.evictions : s->st.evictions,
	       s->have_bpf ? s->ctr.preemptions : s->st.preemptions);
	if (!s->have_bpf)
		return;
	printf("%s  %-18s %9s %9s %9s %9s %10s%s\n", C("\033[1m"), "latency", "p50", "p90", "p99", "mean",
	       "count", C("\033[0m"));
	static const char *const labels[KVD_HIST_LAST] = {
		"queue wait", "time to 1st token", "inter-token", "engine step", "prefill / token",
	};
	for (int k = 0; k < KVD_HIST_LAST; k++)
		lat_row(labels[k], &s->h[k]);
	printf("\n%s  time to first token%s\n", C("\033[1m"), C("\033[0m"));
	mini_hist(&s->h[KVD_HIST_TTFT], 30);
	printf("\n%s  %-8s %10s %8s %8s %8s %10s %10s %8s%s\n", C("\033[1m"), "uid", "tokens", "tok/s", "reqs",
	       "inflight", "ttft p50", "itl p50", "hit %", C("\033[0m"));
	for (uint32_t i = 0; i < s->n_uids; i++) {
		const struct uid_row *r = &s->uids[i];
		__u64 pt = r->st.tokens;
		for (uint32_t j = 0; prev && j < prev->n_uids; j++)
			if (prev->uids[j].uid == r->uid)
				pt = prev->uids[j].st.tokens;
		char a[16], b[16];
		fmt_time(a, sizeof(a), snap_hist_quantile(&r->h[KVD_HIST_TTFT], .5));
		fmt_time(b, sizeof(b), snap_hist_quantile(&r->h[KVD_HIST_ITL], .5));
		printf("  %-8u %10llu %8.1f %8llu %8llu %10s %10s %8.1f\n", r->uid,
		       r->st.tokens, dt > 0 && r->st.tokens >= pt ? (double)(r->st.tokens - pt) / dt : 0,
		       r->st.requests, r->st.inflight, a, b,
		       100 * snap_hit_rate(r->st.prefix_hit_tokens, r->st.prefix_miss_tokens));
	}
}

/* ---- keys: q quits the dashboard ---- */

static struct termios saved_tty;
static int tty_raw;		/* saved_tty is to be restored */
static int keys_fd = -1;	/* stdin while it can still bring a q; -1 once it ended */

/* Keys one at a time and unechoed on a terminal (ISIG stays: ^C still stops kvtop). */
static void keys_on(void)
{
	keys_fd = 0;
	if (!isatty(0) || tcgetattr(0, &saved_tty))
		return;
	struct termios t = saved_tty;
	t.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
	t.c_cc[VMIN] = 1;
	t.c_cc[VTIME] = 0;
	tty_raw = !tcsetattr(0, TCSANOW, &t);
}

static void keys_off(void)
{
	if (tty_raw)
		tcsetattr(0, TCSANOW, &saved_tty);
	tty_raw = 0;
}

/* Wait s seconds; 1 as soon as q or Q is read from stdin (a terminal or a pipe), else 0. */
static int wait_or_quit(double s)
{
	for (double end = tool_now_s() + s, left; !tool_interrupted && (left = end - tool_now_s()) > 0;) {
		struct pollfd p = { .fd = keys_fd, .events = POLLIN };
		int n = poll(&p, keys_fd >= 0, (int)(left * 1000) + 1);
		if (n <= 0)
			continue;	/* timed out (the loop ends) or a signal (tool_interrupted) */
		char buf[64];
		ssize_t r = read(keys_fd, buf, sizeof(buf));
		if (r <= 0 && !(r < 0 && (errno == EINTR || errno == EAGAIN)))
			keys_fd = -1;	/* end of input (/dev/null, a closed pipe): sleep only */
		else if (r > 0 && (memchr(buf, 'q', (size_t)r) || memchr(buf, 'Q', (size_t)r)))
			return 1;
	}
	return 0;
}

/* ---- main ---- */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvtop [--socket PATH] [--interval SECONDS] [--once] [--json] [--prometheus]\n"
		"             [--attach PID] [--instance NAME | --pin-dir DIR]\n"
		"  --socket PATH     the daemon's socket (default as kvctl: /run/kvd/kvd.sock as root,\n"
		"                    else $XDG_RUNTIME_DIR/kvd.sock); its maps are the ones shown\n"
		"  --interval S      refresh period of the dashboard (default 1)\n"
		"  --once            print one snapshot and exit (with --json: one JSON object)\n"
		"  --json            JSON output (with --once)\n"
		"  --prometheus      print the Prometheus text exposition format once and exit\n"
		"  --attach PID      load and attach the BPF programs to that running kvd (when the\n"
		"                    daemon did not load them itself); detaches and unpins on exit\n"
		"  --instance NAME   the daemon started with --instance NAME: its maps are in\n"
		"                    /sys/fs/bpf/kvd/NAME (default: named after the socket, as kvd does)\n"
		"  --pin-dir DIR     where the maps are pinned (default $KVD_BPF_PIN_DIR, as for kvd,\n"
		"                    else /sys/fs/bpf/kvd/INSTANCE)\n"
		"In the dashboard, q quits. Colors only on a terminal, and not with $NO_COLOR set.\n");
}

/* The directory kvd on the same socket (or of the same --instance) pins under: kvd_pin_dir(), as kvd does. */
static int pick_pin_dir(struct opts *o)
{
	char def[256];
	const char *sock = o->socket;
	if (o->pin_dir)
		return 0;
	if (!sock && !o->instance) {
		if (kvc_default_socket(def, sizeof(def)) < 0) {
			fprintf(stderr, "kvtop: the default socket's name is too long\n");
			return -ENAMETOOLONG;
		}
		sock = def;
	}
	int rc = kvd_pin_dir(o->pin_buf, sizeof(o->pin_buf), o->instance, sock);
	if (rc < 0) {
		fprintf(stderr, "kvtop: no pin directory for %s: %s\n", o->instance ? o->instance : sock,
			strerror(-rc));
		return rc;
	}
	o->pin_dir = o->pin_buf;
	return 0;
}

static int parse(int argc, char **argv, struct opts *o)
{
	enum { O_SOCKET = 256, O_INTERVAL, O_ONCE, O_JSON, O_PROM, O_ATTACH, O_PINDIR, O_INSTANCE };
	static const struct option lo[] = {
		{ "socket", required_argument, NULL, O_SOCKET },
		{ "interval", required_argument, NULL, O_INTERVAL },
		{ "once", no_argument, NULL, O_ONCE },
		{ "json", no_argument, NULL, O_JSON },
		{ "prometheus", no_argument, NULL, O_PROM },
		{ "attach", required_argument, NULL, O_ATTACH },
		{ "pin-dir", required_argument, NULL, O_PINDIR },
		{ "instance", required_argument, NULL, O_INSTANCE },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	int c;
	uint64_t pid;
	o->interval = 1;
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (c) {
		case O_SOCKET: o->socket = optarg; break;
		case O_INTERVAL:
			if (tool_parse_double("kvtop", "--interval", optarg, 0.05, 3600, &o->interval))
				return -EINVAL;
			break;
		case O_ONCE: o->once = 1; break;
		case O_JSON: o->json = 1; break;
		case O_PROM: o->prometheus = 1; break;
		case O_ATTACH:
			if (tool_parse_u64("kvtop", "--attach", optarg, 1, 0x7fffffff, &pid))
				return -EINVAL;
			o->attach = (pid_t)pid;
			break;
		case O_PINDIR: o->pin_dir = optarg; break;
		case O_INSTANCE:
			if (!kvd_pin_instance_valid(optarg)) {
				fprintf(stderr, "kvtop: bad instance '%s': 1 to %d of letters, digits, '_', '.' "
					"and '-', not starting with '.'\n", optarg, KVD_PIN_INSTANCE_MAX);
				return -EINVAL;
			}
			o->instance = optarg;
			break;
		case 'h': usage(stdout); exit(0);
		default: return -EINVAL;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kvtop: unexpected argument '%s'\n", argv[optind]);
		return -EINVAL;
	}
	if (o->json && !o->once) {
		fprintf(stderr, "kvtop: --json goes with --once\n");
		return -EINVAL;
	}
	if (o->prometheus && o->json) {
		fprintf(stderr, "kvtop: --json and --prometheus exclude each other\n");
		return -EINVAL;
	}
	if (o->instance && o->pin_dir) {
		fprintf(stderr, "kvtop: --instance and --pin-dir exclude each other\n");
		return -EINVAL;
	}
	return pick_pin_dir(o);
}

int main(int argc, char **argv)
{
	struct opts o = { 0 };
	struct kvd_bpf *attached = NULL;
	struct kvc_conn *conn = NULL;
	int rc;
	if (parse(argc, argv, &o)) {
		usage(stderr);
		return TOOL_EXIT_USAGE;
	}
	/* https://no-color.org: set and not empty. Cursor motion is no color: a terminal still gets it. */
	const char *nc = getenv("NO_COLOR");
	color_on = isatty(1) && !(nc && *nc);
	o.screen = isatty(1) && !o.once;
	/* No SA_RESTART: a signal cuts the sleep between refreshes short. */
	tool_catch_signals((const int[]){ SIGINT, SIGTERM, SIGHUP, 0 });
	if (o.attach) {
		char err[512];
		struct stat st;
		/* The pins are for the socket's group, as the daemon's own are. */
		gid_t gid = o.socket && !stat(o.socket, &st) ? st.st_gid : (gid_t)-1;
		if ((rc = kvd_bpf_load(&attached, o.attach, o.pin_dir, gid, err, sizeof(err)))) {
			fprintf(stderr, "kvtop: --attach %d: %s\n", (int)o.attach, err);
			return 1;
		}
	}
	/* Without the daemon the maps alone are still worth showing: say why only where it is missing. */
	int conn_err = tool_connect(&conn, o.socket, NULL);
	if (conn_err && !o.once && !o.prometheus) {
		tool_connect_explain("kvtop", o.socket, conn_err);
		fprintf(stderr, "kvtop: showing the BPF maps only\n");
	}
	struct snap *s = calloc(2, sizeof(*s));
	if (!s) {
		rc = -ENOMEM;
		goto out;
	}
	take(&s[0], conn, &o);
	if (!s[0].have_bpf && !s[0].have_stats) {
		char why[1024];
		bpf_why(why, sizeof(why), s[0].bpf_err, o.pin_dir);
		fprintf(stderr, "kvtop: %s\n", why);
		if (conn_err && (o.once || o.prometheus))
			tool_connect_explain("kvtop", o.socket, conn_err);
		rc = s[0].bpf_err;
		goto out;
	}
	rc = 0;
	if (o.prometheus) {
		snap_prometheus(stdout, &s[0]);
		goto out;
	}
	if (o.once) {
		if (o.json)
			print_json(&s[0], &o);
		else
			dashboard(&s[0], NULL, &o);
		goto out;
	}
	dashboard(&s[0], NULL, &o);
	fflush(stdout);
	keys_on();
	for (unsigned i = 1; !tool_interrupted; i++) {
		if (wait_or_quit(o.interval) || tool_interrupted)
			break;
		take(&s[i & 1], conn, &o);
		dashboard(&s[i & 1], &s[(i - 1) & 1], &o);
		fflush(stdout);
	}
	keys_off();
	printf("\n");
out:
	free(s);
	kvc_close(conn);
	kvd_bpf_unload(attached);
	return rc ? 1 : 0;
}
