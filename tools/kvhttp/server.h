/* server.h — starting kvhttp's HTTP server (server.c). */
#ifndef KVD_TOOLS_KVHTTP_SERVER_H
#define KVD_TOOLS_KVHTTP_SERVER_H

struct kvh_opts;
struct MHD_Daemon;

/* Serve on listen_fd (bound and listening), a thread per connection. NULL on failure. */
struct MHD_Daemon *kvh_server_start(const struct kvh_opts *o, int listen_fd);

#endif
