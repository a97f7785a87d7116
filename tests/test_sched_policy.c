/* test_sched_policy.c — the scheduler's policy over hand-made connections, sessions and requests: preemption order, fairness, quotas; no daemon. */
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
#include "daemon/engine/sampler.h"
#include "daemon/log.h"
#include "daemon/model/model.h"
#include "daemon/serve/sched.h"
#include "daemon/serve/server.h"
#include "tests/lib/fixture.h"

/*
 * A struct server made by hand around the fixture's engine and a pool of
 * a few blocks, connections that are only records (no socket; a region
 * only where a test decodes, since a sampled token is written into the
 * client's arena), requests queued on slots the way admit() queues them.
 * sched_plan() then shows what the policy decides: which requests got the
 * step's rows and which sequences gave up their blocks; sched_run() makes
 * the step happen, so the next plan starts from real state. Blocks are 16
 * tokens, so one prefill row count below is one block per 16 rows.
 */

#define BT FIXTURE_BLOCK_TOKENS

static struct fixture FX;
static char load_err[256];

struct pol {
	struct server srv;
	struct sched *sc;
};

static struct pol P;

/* A fresh server over a pool of n_blocks and a step of max_rows; kv_quota 0: none. */
static void pol_open(uint32_t n_blocks, uint32_t max_rows, uint32_t kv_quota)
{
	if (!FX.m) {
		print_message("skipped: %s\n", load_err);
		skip();
	}
	assert_int_equal(fixture_pool(&FX, 1, n_blocks), 0);
	assert_int_equal(fixture_engine(&FX, max_rows), 0);
	memset(&P, 0, sizeof(P));
	struct server *srv = &P.srv;
	srv->cfg = (struct server_config){ .max_batch_rows = max_rows, .max_tokens = 4096,
					   .max_inflight = 64, .max_uid_inflight = 256,
					   .kv_quota = kv_quota, .no_prefix_cache = 1 };
	srv->m = FX.m;
	srv->tok = FX.tok;
	srv->be = FX.be;
	srv->eng = FX.eng;
	srv->listen_fd = srv->signal_fd = srv->reap_fd = srv->vocab_fd = srv->spare_fd = -1;
	pthread_mutex_init(&srv->lock, NULL);
	pthread_cond_init(&srv->work, NULL);
	engine_pool_stats(srv->eng, &srv->pool_stats);
	assert_int_equal(sched_create(&P.sc, srv), 0);
}

static int pol_close(void **state)
{
	(void)state;
	struct server *srv = &P.srv;
	if (!P.sc)
		return 0;
	for (struct conn *c = srv->conns, *next; c; c = next) {
		next = c->next;
		for (uint32_t i = 0; i < SRV_MAX_SESSIONS; i++)
			if (c->sessions[i]) {
				release_session(srv, c, c->sessions[i], 0);
				session_free(c->sessions[i]);
			}
		region_destroy(&c->rg);
		free(c);
	}
	sched_destroy(P.sc);
	while (srv->uids) {
		struct uid_usage *u = srv->uids;
		srv->uids = u->next;
		free(u);
	}
	pthread_cond_destroy(&srv->work);
	pthread_mutex_destroy(&srv->lock);
	memset(&P, 0, sizeof(P));
	fixture_close_engine(&FX);
	return 0;
}

/* A client of uid with one session of n_slots, last in the server's list; region: it can take tokens. */
static struct conn *conn_add(uid_t uid, uint32_t n_slots, int region)
{
	struct server *srv = &P.srv;
	struct conn *c = calloc(1, sizeof(*c));
	assert_non_null(c);
	c->srv = srv;
	c->fd = -1;
	c->uid = uid;
	c->pid = 1000 + (pid_t)srv->n_conns;
	region_init(&c->rg);
	if (region)
		assert_int_equal(region_create(&c->rg, 8, 64, 64 << 10), 0);
	c->use = server_uid_get(srv, uid);
	assert_non_null(c->use);
	struct session *s = session_new(n_slots);
	assert_non_null(s);
	s->id = 0;
	c->sessions[0] = s;
	c->n_sessions = 1;
	c->next_session = 1;
	c->use->sessions++;
	srv->n_sessions++;
	struct conn **tail = &srv->conns;
	while (*tail)
		tail = &(*tail)->next;
	*tail = c;
	srv->n_conns++;
	return c;
}

/*
 * Queue on slot of c's session what admit() would queue for an SQE of
 * opcode with n_prompt ids of its own (seeded by salt) and max_out tokens
 * (EOS ignored, greedy), of priority prio.
 */
static struct request *req_add(struct conn *c, uint32_t slot, uint8_t opcode, uint32_t n_prompt,
			       uint32_t max_out, uint8_t prio, uint32_t salt)
{
	struct server *srv = &P.srv;
	struct session *s = c->sessions[0];
	assert_true(slot < s->n_slots);
	struct request *r = calloc(1, sizeof(*r));
	assert_non_null(r);
	r->sqe = (struct kvd_sqe){ .opcode = opcode, .flags = KVD_SQE_IGNORE_EOS, .priority = prio,
				   .session_id = s->id, .slot = (uint16_t)slot,
				   .user_data = 100 + salt, .n_tokens = n_prompt,
				   .max_tokens = max_out };
	r->c = c;
	r->s = s;
	r->sl = &s->slots[slot];
	r->max_out = max_out;
	r->want_row = -1;
	r->n_prompt = n_prompt;
	if (n_prompt) {
		r->prompt = malloc(n_prompt * sizeof(uint32_t));
		assert_non_null(r->prompt);
		for (uint32_t i = 0; i < n_prompt; i++)
			r->prompt[i] = 300 + (salt * 131 + i * 7) % 5000;
	}
	if (max_out) {
		struct sampler_params sp;
		sampler_params_default(&sp);
		assert_int_equal(sampler_create(&r->smp, &sp, srv->m->hp.vocab), 0);
	}
	r->id = ++srv->next_req_id;
	release_enqueue(r);
	return r;
}

static uint32_t plan(void)
{
	pthread_mutex_lock(&P.srv.lock);
	uint32_t n = sched_plan(P.sc);
	pthread_mutex_unlock(&P.srv.lock);
	return n;
}

static void run(void)
{
	pthread_mutex_lock(&P.srv.lock);
	sched_run(P.sc);
	pthread_mutex_unlock(&P.srv.lock);
}

static void step(void)
{
	plan();
	run();
}

/* Rows the planned step gives r; *first: the position of its first one. */
static uint32_t rows_of(const struct request *r, uint32_t *first)
{
	const struct engine_row *rows;
	struct request *const *reqs;
	uint32_t n = sched_rows(P.sc, &rows, &reqs), k = 0;
	for (uint32_t i = 0; i < n; i++)
		if (reqs[i] == r) {
			if (!k && first)
				*first = rows[i].pos;
			k++;
		}
	return k;
}

/* Index of r's first row in the planned step, or -1. */
static int first_row(const struct request *r)
{
	struct request *const *reqs;
	uint32_t n = sched_rows(P.sc, NULL, &reqs);
	for (uint32_t i = 0; i < n; i++)
		if (reqs[i] == r)
			return (int)i;
	return -1;
}

static uint32_t blocks(const struct slot *sl)
{
	return sl->seq.kv.n_blocks;
}

/* ---- (a) preemption order ---- */

/*
 * The pool is full with an idle sequence (its request done) and a running
 * background one: a new request takes the idle one's blocks, and the
 * running one keeps its own and its place.
 */
static void test_idle_preempted_before_running(void **state)
{
	(void)state;
	pol_open(4, 16, 0);
	struct conn *c = conn_add(1, 3, 0);
	struct request *idle = req_add(c, 0, KVD_OP_PREFILL, 2 * BT, 0, KVD_PRIO_INTERACTIVE, 1);
	struct slot *s_idle = idle->sl;
	step();
	step();
	assert_null(s_idle->head);	/* its PREFILL completed: an idle sequence */
	assert_int_equal(blocks(s_idle), 2);
	struct request *bg = req_add(c, 1, KVD_OP_GENERATE, 3 * BT, 4, KVD_PRIO_BACKGROUND, 2);
	step();
	step();
	assert_int_equal(bg->n_fed, 2 * BT);	/* running, mid-prefill */
	assert_int_equal(blocks(bg->sl), 2);
	assert_int_equal(P.srv.n_preemptions, 0);

	struct request *x = req_add(c, 2, KVD_OP_PREFILL, BT, 0, KVD_PRIO_INTERACTIVE, 3);
	plan();
	assert_int_equal(rows_of(x, NULL), BT);
	assert_int_equal(P.srv.n_preemptions, 1);
	assert_int_equal(blocks(s_idle), 0);
	assert_int_equal(s_idle->n_resume, 2 * BT);	/* its tokens wait for its next request */
	assert_int_equal(blocks(bg->sl), 2);
	assert_int_equal(bg->n_fed, 2 * BT);
	run();
}

/* Steps until slot sl has no request left (at most 64); its DECODE's tokens are then at arena 0. */
static void drain_slot(const struct slot *sl)
{
	for (int i = 0; i < 64 && sl->head; i++)
		step();
	assert_null(sl->head);
}

/*
 * A sequence preempted while idle after its PREFILL keeps the right to
 * DECODE (it used to complete -EINVAL, its logits gone): its tokens are
 * recomputed, the last one's logits with them, and the DECODE gives the
 * tokens it gives on a sequence nobody preempted.
 */
static void test_preempted_prefill_still_decodes(void **state)
{
	(void)state;
	uint32_t want[4], got[4];
	pol_open(4, 16, 0);
	struct conn *c = conn_add(1, 2, 1);
	struct request *a = req_add(c, 0, KVD_OP_PREFILL, 2 * BT, 0, KVD_PRIO_INTERACTIVE, 1);
	struct slot *sa = a->sl;
	drain_slot(sa);
	req_add(c, 0, KVD_OP_DECODE, 0, 4, KVD_PRIO_INTERACTIVE, 2);
	drain_slot(sa);
	memcpy(want, c->rg.arena, sizeof(want));
	pol_close(NULL);

	pol_open(4, 16, 0);
	c = conn_add(1, 2, 1);
	a = req_add(c, 0, KVD_OP_PREFILL, 2 * BT, 0, KVD_PRIO_INTERACTIVE, 1);
	sa = a->sl;
	drain_slot(sa);
	assert_true(sa->has_logits);
	/* Three blocks for slot 1: only by taking slot 0's two. */
	struct request *b = req_add(c, 1, KVD_OP_PREFILL, 3 * BT, 0, KVD_PRIO_INTERACTIVE, 3);
	drain_slot(b->sl);
	assert_int_equal(P.srv.n_preemptions, 1);
	assert_int_equal(blocks(sa), 0);
	assert_false(sa->has_logits);
	assert_int_equal(sa->n_resume, 2 * BT);
	memset(c->rg.arena, 0xff, sizeof(got));
	req_add(c, 0, KVD_OP_DECODE, 0, 4, KVD_PRIO_INTERACTIVE, 2);
	drain_slot(sa);
	memcpy(got, c->rg.arena, sizeof(got));
	assert_memory_equal(got, want, sizeof(want));
}

/*
 * Pool full with four mid-prefill requests, one block each: X (interactive,
 * oldest), B1 and B2 (background), I (interactive, newest). X's next block
 * comes from the newest background request B2, not from the newest request
 * I; I's from B1. The background requests then wait: neither can take a
 * block from an interactive request, though both interactive ones are
 * mid-prefill (their chunks want no logits).
 */
static void test_victim_is_newest_of_lowest_class(void **state)
{
	(void)state;
	pol_open(4, 4 * BT, 0);
	struct conn *cx = conn_add(1, 1, 0), *cb1 = conn_add(2, 1, 0), *cb2 = conn_add(3, 1, 0),
		    *ci = conn_add(4, 1, 0);
	struct request *x = req_add(cx, 0, KVD_OP_GENERATE, 4 * BT, 4, KVD_PRIO_INTERACTIVE, 1);
	struct request *b1 = req_add(cb1, 0, KVD_OP_GENERATE, 3 * BT, 4, KVD_PRIO_BACKGROUND, 2);
	struct request *b2 = req_add(cb2, 0, KVD_OP_GENERATE, 3 * BT, 4, KVD_PRIO_BACKGROUND, 3);
	struct request *i = req_add(ci, 0, KVD_OP_GENERATE, 3 * BT, 4, KVD_PRIO_INTERACTIVE, 4);
	/* Four clients share the step: one block's worth of rows each. */
	plan();
	assert_int_equal(rows_of(x, NULL), BT);
	assert_int_equal(rows_of(b1, NULL), BT);
	assert_int_equal(rows_of(b2, NULL), BT);
	assert_int_equal(rows_of(i, NULL), BT);
	run();
	assert_int_equal(P.srv.n_preemptions, 0);

	uint32_t pos = 0;
	plan();
	assert_int_equal(P.srv.n_preemptions, 2);
	assert_int_equal(blocks(b2->sl), 0);
	assert_int_equal(blocks(b1->sl), 0);
	assert_int_equal(b2->n_fed, 0);
	assert_int_equal(b1->n_fed, 0);
	/* The interactive requests went on where they were. */
	assert_int_equal(rows_of(x, &pos), BT);
	assert_int_equal(pos, BT);
	assert_int_equal(rows_of(i, &pos), BT);
	assert_int_equal(pos, BT);
	assert_int_equal(blocks(x->sl), 2);
	assert_int_equal(blocks(i->sl), 2);
	assert_int_equal(rows_of(b1, NULL), 0);
	assert_int_equal(rows_of(b2, NULL), 0);
	run();
}

/*
 * Two background requests, the pool full: the newer one's next block
 * cannot come from the older one (which ranks above it), so it waits; the
 * older one's can come from the newer.
 */
static void test_lower_rank_never_preempts_higher(void **state)
{
	(void)state;
	pol_open(2, 2 * BT, 0);
	struct conn *ca = conn_add(1, 1, 0), *cb = conn_add(2, 1, 0);
	struct request *old = req_add(ca, 0, KVD_OP_GENERATE, 3 * BT, 4, KVD_PRIO_BACKGROUND, 1);
	struct request *young = req_add(cb, 0, KVD_OP_GENERATE, 3 * BT, 4, KVD_PRIO_BACKGROUND, 2);
	step();
	assert_int_equal(blocks(old->sl), 1);
	assert_int_equal(blocks(young->sl), 1);
	plan();
	/* The older one goes first and takes the younger one's block. */
	assert_int_equal(P.srv.n_preemptions, 1);
	assert_int_equal(blocks(young->sl), 0);
	assert_int_equal(rows_of(old, NULL), BT);
	assert_int_equal(blocks(old->sl), 2);
	/* The younger one's turn: nothing below it to take from, so it waits (not refused). */
	assert_int_equal(rows_of(young, NULL), 0);
	assert_ptr_equal(young->sl->head, young);
	run();
	assert_int_equal(P.srv.n_preemptions, 1);
}

/* ---- (b) fairness ---- */

/* Two clients with long prompts: each gets half of the step's rows. */
static void test_clients_share_prefill_rows(void **state)
{
	(void)state;
	pol_open(32, 4 * BT, 0);
	struct conn *a = conn_add(1, 1, 0), *b = conn_add(2, 1, 0);
	struct request *ra = req_add(a, 0, KVD_OP_GENERATE, 8 * BT, 4, KVD_PRIO_INTERACTIVE, 1);
	struct request *rb = req_add(b, 0, KVD_OP_GENERATE, 8 * BT, 4, KVD_PRIO_INTERACTIVE, 2);
	assert_int_equal(plan(), 4 * BT);
	assert_int_equal(rows_of(ra, NULL), 2 * BT);
	assert_int_equal(rows_of(rb, NULL), 2 * BT);
	run();
	/* And again next step: the share is not a one-off. */
	plan();
	assert_int_equal(rows_of(ra, NULL), 2 * BT);
	assert_int_equal(rows_of(rb, NULL), 2 * BT);
	run();
}

/* One client's requests: first come, first served; the newer one gets what the older leaves. */
static void test_one_client_fcfs(void **state)
{
	(void)state;
	pol_open(32, 4 * BT, 0);
	struct conn *a = conn_add(1, 2, 1);	/* r1 finishes its prompt and samples a token */
	struct request *r1 = req_add(a, 0, KVD_OP_GENERATE, 5 * BT, 4, KVD_PRIO_INTERACTIVE, 1);
	struct request *r2 = req_add(a, 1, KVD_OP_GENERATE, 5 * BT, 4, KVD_PRIO_INTERACTIVE, 2);
	plan();
	assert_int_equal(rows_of(r1, NULL), 4 * BT);
	assert_int_equal(rows_of(r2, NULL), 0);
	run();
	plan();
	assert_int_equal(rows_of(r1, NULL), BT);	/* the rest of its prompt */
	assert_int_equal(rows_of(r2, NULL), 3 * BT);
	assert_true(first_row(r1) < first_row(r2));
	run();
}

/*
 * A decode goes before a prefill of its class, even an older one: with a
 * step of one block's rows, the decode's row is in and the prompt gets the
 * rest (not all of it and the decode nothing).
 */
static void test_decodes_before_prefills(void **state)
{
	(void)state;
	pol_open(32, BT, 0);
	struct conn *d = conn_add(1, 1, 1), *p = conn_add(2, 1, 0);
	struct slot *sd = req_add(d, 0, KVD_OP_PREFILL, BT, 0, KVD_PRIO_INTERACTIVE, 1)->sl;
	step();
	assert_null(sd->head);	/* the PREFILL completed (and is freed): its logits wait */
	assert_true(sd->has_logits);
	struct request *long_prompt = req_add(p, 0, KVD_OP_GENERATE, 4 * BT, 4, KVD_PRIO_INTERACTIVE, 2);
	struct request *dec = req_add(d, 0, KVD_OP_DECODE, 0, 4, KVD_PRIO_INTERACTIVE, 3);
	plan();
	assert_int_equal(dec->phase, REQ_DECODE);
	assert_int_equal(rows_of(dec, NULL), 1);
	assert_int_equal(first_row(dec), 0);
	assert_int_equal(rows_of(long_prompt, NULL), BT - 1);
	run();
	assert_int_equal(dec->n_out, 2);	/* one token from the prefill's logits, one from this step */
}

/* Interactive before background: an older background prompt waits for a step's rows. */
static void test_interactive_before_background(void **state)
{
	(void)state;
	pol_open(32, BT, 0);
	struct conn *a = conn_add(1, 1, 0), *b = conn_add(2, 1, 0);
	struct request *bg = req_add(a, 0, KVD_OP_GENERATE, 4 * BT, 4, KVD_PRIO_BACKGROUND, 1);
	struct request *in = req_add(b, 0, KVD_OP_GENERATE, 4 * BT, 4, KVD_PRIO_INTERACTIVE, 2);
	plan();
	assert_int_equal(rows_of(in, NULL), BT);
	assert_int_equal(rows_of(bg, NULL), 0);
	run();
}

/* ---- (c) per-uid KV quota ---- */

/*
 * Four mid-prefill requests of 2-block prompts (what a quota of three
 * blocks admits) on four clients: R1, R2 and R2b of uid 1, then R3 of uid
 * 2, the newest. After one step each holds a block and uid 1 is at its
 * quota. R1's next block would put uid 1 over: R2b, uid 1's newest, gives
 * its block up, not R3 (the pool's choice). R2 and R2b then wait over the
 * quota, still queued; R3, under its own, runs.
 */
static struct request *quota_load(uint32_t quota, struct request **r2, struct request **r2b,
				  struct request **r3)
{
	pol_open(16, 4 * BT, quota);
	/* Their prompts end next step and they sample a token: clients that can take one. */
	struct conn *a1 = conn_add(1, 1, 1), *a2 = conn_add(1, 1, 1), *a3 = conn_add(1, 1, 1),
		    *b = conn_add(2, 1, 1);
	struct request *r1 = req_add(a1, 0, KVD_OP_GENERATE, 2 * BT, 4, KVD_PRIO_INTERACTIVE, 1);
	*r2 = req_add(a2, 0, KVD_OP_GENERATE, 2 * BT, 4, KVD_PRIO_INTERACTIVE, 2);
	*r2b = req_add(a3, 0, KVD_OP_GENERATE, 2 * BT, 4, KVD_PRIO_INTERACTIVE, 3);
	*r3 = req_add(b, 0, KVD_OP_GENERATE, 2 * BT, 4, KVD_PRIO_INTERACTIVE, 4);
	step();
	assert_int_equal(blocks(r1->sl), 1);
	assert_int_equal(blocks((*r2)->sl), 1);
	assert_int_equal(blocks((*r2b)->sl), 1);
	assert_int_equal(blocks((*r3)->sl), 1);
	assert_int_equal(P.srv.n_preemptions, 0);
	return r1;
}

static void test_quota_preempts_own_newest(void **state)
{
	(void)state;
	struct request *r2, *r2b, *r3, *r1 = quota_load(3, &r2, &r2b, &r3);
	plan();
	assert_int_equal(P.srv.n_preemptions, 1);
	assert_int_equal(blocks(r2b->sl), 0);
	assert_int_equal(blocks(r3->sl), 2);
	assert_int_equal(blocks(r1->sl), 2);
	assert_int_equal(blocks(r2->sl), 1);
	assert_int_equal(rows_of(r1, NULL), BT);
	assert_int_equal(rows_of(r3, NULL), BT);
	/* Over the quota: waiting, still queued, not refused. */
	assert_int_equal(rows_of(r2, NULL), 0);
	assert_int_equal(rows_of(r2b, NULL), 0);
	assert_ptr_equal(r2->sl->head, r2);
	assert_ptr_equal(r2b->sl->head, r2b);
	run();
}

/* Without a quota the same load preempts nothing (the pool has room) and everyone runs. */
static void test_no_quota_no_preemption(void **state)
{
	(void)state;
	struct request *r2, *r2b, *r3, *r1 = quota_load(0, &r2, &r2b, &r3);
	plan();
	assert_int_equal(P.srv.n_preemptions, 0);
	assert_int_equal(rows_of(r1, NULL), BT);
	assert_int_equal(rows_of(r2, NULL), BT);
	assert_int_equal(rows_of(r2b, NULL), BT);
	assert_int_equal(rows_of(r3, NULL), BT);
	run();
}

static int group_setup(void **state)
{
	(void)state;
	log_set_level(LOG_ERR);
	if (fixture_load(&FX, load_err, sizeof(load_err)))
		fixture_close(&FX);
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	fixture_close(&FX);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_idle_preempted_before_running, pol_close),
		cmocka_unit_test_teardown(test_preempted_prefill_still_decodes, pol_close),
		cmocka_unit_test_teardown(test_victim_is_newest_of_lowest_class, pol_close),
		cmocka_unit_test_teardown(test_lower_rank_never_preempts_higher, pol_close),
		cmocka_unit_test_teardown(test_clients_share_prefill_rows, pol_close),
		cmocka_unit_test_teardown(test_one_client_fcfs, pol_close),
		cmocka_unit_test_teardown(test_decodes_before_prefills, pol_close),
		cmocka_unit_test_teardown(test_interactive_before_background, pol_close),
		cmocka_unit_test_teardown(test_quota_preempts_own_newest, pol_close),
		cmocka_unit_test_teardown(test_no_quota_no_preemption, pol_close),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
