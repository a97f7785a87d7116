/* test_devmem.c — the engine and KV pool through a device-memory backend (simulated on the CPU): same bits as the CPU, every byte moved explicitly. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine/engine.h"
#include "daemon/engine/kvpool.h"
#include "daemon/model/model.h"
#include "kernels/backend.h"
#include "tests/devsim.h"
#include "tests/lib/fixture.h"
#include "tests/lib/rng.h"

#define MAX_ROWS 64
#define N_BLOCKS 64

static struct fixture FX;
static struct model *M;	/* FX.m once loaded */
static char load_err[256];

struct side {
	struct backend *be;
	struct kvpool *pool;
	struct engine *e;
};

static void side_open(struct side *s, int dev)
{
	struct kvpool_config pc = { .n_blocks = N_BLOCKS, .block_tokens = 16,
				    .n_layers = M->hp.n_layers, .kv_dim = M->hp.kv_dim,
				    .kv_type = KB_F16 };
	assert_int_equal(dev ? devsim_create(&s->be, 2) : backend_cpu_create(&s->be, 2), 0);
	assert_int_equal(kvpool_create_on(&s->pool, &pc, s->be), 0);
	assert_true(dev ? kvpool_backend(s->pool) == s->be : kvpool_backend(s->pool) == NULL);
	assert_int_equal(engine_create(&s->e, M, s->be, s->pool, MAX_ROWS), 0);
}

static void side_close(struct side *s)
{
	engine_destroy(s->e);
	kvpool_destroy(s->pool);
	s->be->ops->destroy(s->be);
}

static void need_model(void)
{
	if (!M)
		fail_msg("%s (or set KVD_MODEL)", load_err);
}

static void rand_tokens(uint32_t *ids, uint32_t n, uint64_t seed)
{
	rng_tokens(ids, n, M->hp.vocab, seed);
}

/* The same batch through both sides: logits identical, and argmax on the device agrees. */
static void step_both(struct side *c, struct side *d, struct engine_row *rc, struct engine_row *rd,
		      uint32_t n)
{
	uint32_t nw = 0, v = M->hp.vocab;
	for (uint32_t i = 0; i < n; i++)
		nw += rc[i].want_logits != 0;
	float *lc = malloc((size_t)(nw ? nw : 1) * v * sizeof(float));
	float *ld = malloc((size_t)(nw ? nw : 1) * v * sizeof(float));
	uint32_t ids[MAX_ROWS], want[MAX_ROWS];
	assert_true(lc && ld);
	assert_int_equal(engine_forward(c->e, rc, n, lc), 0);
	assert_int_equal(engine_forward(d->e, rd, n, ld), 0);
	if (memcmp(lc, ld, (size_t)nw * v * sizeof(float)))
		fail_msg("logits through device buffers differ from the CPU's");
	if (nw) {
		assert_int_equal(engine_argmax(d->e, ids), 0);
		assert_int_equal(c->be->ops->argmax(c->be, want, lc, nw, v), 0);
		assert_memory_equal(ids, want, nw * sizeof(uint32_t));
	}
	free(lc);
	free(ld);
}

static void run_script(int fail_record)
{
	need_model();
	struct side c, d;
	side_open(&c, 0);
	side_open(&d, 1);
	DS(d.be)->fail_record = fail_record;
	struct engine_seq sc[3], sd[3];
	struct engine_row rc[MAX_ROWS], rd[MAX_ROWS];
	uint32_t ids[120];
	rand_tokens(ids, 120, 5);
	for (int i = 0; i < 3; i++) {
		engine_seq_init(c.e, &sc[i], 0);
		engine_seq_init(d.e, &sd[i], 0);
	}
	/* A 40-token prefill of sequence 0, every row's logits. */
	for (uint32_t i = 0; i < 40; i++) {
		rc[i] = (struct engine_row){ &sc[0], i, ids[i], 1 };
		rd[i] = (struct engine_row){ &sd[0], i, ids[i], 1 };
	}
	step_both(&c, &d, rc, rd, 40);
	/* Decode steps of one row: the same shape again and again (recorded on a device). */
	for (uint32_t p = 40; p < 46; p++) {
		rc[0] = (struct engine_row){ &sc[0], p, ids[p], 1 };
		rd[0] = (struct engine_row){ &sd[0], p, ids[p], 1 };
		step_both(&c, &d, rc, rd, 1);
	}
	/* A mixed batch: sequence 1's prompt (logits of its last row) and decodes of 0 and 2. */
	uint32_t n = 0;
	rc[n] = (struct engine_row){ &sc[0], 46, ids[46], 1 };
	rd[n++] = (struct engine_row){ &sd[0], 46, ids[46], 1 };
	for (uint32_t i = 0; i < 20; i++, n++) {
		rc[n] = (struct engine_row){ &sc[1], i, ids[60 + i], i == 19 };
		rd[n] = (struct engine_row){ &sd[1], i, ids[60 + i], i == 19 };
	}
	rc[n] = (struct engine_row){ &sc[2], 0, ids[100], 1 };
	rd[n++] = (struct engine_row){ &sd[2], 0, ids[100], 1 };
	step_both(&c, &d, rc, rd, n);
	/* A fork shares sequence 0's blocks; its first write copies the partial block (on the device). */
	engine_seq_release(c.e, &sc[2]);
	engine_seq_release(d.e, &sd[2]);
	engine_seq_init(c.e, &sc[2], 0);
	engine_seq_init(d.e, &sd[2], 0);
	assert_int_equal(kvseq_fork(c.pool, &sc[2].kv, &sc[0].kv), 0);
	assert_int_equal(kvseq_fork(d.pool, &sd[2].kv, &sd[0].kv), 0);
	unsigned copies = DS(d.be)->copies;
	rc[0] = (struct engine_row){ &sc[0], 47, ids[47], 1 };
	rd[0] = (struct engine_row){ &sd[0], 47, ids[47], 1 };
	rc[1] = (struct engine_row){ &sc[2], 47, ids[110], 1 };
	rd[1] = (struct engine_row){ &sd[2], 47, ids[110], 1 };
	step_both(&c, &d, rc, rd, 2);
	assert_true(DS(d.be)->copies > copies);
	struct kvpool_stats st;
	kvpool_get_stats(d.pool, &st);
	assert_true(st.cow_copies >= 1);

	struct devsim *ds = DS(d.be);
	printf("devsim: %u uploads, %u downloads, %u copies, %u imports, %u steps recorded, %u reruns\n",
	       ds->uploads, ds->downloads, ds->copies, ds->imports, ds->records, ds->reruns);
	assert_true(ds->imports >= 9 * M->hp.n_layers);
	assert_true(ds->records >= 5);
	if (fail_record)
		assert_int_equal(ds->reruns, ds->records);
	else
		assert_int_equal(ds->reruns, 0);
	for (int i = 0; i < 3; i++) {
		engine_seq_release(c.e, &sc[i]);
		engine_seq_release(d.e, &sd[i]);
	}
	engine_destroy(d.e);
	kvpool_destroy(d.pool);
	assert_int_equal(ds->live_bufs, 0);	/* every buffer, import and the pool given back */
	d.e = NULL;
	d.pool = NULL;
	d.be->ops->destroy(d.be);
	side_close(&c);
}

static void test_same_bits(void **state)
{
	(void)state;
	run_script(0);
}

/* A step whose recording fails (-EAGAIN) is run again plainly, with the same results. */
static void test_record_fails(void **state)
{
	(void)state;
	run_script(1);
}

/* Logits may stay on the device: engine_argmax alone brings back the ids. */
static void test_ids_only(void **state)
{
	(void)state;
	need_model();
	struct side c, d;
	side_open(&c, 0);
	side_open(&d, 1);
	struct engine_seq sc, sd;
	engine_seq_init(c.e, &sc, 0);
	engine_seq_init(d.e, &sd, 0);
	uint32_t ids[8], id_c, id_d;
	rand_tokens(ids, 8, 9);
	float *lc = malloc(M->hp.vocab * sizeof(float));
	assert_non_null(lc);
	for (uint32_t p = 0; p < 8; p++) {
		struct engine_row rc = { &sc, p, ids[p], 1 }, rd = { &sd, p, ids[p], 1 };
		assert_int_equal(engine_forward(c.e, &rc, 1, lc), 0);
		unsigned dl = DS(d.be)->downloads;
		assert_int_equal(engine_forward(d.e, &rd, 1, NULL), 0);
		assert_int_equal(DS(d.be)->downloads, dl);	/* no logits came back */
		assert_int_equal(engine_argmax(c.e, &id_c), 0);
		assert_int_equal(engine_argmax(d.e, &id_d), 0);
		assert_int_equal(id_c, id_d);
	}
	/* A step without logits leaves nothing to take the argmax of. */
	struct engine_row rd = { &sd, 8, ids[0], 0 };
	assert_int_equal(engine_forward(d.e, &rd, 1, NULL), 0);
	assert_int_equal(engine_argmax(d.e, &id_d), -ENODATA);
	free(lc);
	engine_seq_release(c.e, &sc);
	engine_seq_release(d.e, &sd);
	side_close(&c);
	side_close(&d);
}

/* The blocks must live where the backend computes. */
static void test_pool_mismatch(void **state)
{
	(void)state;
	need_model();
	struct kvpool_config pc = { .n_blocks = 4, .block_tokens = 16, .n_layers = M->hp.n_layers,
				    .kv_dim = M->hp.kv_dim, .kv_type = KB_F16 };
	struct backend *dev, *cpu;
	struct kvpool *host_pool, *dev_pool;
	struct engine *e;
	assert_int_equal(devsim_create(&dev, 1), 0);
	assert_int_equal(backend_cpu_create(&cpu, 1), 0);
	assert_int_equal(kvpool_create(&host_pool, &pc), 0);
	assert_int_equal(kvpool_create_on(&dev_pool, &pc, dev), 0);
	assert_int_equal(engine_create(&e, M, dev, host_pool, 8), -EINVAL);
	assert_int_equal(engine_create(&e, M, cpu, dev_pool, 8), -EINVAL);
	/* kvpool_create_on with a host backend is a host pool. */
	struct kvpool *p2;
	assert_int_equal(kvpool_create_on(&p2, &pc, cpu), 0);
	assert_null(kvpool_backend(p2));
	kvpool_destroy(p2);
	kvpool_destroy(host_pool);
	kvpool_destroy(dev_pool);
	assert_int_equal(DS(dev)->live_bufs, 0);
	dev->ops->destroy(dev);
	cpu->ops->destroy(cpu);
}

static int setup(void **state)
{
	(void)state;
	if (fixture_load(&FX, load_err, sizeof(load_err)))
		fixture_close(&FX);
	M = FX.m;
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	fixture_close(&FX);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_same_bits),
		cmocka_unit_test(test_record_fails),
		cmocka_unit_test(test_ids_only),
		cmocka_unit_test(test_pool_mismatch),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
