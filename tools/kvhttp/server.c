/* server.c — kvhttp's libmicrohttpd glue: routes, bodies, auth, JSON replies, SSE streams. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <microhttpd.h>
#include "tools/kvhttp/kvhttp.h"
#include "tools/kvhttp/server.h"

static const struct kvh_opts *s_o;

/* Per request: its body as it arrives. */
struct hctx {
	char	*body;
	size_t	len;
	size_t	discarded;	/* bytes of a body over the limit, read and dropped */
	int	too_big;
};

/* A streamed response: the generation and the SSE bytes not yet taken by libmicrohttpd. */
struct stream {
	struct kvh_req	req;
	struct kvh_gen	gen;
	char		*buf;
	size_t		len, off, cap;
	int		role_sent[KVH_MAX_CHOICES];
	int		ended;		/* [DONE] queued */
	int		streaming;	/* its response was queued: a hang-up from here on is an abort */
};

/* Each choice's finished_reason into the counters; a client gone away: abort for what had not finished. */
static void count_finished(const struct kvh_gen *g, int aborted)
{
	for (uint32_t i = 0; i < g->req->n; i++)
		kvh_metrics_finished(aborted && !g->ch[i].finish ? NULL : g->ch[i].finish);
}

static int reply(struct MHD_Connection *c, unsigned int status, const char *type, char *body, size_t len)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
	if (!r) {
		free(body);
		return MHD_NO;
	}
	MHD_add_response_header(r, "Content-Type", type);
	int rc = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	kvh_metrics_request(status);
	return rc;
}

static int reply_json(struct MHD_Connection *c, unsigned int status, json_t *j)
{
	char *s = json_dumps(j, JSON_COMPACT);
	json_decref(j);
	if (!s)
		return MHD_NO;
	return reply(c, status, "application/json", s, strlen(s));
}

static int reply_err(struct MHD_Connection *c, const struct kvh_err *e)
{
	json_t *j = kvh_err_json(e);
	char *s = json_dumps(j, JSON_COMPACT);
	json_decref(j);
	if (!s)
		return MHD_NO;
	struct MHD_Response *r = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
	if (!r) {
		free(s);
		return MHD_NO;
	}
	MHD_add_response_header(r, "Content-Type", "application/json");
	if (e->retry_after) {
		char ra[16];
		snprintf(ra, sizeof(ra), "%u", e->retry_after);
		MHD_add_response_header(r, "Retry-After", ra);
	}
	if (e->status == 401)
		MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
	int rc = MHD_queue_response(c, e->status, r);
	MHD_destroy_response(r);
	kvh_metrics_request(e->status);
	return rc;
}

static int client_fd(struct MHD_Connection *c)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
	return ci ? ci->connect_fd : -1;
}

/* ---- GET ---- */

static int get_models(struct MHD_Connection *c)
{
	struct kvd_stats_rep st;
	struct kvd_hello_rep h;
	struct kvh_err e;
	int rc = kvh_pool_stats(&st, &h);
	if (rc) {
		kvh_err_from_kvd(&e, rc, 0, 0);
		return reply_err(c, &e);
	}
	const char *id = s_o->model_alias ? s_o->model_alias : h.model_name;
	json_t *m = json_pack("{s:s,s:s,s:I,s:s,s:I,s:s}", "id", id, "object", "model", "created", (json_int_t)0,
			      "owned_by", "kvd", "context_length", (json_int_t)h.ctx_len, "backend", h.backend);
	return reply_json(c, 200, json_pack("{s:s,s:[o]}", "object", "list", "data", m));
}

static int get_health(struct MHD_Connection *c)
{
	struct kvd_stats_rep st;
	int rc = kvh_pool_stats(&st, NULL);
	if (rc) {
		struct kvh_err e;
		kvh_err_from_kvd(&e, rc, 0, 0);
		return reply_err(c, &e);
	}
	return reply_json(c, 200, json_pack("{s:s}", "status", "ok"));
}

static int get_metrics(struct MHD_Connection *c)
{
	char *s;
	int n = kvh_metrics_text(&s, s_o->socket);
	if (n < 0)
		return MHD_NO;
	return reply(c, 200, "text/plain; version=0.0.4", s, (size_t)n);
}

/* ---- completions ---- */

static void gen_model(struct kvh_gen *g)
{
	const char *m = s_o->model_alias ? s_o->model_alias : kvh_lease_info(&g->lease)->model_name;
	snprintf(g->model, sizeof(g->model), "%s", m);
}

static int sink_nop_text(void *u, uint32_t i, const char *s, size_t n)
{
	(void)u, (void)i, (void)s, (void)n;
	return 0;
}

static int sink_nop_finish(void *u, uint32_t i, const char *r)
{
	(void)u, (void)i, (void)r;
	return 0;
}

static int complete_full(struct MHD_Connection *c, struct kvh_req *r)
{
	struct kvh_gen g;
	struct kvh_err e;
	struct kvh_sink s = { sink_nop_text, sink_nop_finish, NULL };
	int rc = kvh_gen_start(&g, r, client_fd(c), &e);
	if (!rc) {
		gen_model(&g);
		while ((rc = kvh_gen_pump(&g, &s, &e)) > 0)
			;
	}
	int ret;
	if (rc == 0) {
		json_t *j = kvh_resp_full(&g);
		kvh_metrics_tokens(g.prompt_tokens, (uint32_t)json_integer_value(
				   json_object_get(json_object_get(j, "usage"), "completion_tokens")));
		count_finished(&g, 0);
		ret = reply_json(c, 200, j);
	} else if (rc == -EPIPE) {
		if (g.started)
			count_finished(&g, 1);
		ret = MHD_NO;	/* the client is gone: nobody to answer */
	} else {
		ret = reply_err(c, &e);
	}
	kvh_gen_end(&g);
	return ret;
}

static int sse_put(struct stream *st, json_t *j)
{
	char *s = j ? json_dumps(j, JSON_COMPACT) : strdup("[DONE]");
	json_decref(j);
	if (!s)
		return -ENOMEM;
	size_t n = strlen(s), need = st->len + n + 8;
	if (need > st->cap) {
		char *b = realloc(st->buf, need * 2);
		if (!b) {
			free(s);
			return -ENOMEM;
		}
		st->buf = b;
		st->cap = need * 2;
	}
	st->len += (size_t)sprintf(st->buf + st->len, "data: %s\n\n", s);
	free(s);
	return 0;
}

static int sink_text(void *u, uint32_t i, const char *s, size_t n)
{
	struct stream *st = u;
	int role = st->req.chat && !st->role_sent[i];
	st->role_sent[i] = 1;
	return sse_put(st, kvh_resp_chunk(&st->gen, i, s, n, NULL, role));
}

static int sink_finish(void *u, uint32_t i, const char *reason)
{
	struct stream *st = u;
	int role = st->req.chat && !st->role_sent[i];
	st->role_sent[i] = 1;
	return sse_put(st, kvh_resp_chunk(&st->gen, i, st->req.chat ? NULL : "", 0, reason, role));
}

static void stream_tail(struct stream *st)
{
	if (st->req.include_usage)
		sse_put(st, kvh_resp_usage_chunk(&st->gen));
	uint32_t done = 0;
	for (uint32_t i = 0; i < st->req.n; i++)
		done += st->gen.ch[i].tokens;
	kvh_metrics_tokens(st->gen.prompt_tokens, done);
	count_finished(&st->gen, 0);
	sse_put(st, NULL);
	st->ended = 1;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct stream *st = cls;
	(void)pos;
	struct kvh_sink s = { sink_text, sink_finish, st };
	while (st->off == st->len) {
		st->off = st->len = 0;
		if (st->ended)
			return MHD_CONTENT_READER_END_OF_STREAM;
		struct kvh_err e;
		int rc = kvh_gen_pump(&st->gen, &s, &e);
		if (rc == -EPIPE)
			return MHD_CONTENT_READER_END_WITH_ERROR;
		if (rc < 0) {
			/* Mid-stream there is no status to change: an error event, then the end. */
			sse_put(st, kvh_err_json(&e));
			sse_put(st, NULL);
			st->ended = 1;
		} else if (rc == 0 && !st->ended) {
			stream_tail(st);
		}
	}
	size_t n = st->len - st->off < max ? st->len - st->off : max;
	memcpy(buf, st->buf + st->off, n);
	st->off += n;
	return (ssize_t)n;
}

static void stream_free(void *cls)
{
	struct stream *st = cls;
	if (st->streaming && !st->ended)
		count_finished(&st->gen, 1);
	kvh_gen_end(&st->gen);	/* a client gone mid-stream: its request is cancelled here */
	kvh_req_free(&st->req);
	free(st->buf);
	free(st);
}

static int complete_stream(struct MHD_Connection *c, struct stream *st)
{
	struct kvh_err e;
	int rc = kvh_gen_start(&st->gen, &st->req, client_fd(c), &e);
	if (rc) {
		int ret = rc == -EPIPE ? MHD_NO : reply_err(c, &e);
		stream_free(st);
		return ret;
	}
	gen_model(&st->gen);
	struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, st,
								    stream_free);
	if (!r) {
		stream_free(st);
		return MHD_NO;
	}
	st->streaming = 1;
	MHD_add_response_header(r, "Content-Type", "text/event-stream");
	MHD_add_response_header(r, "Cache-Control", "no-cache");
	rc = MHD_queue_response(c, 200, r);
	MHD_destroy_response(r);
	kvh_metrics_request(200);
	return rc;
}

static int post_completion(struct MHD_Connection *c, struct hctx *h, int chat)
{
	struct kvh_err e;
	/*
	 * The idle timeout is for clients that stop sending; a generation that
	 * takes a while between tokens (a loaded machine, a long prefill) must
	 * not count as idle. completed() restores it for the next request.
	 */
	MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
	struct stream *st = calloc(1, sizeof(*st));
	if (!st)
		return MHD_NO;
	if (kvh_req_parse(&st->req, chat, h->body ? h->body : "", h->len, &e)) {
		kvh_req_free(&st->req);
		free(st);
		return reply_err(c, &e);
	}
	if (st->req.stream)
		return complete_stream(c, st);
	int rc = complete_full(c, &st->req);
	kvh_req_free(&st->req);
	free(st);
	return rc;
}

/* ---- routing ---- */

static int authorized(struct MHD_Connection *c)
{
	if (!s_o->api_key)
		return 1;
	const char *a = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
	if (!a || strncmp(a, "Bearer ", 7))
		return 0;
	const char *k = a + 7, *w = s_o->api_key;
	size_t kl = strlen(k), wl = strlen(w);
	unsigned char d = kl != wl;
	for (size_t i = 0; i < wl; i++)	/* in constant time: no byte-by-byte oracle */
		d |= (unsigned char)(w[i] ^ (i < kl ? k[i] : 0));
	return !d;
}

static int route(struct MHD_Connection *c, const char *url, const char *method, struct hctx *h)
{
	struct kvh_err e;
	int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
	if (get && !strcmp(url, "/health"))
		return get_health(c);
	if (!authorized(c)) {
		kvh_err_set(&e, 401, "invalid_request_error", NULL, "invalid_api_key", "a valid API key is required "
			    "(Authorization: Bearer KEY)");
		return reply_err(c, &e);
	}
	if (get && !strcmp(url, "/metrics"))
		return get_metrics(c);
	if (get && !strcmp(url, "/v1/models"))
		return get_models(c);
	if (post && !strcmp(url, "/v1/chat/completions"))
		return post_completion(c, h, 1);
	if (post && !strcmp(url, "/v1/completions"))
		return post_completion(c, h, 0);
	int known = !strcmp(url, "/health") || !strcmp(url, "/metrics") || !strcmp(url, "/v1/models") ||
		    !strcmp(url, "/v1/chat/completions") || !strcmp(url, "/v1/completions");
	if (known)
		kvh_err_set(&e, 405, "invalid_request_error", NULL, NULL, "method %s not allowed on %s", method, url);
	else
		kvh_err_set(&e, 404, "invalid_request_error", NULL, "not_found", "no such endpoint: %s %s", method, url);
	return reply_err(c, &e);
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
			       const char *version, const char *data, size_t *data_size, void **con_cls)
{
	(void)cls, (void)version;
	struct hctx *h = *con_cls;
	if (!h) {
		h = calloc(1, sizeof(*h));
		if (!h)
			return MHD_NO;
		*con_cls = h;
		const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
		if (cl && strtoull(cl, NULL, 10) > s_o->max_body)
			h->too_big = 1;
		if (!h->too_big)
			return MHD_YES;
	}
	if (*data_size) {
		if (!h->too_big && h->len + *data_size > s_o->max_body)
			h->too_big = 1;
		if (h->too_big) {
			/* A body without a length: read on (up to a bound) so the 413 can be sent. */
			h->discarded += *data_size;
			*data_size = 0;
			return h->discarded > 16 * s_o->max_body ? MHD_NO : MHD_YES;
		}
		char *b = realloc(h->body, h->len + *data_size + 1);
		if (!b)
			return MHD_NO;
		memcpy(b + h->len, data, *data_size);
		h->body = b;
		h->len += *data_size;
		h->body[h->len] = 0;
		*data_size = 0;
		return MHD_YES;
	}
	if (h->too_big) {
		struct kvh_err e;
		kvh_err_set(&e, 413, "invalid_request_error", NULL, "request_too_large",
			    "the request body is over %zu bytes", s_o->max_body);
		return (enum MHD_Result)reply_err(c, &e);
	}
	return (enum MHD_Result)route(c, url, method, h);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode t)
{
	(void)cls, (void)t;
	MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, s_o->timeout_s);
	struct hctx *h = *con_cls;
	if (h) {
		free(h->body);
		free(h);
	}
	*con_cls = NULL;
}

struct MHD_Daemon *kvh_server_start(const struct kvh_opts *o, int listen_fd)
{
	s_o = o;
	return MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
				MHD_USE_ERROR_LOG, 0, NULL, NULL, handler, NULL,
				MHD_OPTION_LISTEN_SOCKET, listen_fd,
				MHD_OPTION_CONNECTION_TIMEOUT, o->timeout_s,
				MHD_OPTION_CONNECTION_LIMIT, o->max_clients,
				MHD_OPTION_NOTIFY_COMPLETED, completed, NULL,
				MHD_OPTION_END);
}
