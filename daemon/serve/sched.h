/*
 * sched.h — the engine thread: continuous batching policy over the
 * server's requests. It reaches clients only through release.c and the
 * region API.
 */
#ifndef KVD_SCHED_H
#define KVD_SCHED_H

/* The engine thread's body (arg: struct server *); returns when the drain is done. */
void *sched_thread(void *arg);

#endif
