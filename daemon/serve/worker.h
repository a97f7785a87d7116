/* worker.h — the engine thread. */
#ifndef KVD_WORKER_H
#define KVD_WORKER_H

/*
 * The engine thread's body (arg: struct server *): steps until SIGTERM's
 * drain is done, then the engine_exited flag and the reaper's kick.
 */
void *worker_main(void *arg);

#endif
