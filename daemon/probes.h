/* probes.h — kvd's USDT probes (provider kvd); the table of probes and arguments is in bpf/README.md. */
#ifndef KVD_PROBES_H
#define KVD_PROBES_H

/*
 * A probe is one nop in the code plus a note in .note.stapsdt that tells a
 * tracer where the nop is and where each argument lives; with nothing
 * attached that nop is the whole cost. No semaphores: the arguments are
 * values already in registers or one load away, so guarding them would
 * cost more than computing them.
 *
 * Probes are part of kvd's interface: names and argument order are stable
 * (new arguments go at the end), bpf/kvd.bpf.c and perf users rely on them.
 */
#define SDT_USE_VARIADIC 1
#include <sys/sdt.h>

#define KVD_PROBE(name, ...) STAP_PROBEV(kvd, name, ##__VA_ARGS__)

#endif
