/* kvd_load.c — loader of kvd's BPF programs: open, load, attach to one kvd's USDT probes, pin, and undo all that. */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>
#include <linux/magic.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include "bpf/kvd_load.h"
#include "uapi/kvd_metrics.h"
#include "bpf/kvd.skel.h"

#define MAX_LINKS 32

/* The maps pinned, NULL-terminated. */
static const char *const kvd_bpf_pinned_maps[] = { "counters", "pool", "hists", "uids", "meta", NULL };

struct kvd_bpf {
	struct kvd_skel *skel;	/* the generated skeleton: maps and programs */
	struct bpf_link *links[MAX_LINKS];
	unsigned n_links;
	char pin_dir[256];
	int made_dir;			/* pin_dir was created by this loader */
	int adopted;			/* pin_dir held a dead loader's pins: kvd's, to remove when done */
	int lock_fd;			/* pin_dir, flock()ed while this loader owns it; -1 before */
	gid_t gid;			/* group of pin_dir and the pins, (gid_t)-1: the loader's */
	unsigned n_pinned;		/* kvd_bpf_pinned_maps[0 .. n_pinned) are pinned */
};

/* libbpf's last warning, quoted in our error messages instead of printed. */
static char last_msg[256];

static int print_fn(enum libbpf_print_level level, const char *fmt, va_list ap)
{
	if (getenv("KVD_BPF_DEBUG")) {
		va_list aq;
		va_copy(aq, ap);
		vfprintf(stderr, fmt, aq);
		va_end(aq);
	}
	if (level == LIBBPF_DEBUG)
		return 0;
	int n = vsnprintf(last_msg, sizeof(last_msg), fmt, ap);
	if (n > 0 && (size_t)n < sizeof(last_msg) && last_msg[n - 1] == '\n')
		last_msg[n - 1] = 0;
	return 0;
}

int kvd_bpf_capable(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	unsigned long long eff = 0;
	int found = 0;
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "CapEff: %llx", &eff) == 1) {
			found = 1;
			break;
		}
	fclose(f);
	const unsigned long long sys_admin = 1ull << 21, perfmon = 1ull << 38, bpf = 1ull << 39;
	/* Uprobes need CAP_PERFMON beside CAP_BPF; CAP_SYS_ADMIN covers both on older kernels. */
	return found && ((eff & sys_admin) || ((eff & bpf) && (eff & perfmon)));
}

static int fail(char *err, size_t len, int rc, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(err, len, fmt, ap);
	va_end(ap);
	if (last_msg[0] && n >= 0 && (size_t)n < len)
		snprintf(err + n, len - (size_t)n, " (%s)", last_msg);
	return rc;
}

static int pin_path(char *buf, size_t len, const char *dir, const char *name)
{
	int n = snprintf(buf, len, "%s/%s", dir, name);
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

static int on_bpffs(const char *path)
{
	struct statfs sf;
	return !statfs(path, &sf) && (unsigned long)sf.f_type == (unsigned long)BPF_FS_MAGIC;
}

/* "dir is held by ...": who the live owner is, from its meta map, when it can be read. */
static int busy(const char *dir, char *err, size_t len)
{
	char path[320];
	struct kvd_meta m = { 0 };
	__u32 zero = 0;
	int fd = pin_path(path, sizeof(path), dir, "meta") ? -1 : bpf_obj_get(path);
	if (fd >= 0 && !bpf_map_lookup_elem(fd, &zero, &m) && m.loader_pid) {
		close(fd);
		return fail(err, len, -EBUSY, "%s holds the metrics of pid %u, loaded by pid %u, which is running",
			    dir, m.daemon_pid, m.loader_pid);
	}
	if (fd >= 0)
		close(fd);
	return fail(err, len, -EBUSY, "%s is in use by another loader, which is running", dir);
}

/* Whether the pin at path is a map called name: a dead loader's, not something else of that name. */
static int is_kvd_map(const char *path, const char *name)
{
	struct bpf_map_info info;
	__u32 len = sizeof(info);
	memset(&info, 0, sizeof(info));
	int fd = bpf_obj_get(path);
	if (fd < 0)
		return 0;
	int ok = !bpf_obj_get_info_by_fd(fd, &info, &len) && len >= offsetof(struct bpf_map_info, name) +
		 sizeof(info.name) && !strncmp(info.name, name, sizeof(info.name));
	close(fd);
	return ok;
}

/*
 * Pins left without an owner (SIGKILL) are removed: kvd's own map names
 * alone, and only where they are kvd's maps, as the directory may be anyone's
 * ($KVD_BPF_PIN_DIR). A directory that held them was kvd's.
 */
static int clear_stale(struct kvd_bpf *b, char *err, size_t len)
{
	char path[320];
	for (const char *const *n = kvd_bpf_pinned_maps; *n; n++) {
		if (pin_path(path, sizeof(path), b->pin_dir, *n))
			return fail(err, len, -ENAMETOOLONG, "pin directory name too long");
		if (access(path, F_OK) && errno == ENOENT)
			continue;
		if (!is_kvd_map(path, *n))
			return fail(err, len, -EEXIST, "%s is in the way and is not a kvd map: not removed", path);
		if (unlink(path) && errno != ENOENT)
			return fail(err, len, -errno, "cannot remove stale pin %s: %s", path, strerror(errno));
		b->adopted = 1;
	}
	return 0;
}

/*
 * Own pin_dir: an exclusive flock() on it, held until unload, so a second
 * loader on the same directory (a second daemon of the same instance) is
 * refused rather than clobbering the pins, and a dead one's lock goes with
 * it. The lock must be on the directory the path names now: an owner that
 * unloads removes it before letting go.
 */
static int take_dir(struct kvd_bpf *b, char *err, size_t len)
{
	for (int tries = 0; tries < 3; tries++) {
		struct stat a, p;
		int fd = open(b->pin_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (fd < 0)
			return fail(err, len, -errno, "%s: %s", b->pin_dir, strerror(errno));
		if (flock(fd, LOCK_EX | LOCK_NB)) {
			int e = errno;
			close(fd);
			/* Made here or not, the directory is the lock holder's now: not ours to remove. */
			b->made_dir = 0;
			return e == EWOULDBLOCK ? busy(b->pin_dir, err, len)
						: fail(err, len, -e, "flock %s: %s", b->pin_dir, strerror(e));
		}
		if (!fstat(fd, &a) && !stat(b->pin_dir, &p) && a.st_ino == p.st_ino && a.st_dev == p.st_dev) {
			b->lock_fd = fd;
			break;
		}
		close(fd);
		if (mkdir(b->pin_dir, 0750) == 0)
			b->made_dir = 1;
	}
	if (b->lock_fd < 0) {
		b->made_dir = 0;
		return fail(err, len, -EBUSY, "%s keeps being replaced", b->pin_dir);
	}
	return clear_stale(b, err, len);
}

/* mkdir pin_dir, and its parent (KVD_PIN_DIR itself) when that is missing on a bpf file system. */
static int make_dir(struct kvd_bpf *b)
{
	if (mkdir(b->pin_dir, 0750) == 0)
		return b->made_dir = 1, 0;
	if (errno != ENOENT)
		return errno == EEXIST ? 0 : -errno;
	char parent[sizeof(b->pin_dir)], top[sizeof(b->pin_dir)];
	snprintf(parent, sizeof(parent), "%s", b->pin_dir);
	char *slash = strrchr(parent, '/');
	if (!slash || slash == parent)
		return -ENOENT;
	*slash = 0;
	snprintf(top, sizeof(top), "%s", parent);
	slash = strrchr(top, '/');
	if (!slash)
		return -ENOENT;
	*(slash == top ? slash + 1 : slash) = 0;
	/* 0755 whatever the umask (kvd.service's is 0077): each instance's group passes through to its own. */
	if (!on_bpffs(top))
		return -ENOENT;
	if (mkdir(parent, 0755) == 0)
		chmod(parent, 0755);
	else if (errno != EEXIST)
		return -errno;
	if (mkdir(b->pin_dir, 0750))
		return errno == EEXIST ? 0 : -errno;
	return b->made_dir = 1, 0;
}

static int prepare_dir(struct kvd_bpf *b, char *err, size_t len)
{
	int rc = make_dir(b);
	if (rc) {
		/* The pin directory may live anywhere (KVD_BPF_PIN_DIR, --pin-dir): name its own parent. */
		char parent[sizeof(b->pin_dir)];
		snprintf(parent, sizeof(parent), "%s", b->pin_dir);
		char *slash = strrchr(parent, '/');
		if (slash)
			*(slash == parent ? slash + 1 : slash) = 0;
		return fail(err, len, rc, "cannot create %s: %s (is a bpf file system mounted on %s? "
			    "mount -t bpf bpf %s)", b->pin_dir, strerror(-rc), slash ? parent : ".",
			    slash ? parent : ".");
	}
	if (!on_bpffs(b->pin_dir))
		return fail(err, len, -ENOTSUP, "%s is not on a bpf file system (mount -t bpf bpf DIR, and pin under DIR)",
			    b->pin_dir);
	if ((rc = take_dir(b, err, len)))
		return rc;
	/*
	 * Readers in the socket's group may list the directory and read the pins (pin_all), nobody
	 * else; a directory kvd did not make (KVD_BPF_PIN_DIR=/sys/fs/bpf) keeps the mode its owner gave.
	 */
	if (b->made_dir && ((b->gid != (gid_t)-1 && fchown(b->lock_fd, (uid_t)-1, b->gid)) ||
			    fchmod(b->lock_fd, 0750)))
		return fail(err, len, -errno, "cannot give %s to group %u: %s", b->pin_dir, (unsigned)b->gid,
			    strerror(errno));
	return 0;
}

/* Every program kvd_<probe> goes on the USDT probe kvd:<probe> of exe in pid. */
static int attach_all(struct kvd_bpf *b, pid_t pid, const char *exe, char *err, size_t len)
{
	struct bpf_program *prog;
	bpf_object__for_each_program(prog, b->skel->obj) {
		const char *name = bpf_program__name(prog);
		if (strncmp(name, "kvd_", 4))
			continue;
		if (b->n_links == MAX_LINKS)
			return fail(err, len, -E2BIG, "more than %d programs", MAX_LINKS);
		struct bpf_link *l = bpf_program__attach_usdt(prog, pid, exe, "kvd", name + 4, NULL);
		if (!l)
			return fail(err, len, -errno, "cannot attach to kvd:%s in %s (pid %d): %s", name + 4,
				    exe, (int)pid, strerror(errno));
		b->links[b->n_links++] = l;
	}
	return 0;
}

static int pin_all(struct kvd_bpf *b, pid_t pid, char *err, size_t len)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	struct kvd_meta m = {
		.version = KVD_MAPS_VERSION, .daemon_pid = (__u32)pid, .loader_pid = (__u32)getpid(),
		.loaded_ns = (__u64)ts.tv_sec * 1000000000ull + (__u64)ts.tv_nsec,
	};
	__u32 zero = 0;
	if (bpf_map_update_elem(bpf_map__fd(b->skel->maps.meta), &zero, &m, 0))
		return fail(err, len, -errno, "cannot write the meta map: %s", strerror(errno));
	for (const char *name; (name = kvd_bpf_pinned_maps[b->n_pinned]);) {
		struct bpf_map *map = bpf_object__find_map_by_name(b->skel->obj, name);
		char path[320];
		if (!map)
			return fail(err, len, -ENOENT, "no map %s in the object", name);
		if (pin_path(path, sizeof(path), b->pin_dir, name))
			return fail(err, len, -ENAMETOOLONG, "pin directory name too long");
		int rc = bpf_map__pin(map, path);
		if (rc)
			return fail(err, len, rc, "cannot pin %s: %s", path, strerror(-rc));
		/* Counted before anything else can fail: unload unpins it. */
		b->n_pinned++;
		/* Pins are 0600 by default; kvtop only reads (BPF_F_RDONLY), which the group's r bit allows. */
		if ((b->gid != (gid_t)-1 && chown(path, (uid_t)-1, b->gid)) || chmod(path, 0640))
			return fail(err, len, -errno, "cannot give %s to group %u: %s", path, (unsigned)b->gid,
				    strerror(errno));
	}
	return 0;
}

int kvd_bpf_load(struct kvd_bpf **out, pid_t pid, const char *pin_dir, gid_t gid, char *err, size_t errlen)
{
	char exe[4096], link[64];
	int rc;
	last_msg[0] = 0;
	libbpf_set_print(print_fn);
	if (pid <= 0)
		return fail(err, errlen, -EINVAL, "bad pid %d", (int)pid);
	if (strlen(pin_dir) >= sizeof(((struct kvd_bpf *)0)->pin_dir))
		return fail(err, errlen, -ENAMETOOLONG, "pin directory name too long");
	/* The file the probes live in: the process's executable, by its real path when it still has one. */
	snprintf(link, sizeof(link), "/proc/%d/exe", (int)pid);
	ssize_t n = readlink(link, exe, sizeof(exe) - 1);
	if (n < 0)
		return fail(err, errlen, -errno, "pid %d: %s", (int)pid, strerror(errno));
	exe[n] = 0;
	if (access(exe, R_OK))
		snprintf(exe, sizeof(exe), "%s", link);

	struct kvd_bpf *b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	snprintf(b->pin_dir, sizeof(b->pin_dir), "%s", pin_dir);
	b->lock_fd = -1;
	b->gid = gid;
	b->skel = kvd_skel__open();
	if (!b->skel) {
		rc = fail(err, errlen, -errno ? -errno : -EINVAL, "cannot open the BPF object");
		goto err_free;
	}
	if ((rc = kvd_skel__load(b->skel))) {
		rc = fail(err, errlen, rc, "cannot load the BPF programs: %s", strerror(-rc));
		goto err_free;
	}
	if ((rc = attach_all(b, pid, exe, err, errlen)) || (rc = prepare_dir(b, err, errlen)) ||
	    (rc = pin_all(b, pid, err, errlen)))
		goto err_free;
	*out = b;
	return 0;
err_free:
	kvd_bpf_unload(b);
	return rc;
}

void kvd_bpf_unload(struct kvd_bpf *b)
{
	if (!b)
		return;
	/* Unpin first: a reader must not find maps nothing updates any more. */
	for (unsigned i = 0; i < b->n_pinned; i++) {
		char path[320];
		if (!pin_path(path, sizeof(path), b->pin_dir, kvd_bpf_pinned_maps[i]))
			unlink(path);
	}
	/*
	 * Made here, or a dead loader's: gone when nothing else is in it (rmdir fails otherwise). One
	 * that was there already, without kvd's pins, is its owner's to keep.
	 */
	if (b->made_dir || b->adopted)
		rmdir(b->pin_dir);
	/* After the rmdir: a loader waiting for the directory finds it gone and makes its own. */
	if (b->lock_fd >= 0)
		close(b->lock_fd);
	for (unsigned i = 0; i < b->n_links; i++)
		bpf_link__destroy(b->links[i]);
	kvd_skel__destroy(b->skel);
	free(b);
}

int kvd_bpf_run_stats(const struct kvd_bpf *b, unsigned long long *ns, unsigned long long *runs)
{
	struct bpf_program *prog;
	*ns = *runs = 0;
	bpf_object__for_each_program(prog, b->skel->obj) {
		struct bpf_prog_info info;
		__u32 len = sizeof(info);
		memset(&info, 0, sizeof(info));
		if (bpf_obj_get_info_by_fd(bpf_program__fd(prog), &info, &len))
			return -errno;
		*ns += info.run_time_ns;
		*runs += info.run_cnt;
	}
	return 0;
}
