/*
 * bench_cuda.c — the CUDA backend's table (a benchmark, not a test): each
 * kernel's time and achieved bandwidth or FLOP/s against the device's
 * measured copy bandwidth and matrix rate, then decode tok/s at batch 1,
 * 16, 64 and 256 and prefill tok/s at 512 and 4096 tokens on the model.
 * Times are host clocks around R launches closed by a download (which
 * waits for the stream), medians of 5.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tests/bench_util.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/kvpool.h"
#include "daemon/engine/selfcheck.h"
#include "daemon/model/model.h"
#include "kernels/backend.h"


#define RUNS 5

static struct backend *G;
static double copy_bw, mma_rate;	/* bytes/s, FLOP/s */

static void *dalloc(size_t bytes)
{
	void *p;
	if (G->ops->buf_alloc(G, &p, bytes)) {
		fprintf(stderr, "bench_cuda: cannot allocate %zu bytes on the device\n", bytes);
		exit(1);
	}
	return p;
}

/* A device buffer of n random floats in [-1, 1). */
static float *drand(size_t n, uint64_t seed)
{
	float *h = malloc(n * sizeof(float));
	uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
	for (size_t i = 0; i < n; i++) {
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		h[i] = (float)((s >> 40) & 0xffffff) / 8388608.0f - 1.0f + 1e-7f;
	}
	float *d = dalloc(n * sizeof(float));
	G->ops->upload(G, d, h, n * sizeof(float));
	free(h);
	return d;
}

static void sync_dev(void)
{
	static float *one;
	float h;
	if (!one)
		one = dalloc(sizeof(float));
	if (G->ops->download(G, &h, one, sizeof(float)))
		exit(1);
}

typedef int (*op_fn)(void *ctx);

/* Median seconds of one call of f, over RUNS timings of reps calls. */
static double time_op(op_fn f, void *ctx, int reps)
{
	double v[RUNS];
	if (f(ctx)) {
		fprintf(stderr, "bench_cuda: operation failed\n");
		exit(1);
	}
	sync_dev();
	for (int r = 0; r < RUNS; r++) {
		double t0 = now_s();
		for (int i = 0; i < reps; i++)
			f(ctx);
		sync_dev();
		v[r] = (now_s() - t0) / reps;
	}
	return median(v, RUNS);
}

static void row_bw(const char *name, double s, double bytes)
{
	double bw = bytes / s;
	printf("| %-40s | %9.1f | %9.1f GB/s | %5.1f %% of copy |\n", name, s * 1e6, bw / 1e9,
	       copy_bw > 0 ? 100 * bw / copy_bw : 0.0);
}

static void row_flops(const char *name, double s, double flop)
{
	double r = flop / s;
	printf("| %-40s | %9.1f | %9.1f TFLOP/s | %5.1f %% of GEMM |\n", name, s * 1e6, r / 1e12,
	       mma_rate > 0 ? 100 * r / mma_rate : 0.0);
}

/* ---- operations under test ---- */

struct mm_ctx {
	float *y;
	const float *x;
	struct kb_weight w;
	uint32_t n;
	void *src, *dst;
	size_t bytes;
};

static int do_copy(void *c)
{
	struct mm_ctx *m = c;
	return G->ops->copy(G, m->dst, m->src, m->bytes);
}

static int do_matmul(void *c)
{
	struct mm_ctx *m = c;
	return G->ops->matmul(G, m->y, &m->w, m->x, m->n);
}

/* A weight of type with random bits and small f16 scales where it has any. */
static void make_weight(struct kb_weight *w, uint32_t type, uint32_t rows, uint32_t cols)
{
	uint32_t be, bb;
	kb_type_block(type, &be, &bb);
	size_t rb = (size_t)cols / be * bb, total = rb * rows;
	uint8_t *h = malloc(total);
	uint64_t s = type + 1;
	for (size_t i = 0; i < total; i++) {
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		h[i] = (uint8_t)(s >> 56);
	}
	/* f16 0x2000 ~ 0.0078: finite scales for every block format's scale fields */
	size_t nb = total / bb;
	for (size_t b = 0; b < nb; b++) {
		uint8_t *p = h + b * bb;
		if (type == KB_F16 || type == KB_F32 || type == KB_BF16)
			break;
		uint16_t sc = 0x2000;
		/* where d sits: last in Q6_K and Q3_K, after scales and quants in Q2_K, else first */
		size_t at = type == KB_Q6_K ? 208 : type == KB_Q3_K ? 108 : type == KB_Q2_K ? 80 : 0;
		memcpy(p + at, &sc, 2);
		if (type == KB_Q4_1 || type == KB_Q4_K || type == KB_Q5_1 || type == KB_Q5_K ||
		    type == KB_Q2_K)
			memcpy(p + at + 2, &sc, 2);	/* the min's scale */
	}
	if (type == KB_F16)
		for (size_t i = 0; i < total / 2; i++)
			((uint16_t *)h)[i] = (uint16_t)(0x2000 | (((uint16_t *)h)[i] & 0x83ff));
	*w = (struct kb_weight){ .type = type, .rows = rows, .cols = cols, .row_bytes = rb };
	G->ops->import(G, &w->data, h, total);
	free(h);
}

static void bench_device(void)
{
	/* Copy bandwidth: 1 GiB device to device (read + write). */
	struct mm_ctx c = { .bytes = 1u << 30 };
	c.src = dalloc(c.bytes);
	c.dst = dalloc(c.bytes);
	double s = time_op(do_copy, &c, 5);
	copy_bw = 2.0 * c.bytes / s;
	G->ops->buf_free(G, c.src);
	G->ops->buf_free(G, c.dst);
	/* Matrix rate: f16 GEMM 8192 x 8192 x 4096 through the backend's own path. */
	struct mm_ctx m = { .n = 4096 };
	make_weight(&m.w, KB_F16, 8192, 8192);
	m.x = drand((size_t)m.n * 8192, 1);
	m.y = dalloc((size_t)m.n * 8192 * sizeof(float));
	s = time_op(do_matmul, &m, 3);
	mma_rate = 2.0 * 8192 * 8192 * m.n / s;
	printf("device copy bandwidth %.1f GB/s, f16 GEMM (with f32 -> f16 of x) %.1f TFLOP/s\n\n",
	       copy_bw / 1e9, mma_rate / 1e12);
	G->ops->unimport(G, m.w.data);
	G->ops->buf_free(G, (void *)m.x);
	G->ops->buf_free(G, m.y);
}

static void bench_matmuls(void)
{
	static const struct { uint32_t type; const char *name; } t[] = {
		{ KB_Q4_1, "q4_1" }, { KB_Q8_0, "q8_0" }, { KB_Q4_K, "q4_k" }, { KB_Q6_K, "q6_k" },
		{ KB_F16, "f16" }, { KB_Q5_0, "q5_0" }, { KB_Q5_1, "q5_1" }, { KB_Q5_K, "q5_k" },
		{ KB_Q3_K, "q3_k" }, { KB_Q2_K, "q2_k" }, { KB_IQ4_NL, "iq4_nl" },
		{ KB_IQ4_XS, "iq4_xs" },
	};
	const uint32_t rows = 16384, cols = 4096;
	struct mm_ctx m;
	m.x = drand(512 * (size_t)cols, 2);
	m.y = dalloc(512 * (size_t)rows * sizeof(float));
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		char name[64];
		if (kb_type_block(t[i].type, NULL, NULL)) {
			printf("| %-40s | %9s | %-17s | %-16s |\n", t[i].name, "-", "not in the type table", "");
			continue;
		}
		make_weight(&m.w, t[i].type, rows, cols);
		m.n = 1;
		snprintf(name, sizeof(name), "mat-vec %s %ux%u, 1 row", t[i].name, rows, cols);
		row_bw(name, time_op(do_matmul, &m, 20), (double)rows * m.w.row_bytes);
		m.n = 16;
		snprintf(name, sizeof(name), "mat-vec %s %ux%u, 16 rows", t[i].name, rows, cols);
		row_bw(name, time_op(do_matmul, &m, 20), (double)rows * m.w.row_bytes);
		m.n = 512;
		snprintf(name, sizeof(name), "dequant+GEMM %s, 512 rows", t[i].name);
		row_flops(name, time_op(do_matmul, &m, 5), 2.0 * rows * cols * m.n);
		G->ops->unimport(G, m.w.data);
	}
	G->ops->buf_free(G, (void *)m.x);
	G->ops->buf_free(G, m.y);
}

struct row_ctx {
	float *x, *y, *o, *g;
	float *ff;	/* (64,) frequency factors, 1 .. 8 like Llama 3's */
	uint32_t *pos;
	uint32_t n, dim;
};

static int do_rmsnorm(void *c)
{
	struct row_ctx *r = c;
	return G->ops->rmsnorm(G, r->o, r->x, r->g, r->n, r->dim, 1e-5f);
}

static int do_add_rmsnorm(void *c)
{
	struct row_ctx *r = c;
	return G->ops->add_rmsnorm(G, r->o, r->x, r->y, r->g, r->n, r->dim, 1e-5f);
}

static int do_swiglu(void *c)
{
	struct row_ctx *r = c;
	return G->ops->swiglu(G, r->o, r->x, r->y, r->n, r->dim);
}

static int do_rope(void *c)
{
	struct row_ctx *r = c;
	return G->ops->rope(G, r->x, r->pos, r->n, r->dim / 128, 128, &KB_ROPE_PLAIN(128, 500000.0f, 0));
}

static int do_rope_yarn(void *c)
{
	struct row_ctx *r = c;
	struct kb_rope rp = KB_ROPE_PLAIN(128, 500000.0f, 0);
	rp.freq_factors = r->ff;
	rp.freq_scale = 0.25f;
	rp.ext_factor = 1.0f;
	rp.corr_lo = 20.0f;
	rp.corr_hi = 45.0f;
	return G->ops->rope(G, r->x, r->pos, r->n, r->dim / 128, 128, &rp);
}

static int do_geglu(void *c)
{
	struct row_ctx *r = c;
	return G->ops->geglu(G, r->o, r->x, r->y, r->n, r->dim);
}

static int do_add_bias(void *c)
{
	struct row_ctx *r = c;
	return G->ops->add_bias(G, r->x, r->g, r->n, r->dim);
}

static int do_softcap(void *c)
{
	struct row_ctx *r = c;
	return G->ops->softcap(G, r->x, 30.0f, r->n, r->dim);
}

static int do_argmax(void *c)
{
	struct row_ctx *r = c;
	uint32_t ids[256];
	return G->ops->argmax(G, ids, r->x, r->n, r->dim);
}

static void bench_rows(void)
{
	struct row_ctx r = { .n = 256, .dim = 8192 };
	size_t nd = (size_t)r.n * r.dim;
	uint32_t pos[256];
	for (uint32_t i = 0; i < r.n; i++)
		pos[i] = 1000 + i;
	r.x = drand(nd, 3);
	r.y = drand(nd, 4);
	r.o = dalloc(nd * sizeof(float));
	r.g = drand(r.dim, 5);
	r.pos = dalloc(sizeof(pos));
	float ff[64];
	for (int i = 0; i < 64; i++)
		ff[i] = 1.0f + 7.0f * (float)i / 63.0f;
	r.ff = dalloc(sizeof(ff));
	G->ops->upload(G, r.ff, ff, sizeof(ff));
	G->ops->upload(G, r.pos, pos, sizeof(pos));
	row_bw("rmsnorm 256 x 8192", time_op(do_rmsnorm, &r, 50), 2.0 * nd * 4);
	row_bw("add + rmsnorm 256 x 8192", time_op(do_add_rmsnorm, &r, 50), 4.0 * nd * 4);
	row_bw("swiglu 256 x 8192", time_op(do_swiglu, &r, 50), 3.0 * nd * 4);
	row_bw("rope 256 x 64 heads x 128", time_op(do_rope, &r, 50), 2.0 * nd * 4);
	row_bw("rope yarn + factors, same shape", time_op(do_rope_yarn, &r, 50), 2.0 * nd * 4);
	row_bw("geglu 256 x 8192", time_op(do_geglu, &r, 50), 3.0 * nd * 4);
	row_bw("add_bias 256 x 8192", time_op(do_add_bias, &r, 50), 2.0 * nd * 4);
	row_bw("softcap 256 x 8192", time_op(do_softcap, &r, 50), 2.0 * nd * 4);
	r.dim = 49152;
	G->ops->buf_free(G, r.x);
	r.x = drand((size_t)r.n * r.dim, 6);
	row_bw("argmax 256 x 49152 (ids to host)", time_op(do_argmax, &r, 20),
	       (double)r.n * r.dim * 4);
	G->ops->buf_free(G, r.x);
	G->ops->buf_free(G, r.y);
	G->ops->buf_free(G, r.o);
	G->ops->buf_free(G, r.g);
	G->ops->buf_free(G, r.pos);
	G->ops->buf_free(G, r.ff);
}

struct att_ctx {
	float *out, *q, *k, *v;
	uint32_t *pos;
	uint32_t n, kv_dim;
	struct kb_kv_rows kv;
	struct kb_attn_shape sh;
};

static int do_attention(void *c)
{
	struct att_ctx *a = c;
	return G->ops->attention_rows(G, a->out, a->q, &a->kv, a->pos, a->n, &a->sh);
}

static int do_write_kv(void *c)
{
	struct att_ctx *a = c;
	return G->ops->write_kv_rows(G, &a->kv, a->pos, a->n, a->kv_dim, a->k, a->v);
}

/*
 * n rows on one layer of a pool (SmolLM2 heads: 9 over 3, head_dim 64, f16)
 * at position ctx - 1 each (decode), or one sequence's ctx rows (prefill).
 * Every sequence's blocks are scattered over the pool.
 */
static void att_setup(struct att_ctx *a, uint32_t n_seqs, uint32_t ctx, int prefill)
{
	const uint32_t bt = 16, kv_dim = 192, nblk = (ctx + bt - 1) / bt;
	const size_t row = kv_dim * 2, bb = 2 * bt * row, pool_blocks = (size_t)n_seqs * nblk;
	const uint32_t n = prefill ? ctx : n_seqs;
	uint32_t *tables = malloc(pool_blocks * 4), *h = malloc(5 * (size_t)n * 4);
	uint32_t *pos = h, *off = h + n, *len = h + 2 * n, *tiles = h + 3 * n, n_tiles = 0;
	for (size_t i = 0; i < pool_blocks; i++)
		tables[i] = (uint32_t)i;
	uint64_t s = 99;
	for (size_t i = pool_blocks - 1; i > 0; i--) {
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		size_t j = (s >> 33) % (i + 1);
		uint32_t t = tables[i];
		tables[i] = tables[j];
		tables[j] = t;
	}
	for (uint32_t r = 0; r < n; r++) {
		pos[r] = prefill ? r : ctx - 1;
		off[r] = prefill ? 0 : r * nblk;
		len[r] = nblk;
		if (!prefill || r % KB_TILE_ROWS == 0) {
			tiles[2 * n_tiles] = r;
			tiles[2 * n_tiles + 1] = prefill ? (n - r < KB_TILE_ROWS ? n - r : KB_TILE_ROWS) : 1;
			n_tiles++;
		}
	}
	/* K/V contents: f16 values of magnitude [0.5, 1), copied over the pool from 8 MiB. */
	uint8_t *base = dalloc(pool_blocks * bb);
	size_t fill = 8u << 20;
	uint16_t *hf = malloc(fill);
	for (size_t i = 0; i < fill / 2; i++) {
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		hf[i] = (uint16_t)(((s >> 48) & 0x83ff) | 0x3800);
	}
	void *src = dalloc(fill);
	G->ops->upload(G, src, hf, fill);
	for (size_t o = 0; o < pool_blocks * bb; o += fill)
		G->ops->copy(G, base + o, src, pool_blocks * bb - o < fill ? pool_blocks * bb - o : fill);
	G->ops->buf_free(G, src);
	free(hf);
	uint32_t *d = dalloc(5 * (size_t)n * 4), *dt = dalloc(pool_blocks * 4);
	G->ops->upload(G, d, h, 5 * (size_t)n * 4);
	G->ops->upload(G, dt, tables, pool_blocks * 4);
	a->n = n;
	a->kv_dim = kv_dim;
	a->pos = d;
	a->kv = (struct kb_kv_rows){
		.geo = { .base = base, .block_tokens = bt, .block_bytes = bb, .k_off = 0,
			 .v_off = bt * row, .row_bytes = row, .type = KB_F16 },
		.tables = dt, .tab_off = d + n, .tab_len = d + 2 * n, .tiles = d + 3 * n,
		.h_tab_off = off, .h_tab_len = len, .h_tiles = tiles, .h_pos = pos, .n_tiles = n_tiles,
	};
	a->sh = (struct kb_attn_shape){ .n_heads = 9, .n_kv_heads = 3, .head_dim = 64,
					.scale = 0.125f };
	a->q = drand((size_t)n * 9 * 64, 7);
	a->out = dalloc((size_t)n * 9 * 64 * sizeof(float));
	a->k = drand((size_t)n * kv_dim, 8);
	a->v = drand((size_t)n * kv_dim, 9);
	free(tables);
}

static void att_free(struct att_ctx *a)
{
	free((void *)a->kv.h_pos);
	G->ops->buf_free(G, a->kv.geo.base);
	G->ops->buf_free(G, (void *)a->kv.tables);
	G->ops->buf_free(G, a->pos);
	G->ops->buf_free(G, a->q);
	G->ops->buf_free(G, a->out);
	G->ops->buf_free(G, a->k);
	G->ops->buf_free(G, a->v);
}

static void bench_attention(void)
{
	struct att_ctx a;
	att_setup(&a, 32, 32768, 0);
	/* K and V of 3 heads x 64 dims in f16, every position of every sequence */
	double bytes = 32.0 * 32768 * 2 * 192 * 2;
	double s = time_op(do_attention, &a, 10);
	row_bw("paged attention decode, 32 x 32k (tgt 60%)", s, bytes);
	/* A 4096 window reads an eighth of the context (bytes counted: the window's). */
	a.sh.window = 4096;
	row_bw("  the same, window 4096", time_op(do_attention, &a, 10), bytes / 8);
	a.sh.window = 0;
	a.sh.softcap = 50.0f;
	row_bw("  the same, softcap 50", time_op(do_attention, &a, 10), bytes);
	a.sh.softcap = 0.0f;
	att_free(&a);
	att_setup(&a, 256, 1024, 0);
	row_bw("paged attention decode, 256 x 1k", time_op(do_attention, &a, 20),
	       256.0 * 1024 * 2 * 192 * 2);
	row_bw("write_kv 256 rows (f32 in, f16 out)", time_op(do_write_kv, &a, 50),
	       256.0 * 192 * 2 * (4 + 2));
	att_free(&a);
	att_setup(&a, 1, 4096, 1);
	/* QK^T and PV over the causal half: 2 x 2 x heads x hd x n(n+1)/2 */
	row_flops("prefill attention, 4096 causal rows", time_op(do_attention, &a, 3),
		  4.0 * 9 * 64 * (4096.0 * 4097 / 2));
	att_free(&a);
}

/* ---- the model through the engine ---- */

static void rand_ids(uint32_t *ids, uint32_t n, uint32_t vocab, uint64_t seed)
{
	uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
	for (uint32_t i = 0; i < n; i++) {
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		ids[i] = (uint32_t)((s >> 33) % vocab);
	}
}

#define MAX_ROWS 4096
#define DEC_PROMPT 64
#define DEC_STEPS 64

/*
 * Figures of a model whose output is wrong are no figures: the device is
 * checked against the CPU on the model first (kvd's own check), and the
 * model's table is printed only when it passes.
 */
static int model_checked(struct model *m)
{
	struct backend *cpu;
	struct selfcheck_report r;
	char why[768];
	if (backend_cpu_create(&cpu, 0))
		return 0;
	int rc = selfcheck_run(m, G, cpu, KB_F16, &r, why, sizeof(why));
	cpu->ops->destroy(cpu);
	if (rc) {
		printf("bench_cuda: NO MODEL FIGURES: the device's output on this model is wrong: %s\n",
		       why);
		return 0;
	}
	printf("checked against the CPU: layer 0 closest %s at %.2g of its bound; %u distributions, KLD mean %.2g, max %.2g\n",
	       r.worst_op, r.worst_err, r.positions, r.mean_kld, r.max_kld);
	return 1;
}

static int bench_model(const char *mode)
{
	static int checked;
	struct model *m;
	struct kvpool *pool;
	struct engine *e;
	if (!(m = bench_load_model("bench_cuda")))
		return 1;
	if (!checked && !(checked = model_checked(m))) {
		model_free(m);
		return 1;
	}
	struct kvpool_config pc = { .n_blocks = 3072, .block_tokens = 16,
				    .n_layers = m->hp.n_layers, .kv_dim = m->hp.kv_dim,
				    .kv_type = KB_F16 };
	if (kvpool_create_on(&pool, &pc, G) || engine_create(&e, m, G, pool, MAX_ROWS)) {
		fprintf(stderr, "bench_cuda: cannot set up the engine on the device\n");
		return 1;
	}
	struct engine_row *rows = calloc(MAX_ROWS, sizeof(*rows));
	struct engine_seq *seqs = calloc(256, sizeof(*seqs));
	uint32_t *ids = malloc(MAX_ROWS * sizeof(uint32_t)), out[256];
	printf("| %-34s | %12s | %8s |\n", mode, "tok/s", "target");
	printf("|------------------------------------|--------------|----------|\n");
	static const uint32_t plen[] = { 512, 4096 };
	for (int k = 0; k < 2; k++) {
		double v[3];
		rand_ids(ids, plen[k], m->hp.vocab, 11 + k);
		for (int r = 0; r < 3; r++) {
			engine_seq_init(e, &seqs[0], 0);
			for (uint32_t i = 0; i < plen[k]; i++)
				rows[i] = (struct engine_row){ &seqs[0], i, ids[i], i + 1 == plen[k] };
			double t0 = now_s();
			if (engine_forward(e, rows, plen[k], NULL) || engine_argmax(e, out))
				return 1;
			v[r] = plen[k] / (now_s() - t0);
			engine_seq_release(e, &seqs[0]);
		}
		char name[64];
		snprintf(name, sizeof(name), "prefill %u tokens", plen[k]);
		printf("| %-34s | %12.0f | %8s |\n", name, median(v, 3), "");
	}
	static const uint32_t batch[] = { 1, 16, 64, 256 };
	for (int k = 0; k < 4; k++) {
		uint32_t B = batch[k], n = 0;
		for (uint32_t b = 0; b < B; b++) {
			engine_seq_init(e, &seqs[b], 0);
			rand_ids(ids + n, DEC_PROMPT, m->hp.vocab, 100 + b);
			for (uint32_t i = 0; i < DEC_PROMPT; i++, n++)
				rows[n] = (struct engine_row){ &seqs[b], i, ids[n], i + 1 == DEC_PROMPT };
			if (n + DEC_PROMPT > MAX_ROWS || b + 1 == B) {
				if (engine_forward(e, rows, n, NULL))
					return 1;
				n = 0;
			}
		}
		for (uint32_t b = 0; b < B; b++)
			out[b] = ids[b % DEC_PROMPT];
		double t0 = now_s();
		for (uint32_t t = 0; t < DEC_STEPS; t++) {
			for (uint32_t b = 0; b < B; b++)
				rows[b] = (struct engine_row){ &seqs[b], DEC_PROMPT + t, out[b], 1 };
			/* Only the ids come back: the logits stay on the device. */
			if (engine_forward(e, rows, B, NULL) || engine_argmax(e, out))
				return 1;
		}
		double tps = (double)B * DEC_STEPS / (now_s() - t0);
		char name[64];
		snprintf(name, sizeof(name), "decode batch %u (ctx %u..%u)", B, DEC_PROMPT,
			 DEC_PROMPT + DEC_STEPS);
		printf("| %-34s | %12.0f | %8s |\n", name, tps, B == 256 ? ">= 20000" : "");
		for (uint32_t b = 0; b < B; b++)
			engine_seq_release(e, &seqs[b]);
	}
	free(rows);
	free(seqs);
	free(ids);
	engine_destroy(e);
	kvpool_destroy(pool);
	model_free(m);
	return 0;
}

int main(void)
{
	char why[256];
	if (backend_cuda_create(&G, 0, why, sizeof(why))) {
		printf("bench_cuda: no CUDA device (%s): nothing to measure\n", why);
		return 0;
	}
	printf("device: %s\n", why);
	bench_device();
	printf("| %-40s | %9s | %-17s | %-16s |\n", "kernel", "time (us)", "achieved", "of device peak");
	printf("|------------------------------------------|-----------|-------------------|------------------|\n");
	bench_matmuls();
	bench_rows();
	bench_attention();
	printf("\n");
	int rc = bench_model("model, CUDA graphs on");
	G->ops->destroy(G);
	/* The same without recording steps: graphs must earn their place. */
	setenv("KVD_CUDA_GRAPHS", "0", 1);
	if (!rc && !backend_cuda_create(&G, 0, why, sizeof(why))) {
		printf("\n");
		rc = bench_model("model, CUDA graphs off");
		G->ops->destroy(G);
	}
	return rc;
}
