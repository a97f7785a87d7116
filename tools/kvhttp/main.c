/* main.c — kvhttp: options, the listening socket (bound here or passed by systemd), the server's life. */
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <microhttpd.h>
#include "tools/common.h"
#include "tools/kvhttp/kvhttp.h"
#include "tools/kvhttp/server.h"

#define SD_LISTEN_FDS_START 3

static void usage(FILE *f)
{
	fputs("usage: kvhttp [--listen ADDR:PORT] [--socket PATH] [--api-key-file FILE] [--model-name NAME]\n"
	      "              [--max-body BYTES] [--timeout SECONDS] [--max-clients N] [--sessions N]\n"
	      "              [--queue-timeout SECONDS] [--verbose]\n"
	      "An OpenAI-compatible HTTP front for kvd. See kvhttp(1).\n", f);
}

static int parse(int argc, char **argv, struct kvh_opts *o)
{
	enum { O_LISTEN = 256, O_SOCKET, O_KEY, O_NAME, O_BODY, O_TIMEOUT, O_CLIENTS, O_SESS, O_QUEUE };
	static const struct option lo[] = {
		{ "listen", required_argument, NULL, O_LISTEN }, { "socket", required_argument, NULL, O_SOCKET },
		{ "api-key-file", required_argument, NULL, O_KEY }, { "model-name", required_argument, NULL, O_NAME },
		{ "max-body", required_argument, NULL, O_BODY }, { "timeout", required_argument, NULL, O_TIMEOUT },
		{ "max-clients", required_argument, NULL, O_CLIENTS }, { "sessions", required_argument, NULL, O_SESS },
		{ "queue-timeout", required_argument, NULL, O_QUEUE }, { "verbose", no_argument, NULL, 'v' },
		{ "help", no_argument, NULL, 'h' }, { NULL, 0, NULL, 0 },
	};
	int ch;
	uint64_t v;
	while ((ch = getopt_long(argc, argv, "vh", lo, NULL)) != -1) {
		int rc = 0;
		switch (ch) {
		case O_LISTEN: o->listen = optarg; break;
		case O_SOCKET: o->socket = optarg; break;
		case O_KEY: o->api_key_file = optarg; break;
		case O_NAME: o->model_alias = optarg; break;
		case O_BODY: rc = tool_parse_u64("kvhttp", "--max-body", optarg, 1024, 1u << 30, &v); o->max_body = v; break;
		case O_TIMEOUT: rc = tool_parse_u64("kvhttp", "--timeout", optarg, 1, 86400, &v); o->timeout_s = (unsigned)v; break;
		case O_CLIENTS: rc = tool_parse_u64("kvhttp", "--max-clients", optarg, 1, 65536, &v); o->max_clients = (unsigned)v; break;
		case O_SESS: rc = tool_parse_u64("kvhttp", "--sessions", optarg, 1, 64, &v); o->sessions = (unsigned)v; break;
		case O_QUEUE: rc = tool_parse_u64("kvhttp", "--queue-timeout", optarg, 0, 3600, &v); o->queue_s = (unsigned)v; break;
		case 'v': o->verbose = 1; break;
		case 'h': usage(stdout); exit(0);
		default: usage(stderr); return -EINVAL;
		}
		if (rc)
			return rc;
	}
	if (optind < argc) {
		usage(stderr);
		return -EINVAL;
	}
	return 0;
}

/* The one socket systemd passed (LISTEN_FDS, for us), or -1. */
static int systemd_fd(void)
{
	const char *pid = getenv("LISTEN_PID"), *n = getenv("LISTEN_FDS");
	if (!pid || !n || strtol(pid, NULL, 10) != getpid() || strtol(n, NULL, 10) < 1)
		return -1;
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_FDNAMES");
	return SD_LISTEN_FDS_START;
}

static int is_loopback(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET)
		return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
	if (sa->sa_family == AF_INET6)
		return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)sa)->sin6_addr);
	return sa->sa_family == AF_UNIX;
}

/* Bind ADDR:PORT ("[v6]:port" too); the socket, or -errno. *loop: whether it is loopback only. */
static int bind_listen(const char *spec, int *loop)
{
	char host[256];
	const char *colon = strrchr(spec, ':');
	if (!colon || colon == spec || (size_t)(colon - spec) >= sizeof(host)) {
		fprintf(stderr, "kvhttp: --listen %s: expected ADDR:PORT\n", spec);
		return -EINVAL;
	}
	const char *h = spec;
	size_t hl = (size_t)(colon - spec);
	if (h[0] == '[' && h[hl - 1] == ']') {
		h++;
		hl -= 2;
	}
	memcpy(host, h, hl);
	host[hl] = 0;
	struct addrinfo hints = { .ai_flags = AI_PASSIVE | AI_NUMERICSERV, .ai_socktype = SOCK_STREAM }, *ai;
	int g = getaddrinfo(host, colon + 1, &hints, &ai);
	if (g) {
		fprintf(stderr, "kvhttp: --listen %s: %s\n", spec, gai_strerror(g));
		return -EINVAL;
	}
	int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1, rc = 0;
	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
	    bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 128))
		rc = -errno;
	*loop = is_loopback(ai->ai_addr);
	freeaddrinfo(ai);
	if (rc) {
		fprintf(stderr, "kvhttp: --listen %s: %s\n", spec, strerror(-rc));
		if (fd >= 0)
			close(fd);
		return rc;
	}
	return fd;
}

/* Whether fd (from systemd) listens on loopback only. */
static int fd_loopback(int fd)
{
	struct sockaddr_storage ss;
	socklen_t l = sizeof(ss);
	return getsockname(fd, (struct sockaddr *)&ss, &l) == 0 && is_loopback((struct sockaddr *)&ss);
}

/* The address fd listens on, as "ADDR:PORT": port 0 asked for any, and this says which. */
static const char *fd_name(int fd, char *buf, size_t len)
{
	struct sockaddr_storage ss;
	socklen_t l = sizeof(ss);
	char a[INET6_ADDRSTRLEN] = "?";
	unsigned int port = 0;
	if (getsockname(fd, (struct sockaddr *)&ss, &l) == 0) {
		if (ss.ss_family == AF_INET) {
			const struct sockaddr_in *s4 = (const struct sockaddr_in *)&ss;
			inet_ntop(AF_INET, &s4->sin_addr, a, sizeof(a));
			port = ntohs(s4->sin_port);
		} else if (ss.ss_family == AF_INET6) {
			const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)&ss;
			inet_ntop(AF_INET6, &s6->sin6_addr, a, sizeof(a));
			port = ntohs(s6->sin6_port);
		}
	}
	snprintf(buf, len, ss.ss_family == AF_INET6 ? "[%s]:%u" : "%s:%u", a, port);
	return buf;
}

int main(int argc, char **argv)
{
	struct kvh_opts o = { .listen = "127.0.0.1:8090", .max_body = 4u << 20, .timeout_s = 60,
			      .max_clients = 1024, .sessions = 8, .queue_s = 30 };
	if (parse(argc, argv, &o))
		return TOOL_EXIT_USAGE;
	if (o.api_key_file && !(o.api_key = tool_read_key("kvhttp", o.api_key_file)))
		return TOOL_EXIT_USAGE;
	int loop, fd = systemd_fd();
	if (fd >= 0)
		loop = fd_loopback(fd);
	else if ((fd = bind_listen(o.listen, &loop)) < 0)
		return TOOL_EXIT_RUNTIME;
	if (!loop && !o.api_key) {
		fprintf(stderr, "kvhttp: listening beyond loopback needs --api-key-file\n");
		return TOOL_EXIT_USAGE;
	}
	signal(SIGPIPE, SIG_IGN);
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &set, NULL);	/* the server's threads inherit the mask */
	kvh_pool_init(&o);
	struct MHD_Daemon *d = kvh_server_start(&o, fd);
	if (!d) {
		fprintf(stderr, "kvhttp: cannot start the HTTP server\n");
		return TOOL_EXIT_RUNTIME;
	}
	char where[INET6_ADDRSTRLEN + 16];
	fprintf(stderr, "kvhttp: serving on %s\n", fd_name(fd, where, sizeof(where)));
	int sig;
	sigwait(&set, &sig);
	MHD_stop_daemon(d);
	kvh_pool_fini();
	free(o.api_key);
	return 0;
}
