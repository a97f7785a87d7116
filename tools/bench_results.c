/* bench_results.c — kvbench's figures: percentiles, the table, JSON, CSV and the gnuplot chart. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "tools/common.h"
#include "tools/kvbench.h"

/* Sorted gaps (ms) of request s into g; returns their count and their sum in *sum. */
static size_t sample_gaps(const struct client *cl, const struct sample *s, double *g, double *sum)
{
	size_t n = 0;
	*sum = 0;
	for (size_t j = s->tok0; j < s->tok0 + s->ntok; j++)
		if (cl->t[j].gap >= 0)
			*sum += (g[n++] = cl->t[j].gap * 1e3);
	qsort(g, n, sizeof(*g), cmp_double);
	return n;
}

int compute(const struct bench *b, const struct kvd_stats_rep *st0,
		   const struct kvd_stats_rep *st1, double wall, struct results *r)
{
	size_t n_req = 0, n_tok = 0, nt = 0, ng = 0;
	double end = 0, sum;

	memset(r, 0, sizeof(*r));
	for (uint32_t i = 0; i < b->o.clients; i++) {
		n_req += b->cl[i].ns;
		n_tok += b->cl[i].nt;
	}
	double *ttft = malloc((n_req + n_tok + 1) * sizeof(*ttft)), *gap = ttft + n_req;
	if (!ttft)
		return -ENOMEM;
	for (uint32_t i = 0; i < b->o.clients; i++) {
		for (size_t k = 0; k < b->cl[i].ns; k++) {
			const struct sample *s = &b->cl[i].s[k];
			if (s->res < 0 && !s->cancelled) {
				if (!r->errors++)
					r->first_err = s->res;
				continue;
			}
			/* A cancelled request's tokens and gaps were measured all the same. */
			r->cancelled += s->cancelled;
			r->done += !s->cancelled;
			r->tokens += s->tokens;
			end = fmax(end, s->start + s->dur);
			if (s->ttft >= 0)
				ttft[nt++] = s->ttft * 1e3;
			ng += sample_gaps(&b->cl[i], s, gap + ng, &sum);
		}
	}
	qsort(ttft, nt, sizeof(*ttft), cmp_double);
	qsort(gap, ng, sizeof(*gap), cmp_double);
	r->dur = end > 0 ? end : wall;
	r->tok_s = r->dur > 0 ? (double)r->tokens / r->dur : 0;
	r->req_s = r->dur > 0 ? (double)r->done / r->dur : 0;
	r->ttft50 = pct(ttft, nt, 50);
	r->ttft99 = pct(ttft, nt, 99);
	r->itl50 = pct(gap, ng, 50);
	r->itl99 = pct(gap, ng, 99);
	r->kv_peak = b->kv_total ? (double)b->kv_peak / (double)b->kv_total : 0;
	r->hit = st1->prefix_hit_tokens - st0->prefix_hit_tokens;
	r->miss = st1->prefix_miss_tokens - st0->prefix_miss_tokens;
	r->hit_rate = r->hit + r->miss ? (double)r->hit / (double)(r->hit + r->miss) : NAN;
	free(ttft);
	return 0;
}

/* The run's settings in one line, for the table and the plot's title. */
static void describe(const struct opts *o, char *buf, size_t cap)
{
	char mode[32] = "closed loop", pl[24], ol[24], pre[32] = "", temp[24] = "";
	if (o->rate > 0)
		snprintf(mode, sizeof(mode), "Poisson %.3g req/s", o->rate);
	snprintf(pl, sizeof(pl), o->prompt.lo == o->prompt.hi ? "%u" : "%u..%u", o->prompt.lo,
		 o->prompt.hi);
	snprintf(ol, sizeof(ol), o->output.lo == o->output.hi ? "%u" : "%u..%u", o->output.lo,
		 o->output.hi);
	if (o->shared_prefix)
		snprintf(pre, sizeof(pre), ", shared prefix %u", o->shared_prefix);
	if (o->temp > 0)
		snprintf(temp, sizeof(temp), ", temp %g", o->temp);
	snprintf(buf, cap, "%u client%s, %s, prompt %s, output %s tokens%s%s, seed %" PRIu64,
		 o->clients, o->clients == 1 ? "" : "s", mode, pl, ol, pre, temp, o->seed);
}

static void print_table(const struct bench *b, const struct results *r)
{
	char what[256];
	describe(&b->o, what, sizeof(what));
	printf("kvbench: %s\n", what);
	printf("  %-24s %" PRIu64 "\n", "requests completed", r->done);
	printf("  %-24s %" PRIu64 "%s%s%s\n", "errors", r->errors, r->errors ? " (first: " : "",
	       r->errors ? strerror(-r->first_err) : "", r->errors ? ")" : "");
	if (r->cancelled)
		printf("  %-24s %" PRIu64 " (their tokens count below)\n", "cancelled", r->cancelled);
	printf("  %-24s %.2f s\n", "duration", r->dur);
	printf("  %-24s %.1f\n", "output tok/s", r->tok_s);
	printf("  %-24s %.2f\n", "requests/s", r->req_s);
	printf(isnan(r->ttft50) ? "  %-24s -\n" : "  %-24s %.2f / %.2f\n", "TTFT p50 / p99 (ms)",
	       r->ttft50, r->ttft99);
	printf(isnan(r->itl50) ? "  %-24s -\n" : "  %-24s %.2f / %.2f\n", "ITL p50 / p99 (ms)",
	       r->itl50, r->itl99);
	printf("  %-24s %.1f %% (%" PRIu64 " of %" PRIu64 " blocks)\n", "KV pool peak use",
	       r->kv_peak * 100, b->kv_peak, b->kv_total);
	printf(isnan(r->hit_rate) ? "  %-24s - (no prompt tokens)\n" :
	       "  %-24s %.1f %% (%" PRIu64 " of %" PRIu64 " prompt tokens)\n", "prefix hit rate",
	       r->hit_rate * 100, r->hit, r->hit + r->miss);
}

/* Flat, so that a shell script can pick fields out with sed. */
static void print_json(const struct bench *b, const struct results *r)
{
	const struct opts *o = &b->o;
	const struct { const char *k; double v; } f[] = {
		{ "clients", o->clients }, { "rate", o->rate }, { "prompt_len", o->prompt.hi },
		{ "output_len", o->output.hi }, { "shared_prefix", o->shared_prefix },
		{ "requests", (double)r->done }, { "errors", (double)r->errors },
		{ "cancelled", (double)r->cancelled }, { "output_tokens", (double)r->tokens },
		{ "duration_s", r->dur }, { "output_tok_s", r->tok_s }, { "requests_s", r->req_s },
		{ "ttft_p50_ms", r->ttft50 }, { "ttft_p99_ms", r->ttft99 },
		{ "itl_p50_ms", r->itl50 }, { "itl_p99_ms", r->itl99 }, { "kv_peak", r->kv_peak },
		{ "kv_peak_blocks", (double)b->kv_peak }, { "kv_blocks_total", (double)b->kv_total },
		{ "prefix_hit_rate", r->hit_rate }, { "prefix_hit_tokens", (double)r->hit },
		{ "prefix_miss_tokens", (double)r->miss },
	};
	for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
		printf(isnan(f[i].v) ? "%c\"%s\":null" : "%c\"%s\":%.10g", i ? ',' : '{', f[i].k,
		       f[i].v);
	puts("}");
}

/* A value in ms and a comma, or just the comma when there is none. */
static void csv_ms(FILE *f, double ms)
{
	if (!isnan(ms))
		fprintf(f, "%.3f", ms);
	fputc(',', f);
}

static int write_csv(const struct bench *b, const char *path)
{
	size_t most = 1;
	for (uint32_t i = 0; i < b->o.clients; i++)
		most = b->cl[i].nt > most ? b->cl[i].nt : most;
	double *g = malloc(most * sizeof(*g)), sum;
	FILE *f = g ? fopen(path, "w") : NULL;
	if (!f) {
		int err = g ? -errno : -ENOMEM;
		free(g);
		return err;
	}
	fputs("client,request,start_s,prompt_tokens,output_tokens,ttft_ms,duration_ms,"
	      "itl_mean_ms,itl_p50_ms,itl_p99_ms,itl_max_ms,status\n", f);
	for (uint32_t i = 0; i < b->o.clients; i++) {
		for (size_t k = 0; k < b->cl[i].ns; k++) {
			const struct sample *s = &b->cl[i].s[k];
			size_t ng = sample_gaps(&b->cl[i], s, g, &sum);
			fprintf(f, "%u,%zu,%.6f,%u,%u,", s->client, k, s->start, s->prompt, s->tokens);
			csv_ms(f, s->ttft >= 0 ? s->ttft * 1e3 : NAN);
			csv_ms(f, s->dur * 1e3);
			csv_ms(f, ng ? sum / (double)ng : NAN);
			csv_ms(f, pct(g, ng, 50));
			csv_ms(f, pct(g, ng, 99));
			csv_ms(f, ng ? g[ng - 1] : NAN);
			fprintf(f, "%s\n", s->cancelled ? "cancelled" : s->res < 0 ?
				strerror(-s->res) : "ok");
		}
	}
	free(g);
	int err = ferror(f) ? -EIO : 0;
	if (fclose(f) && !err)
		err = -errno;
	return err;
}

/*
 * Hand gnuplot the run's tokens (arrival, gap), KV pool use and each
 * request's TTFT; it bins output tok/s itself. Returns 0 or -errno.
 */
static int write_plot(const struct bench *b, const struct results *r, const char *path)
{
	size_t n_gap = 0, n_ttft = 0;
	FILE *p = popen("gnuplot", "w");
	if (!p)
		return -errno;
	fputs("$tok << EOD\n", p);
	for (uint32_t i = 0; i < b->o.clients; i++) {
		for (size_t k = 0; k < b->cl[i].nt; k++) {
			const struct tok *t = &b->cl[i].t[k];
			n_gap += t->gap >= 0;
			fprintf(p, t->gap >= 0 ? "%.4f %.4f\n" : "%.4f -\n", t->t, t->gap * 1e3);
		}
	}
	fputs("EOD\n$ttft << EOD\n", p);
	for (uint32_t i = 0; i < b->o.clients; i++) {
		for (size_t k = 0; k < b->cl[i].ns; k++) {
			const struct sample *s = &b->cl[i].s[k];
			if (s->res >= 0 && s->ttft >= 0 && ++n_ttft)
				fprintf(p, "%.4f %.4f\n", s->start + s->ttft, s->ttft * 1e3);
		}
	}
	char what[256];
	describe(&b->o, what, sizeof(what));
	const double w = (r->dur > 0 ? r->dur : 1) / PLOT_BINS;
	fprintf(p, "EOD\nset terminal pngcairo size 1000,720 noenhanced\nset output '%s'\n"
		"set datafile missing '-'\nset grid\nset key top right opaque\n"
		"set multiplot layout 2,1 title 'kvbench: %s'\nset xlabel 'time (s)'\n"
		"set xrange [0:*]\nset ylabel 'output tok/s'\nset yrange [0:*]\nw = %.6f\n"
		"set boxwidth w\nset style fill solid 0.5 noborder\n"
		"plot $tok using (w * (floor($1 / w) + 0.5)):(1 / w) smooth frequency with boxes "
		"title 'output tok/s'\nset ylabel 'latency (ms)'\nset yrange [*:*]\n"
		"set logscale y\n", path, what, w);
	/* gnuplot fails on a curve without a point: leave out the empty ones. */
	if (n_gap || n_ttft)
		fprintf(p, "plot %s%s%s\n", n_gap ? "$tok using 1:2 with points pt 7 ps 0.2 title 'ITL'" : "",
			n_gap && n_ttft ? ", " : "",
			n_ttft ? "$ttft using 1:2 with points pt 7 ps 0.6 title 'TTFT'" : "");
	fputs("unset multiplot\n", p);
	int st = pclose(p);
	if (st == -1)
		return -errno;
	if (WIFEXITED(st) && WEXITSTATUS(st) == 127)
		return -ENOENT;	/* the shell found no gnuplot */
	return WIFEXITED(st) && !WEXITSTATUS(st) ? 0 : -EIO;
}

int report(struct bench *b, const struct results *r)
{
	const struct opts *o = &b->o;
	int err, rc;
	if (o->json)
		print_json(b, r);
	else
		print_table(b, r);
	rc = fflush(stdout) ? TOOL_EXIT_RUNTIME : 0;
	if (o->csv && (err = write_csv(b, o->csv))) {
		fprintf(stderr, "kvbench: --csv %s: %s\n", o->csv, strerror(-err));
		rc = TOOL_EXIT_RUNTIME;
	}
	if (o->plot && (err = write_plot(b, r, o->plot))) {
		fprintf(stderr, "kvbench: --plot %s: %s\n", o->plot, err == -ENOENT ?
			"gnuplot not found" : err == -EIO ? "gnuplot failed" : strerror(-err));
		rc = TOOL_EXIT_RUNTIME;
	}
	if (!r->done) {
		fprintf(stderr, "kvbench: no request completed\n");
		rc = TOOL_EXIT_RUNTIME;
	}
	return rc;
}
