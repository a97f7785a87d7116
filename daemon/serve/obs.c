/* obs.c — the daemon loads its own BPF programs (--bpf) so its metrics are there from the first request. */
#include <errno.h>
#include <string.h>
#include <unistd.h>
#include "bpf/kvd_load.h"
#include "daemon/log.h"
#include "daemon/serve/obs.h"

int obs_start(enum kvd_bpf_mode m, struct kvd_bpf **out)
{
	char err[512];
	*out = NULL;
	if (m == KVD_BPF_OFF)
		return 0;
	if (m == KVD_BPF_AUTO && !kvd_bpf_capable()) {
		log_msg(LOG_INFO, "bpf: not loading the metrics programs: no CAP_BPF and CAP_PERFMON");
		return 0;
	}
	const char *dir = kvd_bpf_default_pin_dir();
	int rc = kvd_bpf_load(out, getpid(), dir, err, sizeof(err));
	if (rc) {
		log_msg(m == KVD_BPF_ON ? LOG_ERR : LOG_WARNING, "bpf: %s", err);
		return m == KVD_BPF_ON ? rc : 0;
	}
	log_msg(LOG_NOTICE, "bpf: metrics maps pinned under %s", dir);
	return 0;
}

void obs_stop(struct kvd_bpf *b)
{
	kvd_bpf_unload(b);
}
