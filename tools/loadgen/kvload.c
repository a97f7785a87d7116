/*
 * kvload.c — streaming chat clients against an OpenAI-compatible server (kvhttp), the
 * HTTP twin of kvbench: output tok/s, TTFT and ITL percentiles, as kvbench reports them.
 *
 * Each client is one libcurl transfer at a time on its own kept-alive connection,
 * closed loop: when a reply ends the client sends its next request. All clients run
 * in one thread on curl's multi interface, so the load generator itself costs one
 * thread's worth of CPU whatever the client count. Every request is
 * POST /v1/chat/completions with stream, stream_options.include_usage,
 * temperature 0 and ignore_eos, so it produces exactly max_tokens tokens; its
 * messages are seeded random words, distinct for every request from the first one
 * on, so the prefix cache cannot make one request cheaper than another (the
 * cached tokens the server reports are printed to show it).
 *
 * TTFT: the request's start to the first chunk carrying text; ITL: gaps between
 * a request's text chunks; tokens: the usage chunk's completion_tokens.
 */
#include <curl/curl.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tools/common.h"

#define WHO "kvload"

struct opts {
	const char	*url;		/* base, without /v1 */
	uint32_t	clients;
	uint64_t	requests;	/* in all */
	uint32_t	words;		/* per message */
	uint32_t	output;		/* max_tokens */
	uint64_t	seed;
	const char	*key;		/* bearer token; NULL: none */
	int		json;
};

/* A growable array of doubles. */
struct vec {
	double	*v;
	size_t	n, cap;
};

static int vec_push(struct vec *a, double x)
{
	if (a->n == a->cap) {
		size_t cap = a->cap ? 2 * a->cap : 1024;
		double *v = realloc(a->v, cap * sizeof(*v));
		if (!v)
			return -1;
		a->v = v;
		a->cap = cap;
	}
	a->v[a->n++] = x;
	return 0;
}

struct run;

struct client {
	struct run	*r;
	CURL		*h;
	struct curl_slist *hdr;
	char		*body;
	char		*buf;		/* SSE bytes not yet split into events */
	size_t		len, cap;
	double		t0, last;	/* the request's start; its previous text chunk (< 0: none) */
	int		got_text, got_done, bad;
	long		completion, prompt, cached;	/* from the usage chunk; -1: none */
	char		err[CURL_ERROR_SIZE];
};

struct run {
	struct opts	o;
	uint64_t	rng;
	uint64_t	issued, done, errors;
	uint64_t	tokens, prompt_tokens, cached_tokens;
	struct vec	ttft, itl;	/* ms */
	char		first_err[320];
};

static uint64_t next_rand(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Common English words, each one token after a space in most BPE vocabularies. */
static const char *const vocab[] = {
	"time", "people", "water", "world", "house", "light", "river", "music", "paper", "money",
	"night", "story", "table", "green", "small", "large", "quick", "slow", "happy", "cold",
	"warm", "bright", "dark", "city", "road", "field", "tree", "stone", "bird", "horse",
	"window", "door", "garden", "friend", "school", "book", "letter", "market", "winter",
	"summer", "morning", "evening", "mountain", "ocean", "island", "forest", "village",
	"kitchen", "bread", "apple", "orange", "yellow", "silver", "golden", "quiet", "loud",
};

/* n random words, space separated, into a new string. */
static char *words(struct run *r, uint32_t n)
{
	size_t cap = (size_t)n * 10 + 1, len = 0;
	char *s = malloc(cap);
	if (!s)
		return NULL;
	for (uint32_t i = 0; i < n; i++) {
		const char *w = vocab[next_rand(&r->rng) % (sizeof(vocab) / sizeof(vocab[0]))];
		len += (size_t)snprintf(s + len, cap - len, "%s%s", i ? " " : "", w);
	}
	return s;
}

static void note_error(struct run *r, const char *fmt, const char *what)
{
	r->errors++;
	if (!r->first_err[0])
		snprintf(r->first_err, sizeof(r->first_err), fmt, what);
}

/* One SSE event's data (NUL-terminated). */
static void on_event(struct run *r, struct client *c, const char *data, double now)
{
	if (!strcmp(data, "[DONE]")) {
		c->got_done = 1;
		return;
	}
	json_error_t je;
	json_t *o = json_loads(data, 0, &je);
	if (!o) {
		c->bad = 1;
		return;
	}
	json_t *u = json_object_get(o, "usage");
	if (json_is_object(u)) {
		c->completion = (long)json_integer_value(json_object_get(u, "completion_tokens"));
		c->prompt = (long)json_integer_value(json_object_get(u, "prompt_tokens"));
		c->cached = (long)json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"),
								    "cached_tokens"));
	}
	json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
	const char *text = json_string_value(json_object_get(json_object_get(ch, "delta"), "content"));
	if (text && *text) {
		if (!c->got_text)
			vec_push(&r->ttft, (now - c->t0) * 1e3);
		else
			vec_push(&r->itl, (now - c->last) * 1e3);
		c->got_text = 1;
		c->last = now;
	}
	json_decref(o);
}

static size_t on_data(char *p, size_t sz, size_t nm, void *u)
{
	struct client *c = u;
	size_t n = sz * nm;
	double now = tool_now_s();
	if (c->len + n + 1 > c->cap) {
		size_t cap = (c->len + n + 1) * 2;
		char *b = realloc(c->buf, cap);
		if (!b)
			return 0;	/* curl fails the transfer */
		c->buf = b;
		c->cap = cap;
	}
	memcpy(c->buf + c->len, p, n);
	c->len += n;
	c->buf[c->len] = 0;
	char *s = c->buf, *e;
	while ((e = strstr(s, "\n\n"))) {
		*e = 0;
		if (!strncmp(s, "data: ", 6))
			on_event(c->r, c, s + 6, now);
		s = e + 2;
	}
	c->len -= (size_t)(s - c->buf);
	memmove(c->buf, s, c->len);
	return n;
}

/* Start client c's next request. */
static int start(CURLM *m, struct run *r, struct client *c)
{
	char *sys = words(r, r->o.words), *user = words(r, r->o.words);
	json_t *req = sys && user ? json_pack("{s:s,s:[{s:s,s:s},{s:s,s:s}],s:i,s:b,s:{s:b},s:i,s:b}",
					      "model", "default", "messages", "role", "system", "content", sys,
					      "role", "user", "content", user, "max_tokens", (int)r->o.output,
					      "stream", 1, "stream_options", "include_usage", 1,
					      "temperature", 0, "ignore_eos", 1) : NULL;
	free(sys);
	free(user);
	free(c->body);
	c->body = req ? json_dumps(req, JSON_COMPACT) : NULL;
	json_decref(req);
	if (!c->body)
		return -1;
	c->len = 0;
	c->got_text = c->got_done = c->bad = 0;
	c->completion = c->prompt = c->cached = -1;
	c->err[0] = 0;
	curl_easy_setopt(c->h, CURLOPT_POSTFIELDS, c->body);
	c->t0 = tool_now_s();
	r->issued++;
	return curl_multi_add_handle(m, c->h) == CURLM_OK ? 0 : -1;
}

/* Client c's request has ended with result res. */
static void finish(struct run *r, struct client *c, CURLcode res)
{
	long code = 0;
	curl_easy_getinfo(c->h, CURLINFO_RESPONSE_CODE, &code);
	if (res != CURLE_OK) {
		note_error(r, "transfer failed: %s", c->err[0] ? c->err : curl_easy_strerror(res));
		return;
	}
	if (code != 200) {
		char what[64 + 160];
		if (c->buf)	/* NULL when the reply had no body */
			c->buf[c->len < 160 ? c->len : 160] = 0;
		snprintf(what, sizeof(what), "HTTP %ld: %s", code, c->buf ? c->buf : "");
		note_error(r, "%s", what);
		return;
	}
	if (c->bad || !c->got_done || c->completion < 0) {
		note_error(r, "%s", c->bad ? "a chunk that is not JSON" : !c->got_done ?
			   "the stream ended without [DONE]" : "no usage chunk");
		return;
	}
	r->done++;
	r->tokens += (uint64_t)c->completion;
	r->prompt_tokens += (uint64_t)c->prompt;
	r->cached_tokens += (uint64_t)(c->cached > 0 ? c->cached : 0);
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvload [options]\n\n"
		"Streams chat completions from an OpenAI-compatible server (kvhttp) with N\n"
		"concurrent clients, closed loop, and prints throughput and latency as kvbench\n"
		"does for the rings. Every request asks for exactly its output length\n"
		"(ignore_eos, temperature 0); its messages are seeded random words.\n\n"
		"      --url URL           server (default http://127.0.0.1:8000)\n"
		"  -c, --clients N         concurrent clients (default 1)\n"
		"  -n, --requests N        requests in all (default 8 per client)\n"
		"  -w, --words N           words in each of the system and user messages (default 50)\n"
		"  -o, --output-len N      output tokens (max_tokens, default 128)\n"
		"      --seed S            seeds the words (default 1)\n"
		"      --api-key-file F    send the key in F as a bearer token\n"
		"      --json              one JSON object instead of the table\n"
		"  -h, --help\n\n"
		"TTFT: a request's start to its first text chunk; ITL: gaps between its text\n"
		"chunks; tokens: the usage chunk's completion_tokens. Exit status: 0 ok, 1 a\n"
		"request failed or none completed, 2 usage.\n");
}

enum { OPT_URL = 256, OPT_SEED, OPT_KEY, OPT_JSON };

static int parse(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		{ "url", required_argument, NULL, OPT_URL }, { "clients", required_argument, NULL, 'c' },
		{ "requests", required_argument, NULL, 'n' }, { "words", required_argument, NULL, 'w' },
		{ "output-len", required_argument, NULL, 'o' }, { "seed", required_argument, NULL, OPT_SEED },
		{ "api-key-file", required_argument, NULL, OPT_KEY }, { "json", no_argument, NULL, OPT_JSON },
		{ "help", no_argument, NULL, 'h' }, { 0 },
	};
	uint64_t v;
	int ch;
	*o = (struct opts){ .url = "http://127.0.0.1:8000", .clients = 1, .words = 50, .output = 128, .seed = 1 };
	while ((ch = getopt_long(argc, argv, "c:n:w:o:h", lo, NULL)) != -1) {
		switch (ch) {
		case OPT_URL: o->url = optarg; break;
		case 'c':
			if (tool_parse_u64(WHO, "--clients", optarg, 1, 4096, &v))
				return -1;
			o->clients = (uint32_t)v;
			break;
		case 'n':
			if (tool_parse_u64(WHO, "--requests", optarg, 1, UINT32_MAX, &o->requests))
				return -1;
			break;
		case 'w':
			if (tool_parse_u64(WHO, "--words", optarg, 1, 100000, &v))
				return -1;
			o->words = (uint32_t)v;
			break;
		case 'o':
			if (tool_parse_u64(WHO, "--output-len", optarg, 1, 1 << 20, &v))
				return -1;
			o->output = (uint32_t)v;
			break;
		case OPT_SEED:
			if (tool_parse_u64(WHO, "--seed", optarg, 0, UINT64_MAX, &o->seed))
				return -1;
			break;
		case OPT_KEY: o->key = optarg; break;
		case OPT_JSON: o->json = 1; break;
		case 'h': usage(stdout); exit(0);
		default: return -1;
		}
	}
	if (optind < argc) {
		fprintf(stderr, WHO ": unexpected argument '%s'\n", argv[optind]);
		return -1;
	}
	if (!o->requests)
		o->requests = 8ull * o->clients;
	return 0;
}

/* The bearer header with the key in file f, or NULL (said on stderr). */
static char *key_header(const char *f)
{
	char *key = tool_read_key(WHO, f), *h = NULL;
	if (key && asprintf(&h, "Authorization: Bearer %s", key) < 0)
		h = NULL;
	free(key);
	return h;
}

static void sort(struct vec *a)
{
	qsort(a->v, a->n, sizeof(*a->v), cmp_double);
}

static void report(const struct run *r, double dur)
{
	const struct opts *o = &r->o;
	double tok_s = dur > 0 ? (double)r->tokens / dur : NAN;
	double prompt = r->done ? (double)r->prompt_tokens / (double)r->done : NAN;
	const struct { const char *k; double v; } f[] = {
		{ "clients", o->clients }, { "output_len", o->output }, { "requests", (double)r->done },
		{ "errors", (double)r->errors }, { "output_tokens", (double)r->tokens }, { "duration_s", dur },
		{ "output_tok_s", tok_s }, { "requests_s", dur > 0 ? (double)r->done / dur : NAN },
		{ "ttft_p50_ms", pct(r->ttft.v, r->ttft.n, 50) }, { "ttft_p99_ms", pct(r->ttft.v, r->ttft.n, 99) },
		{ "itl_p50_ms", pct(r->itl.v, r->itl.n, 50) }, { "itl_p99_ms", pct(r->itl.v, r->itl.n, 99) },
		{ "prompt_len", prompt }, { "cached_tokens", (double)r->cached_tokens },
	};
	if (o->json) {
		for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
			printf(isnan(f[i].v) ? "%c\"%s\":null" : "%c\"%s\":%.10g", i ? ',' : '{', f[i].k, f[i].v);
		puts("}");
		return;
	}
	printf("kvload: %u client%s, %s, chat, %u+%u words, output %u tokens, seed %" PRIu64 "\n", o->clients,
	       o->clients == 1 ? "" : "s", o->url, o->words, o->words, o->output, o->seed);
	printf("  %-24s %" PRIu64 "\n", "requests completed", r->done);
	printf("  %-24s %" PRIu64 "%s%s%s\n", "errors", r->errors, r->errors ? " (first: " : "", r->first_err,
	       r->errors ? ")" : "");
	printf("  %-24s %.2f s\n", "duration", dur);
	printf("  %-24s %.1f\n", "output tok/s", tok_s);
	printf(r->done ? "  %-24s %.1f\n" : "  %-24s -\n", "prompt tokens (mean)", prompt);
	printf("  %-24s %" PRIu64 "\n", "cached prompt tokens", r->cached_tokens);
	printf(r->ttft.n ? "  %-24s %.2f / %.2f\n" : "  %-24s -\n", "TTFT p50 / p99 (ms)", f[8].v, f[9].v);
	printf(r->itl.n ? "  %-24s %.2f / %.2f\n" : "  %-24s -\n", "ITL p50 / p99 (ms)", f[10].v, f[11].v);
}

int main(int argc, char **argv)
{
	struct run r = { 0 };
	if (parse(argc, argv, &r.o)) {
		usage(stderr);
		return TOOL_EXIT_USAGE;
	}
	r.rng = r.o.seed;
	if (curl_global_init(CURL_GLOBAL_DEFAULT)) {
		fprintf(stderr, WHO ": curl_global_init failed\n");
		return TOOL_EXIT_RUNTIME;
	}
	char *url = malloc(strlen(r.o.url) + 32), *auth = r.o.key ? key_header(r.o.key) : NULL;
	if (!url || (r.o.key && !auth))
		return TOOL_EXIT_RUNTIME;
	sprintf(url, "%s/v1/chat/completions", r.o.url);
	CURLM *m = curl_multi_init();
	struct client *cl = calloc(r.o.clients, sizeof(*cl));
	if (!m || !cl)
		return TOOL_EXIT_RUNTIME;
	/* One connection per client, as kvbench has. */
	curl_multi_setopt(m, CURLMOPT_MAX_HOST_CONNECTIONS, (long)r.o.clients);
	for (uint32_t i = 0; i < r.o.clients; i++) {
		struct client *c = &cl[i];
		c->r = &r;
		c->h = curl_easy_init();
		c->hdr = curl_slist_append(NULL, "Content-Type: application/json");
		if (auth)
			c->hdr = curl_slist_append(c->hdr, auth);
		if (!c->h || !c->hdr)
			return TOOL_EXIT_RUNTIME;
		curl_easy_setopt(c->h, CURLOPT_URL, url);
		curl_easy_setopt(c->h, CURLOPT_HTTPHEADER, c->hdr);
		curl_easy_setopt(c->h, CURLOPT_WRITEFUNCTION, on_data);
		curl_easy_setopt(c->h, CURLOPT_WRITEDATA, c);
		curl_easy_setopt(c->h, CURLOPT_ERRORBUFFER, c->err);
		curl_easy_setopt(c->h, CURLOPT_PRIVATE, c);
		curl_easy_setopt(c->h, CURLOPT_TCP_NODELAY, 1L);
		curl_easy_setopt(c->h, CURLOPT_NOSIGNAL, 1L);
	}
	static const int sigs[] = { SIGINT, SIGTERM, 0 };
	tool_catch_signals(sigs);
	double t0 = tool_now_s();
	int running = 0;
	for (uint32_t i = 0; i < r.o.clients && r.issued < r.o.requests; i++)
		if (start(m, &r, &cl[i]))
			return TOOL_EXIT_RUNTIME;
	do {
		if (curl_multi_perform(m, &running) != CURLM_OK)
			break;
		CURLMsg *msg;
		int left;
		while ((msg = curl_multi_info_read(m, &left))) {
			if (msg->msg != CURLMSG_DONE)
				continue;
			struct client *c;
			curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&c);
			CURLcode res = msg->data.result;
			curl_multi_remove_handle(m, c->h);
			finish(&r, c, res);
			if (r.issued < r.o.requests && !tool_interrupted && !r.errors) {
				if (start(m, &r, c))
					return TOOL_EXIT_RUNTIME;
				running++;
			}
		}
		if (running && !tool_interrupted)
			curl_multi_poll(m, NULL, 0, 1000, NULL);
	} while (running && !tool_interrupted);
	double dur = tool_now_s() - t0;
	sort(&r.ttft);
	sort(&r.itl);
	report(&r, dur);
	if (r.errors)
		fprintf(stderr, WHO ": %" PRIu64 " request%s failed, the first: %s\n", r.errors,
			r.errors == 1 ? "" : "s", r.first_err);
	for (uint32_t i = 0; i < r.o.clients; i++) {
		curl_multi_remove_handle(m, cl[i].h);
		curl_easy_cleanup(cl[i].h);
		curl_slist_free_all(cl[i].hdr);
		free(cl[i].body);
		free(cl[i].buf);
	}
	curl_multi_cleanup(m);
	curl_global_cleanup();
	free(cl);
	free(url);
	free(auth);
	free(r.ttft.v);
	free(r.itl.v);
	return r.errors || !r.done ? TOOL_EXIT_RUNTIME : 0;
}
