/*
 * fuzz_state.c — the state memfd a restarted kvd maps: its header, the
 * block records of the prefix index and the sessions' slot records. Once,
 * a real state is made the way the daemon makes it (a pool on a state
 * directory, two sessions whose slots ran real prefill steps and were
 * saved at their request ends). Each input then patches a copy of that
 * image and a restart reads it: persist_open, kvpool_restore and
 * persist_restore_sessions, as kvd's start does. Whatever the bytes, the
 * pool must come out consistent (kvpool_check over every restored
 * sequence), every restored token must be a real token id, and nothing
 * may crash or leak.
 *
 * Input: a flags byte (bit 0: recompute every checksum after patching, so
 * a mutation reaches the checks behind them; bit 1: cut the file to the
 * length in the next 3 bytes), then patches of [u24 offset][u8 len][len
 * bytes] over the image.
 */
#include <fcntl.h>
#include <sys/stat.h>
#include "daemon/engine/engine.h"
#include "daemon/serve/persist.h"
#include "tests/fuzz/harness.h"

#define ST_BLOCKS	32
#define ST_RECORDS	4

static struct {
	struct backend *be;
	struct server_config cfg;
	struct persist_geom g;
	char dir[64], state[96];
	uint8_t *image;		/* the state file as the baseline left it */
	size_t image_len;
} ST;

/* Open the state directory and its pool the way kvd's start does; NULL: persistence refused. */
static struct persist *restart(struct kvpool **pool)
{
	struct persist *ps;
	if (persist_open(&ps, &ST.cfg, &ST.g) || !ps)
		fz_die("persist_open", "the state directory could not be opened");
	if (kvpool_create_fd(pool, &ST.g.pool, persist_pool_fd(ps)))
		fz_die("kvpool_create_fd", "the pool could not be mapped");
	persist_attach(ps, *pool);
	return ps;
}

/* Prefill n tokens from first into slot k's sequence, in one step, and save the slot. */
static void run_slot(struct engine *e, struct persist *ps, struct session *s, uint32_t k,
		     uint32_t first, uint32_t n)
{
	struct engine_row rows[64];
	struct slot *sl = &s->slots[k];
	engine_seq_init(e, &sl->seq, 1000 + 1);
	sl->live = 1;
	for (uint32_t i = 0; i < n; i++)
		rows[i] = (struct engine_row){ &sl->seq, i, first + 7 * i, i + 1 == n };
	float *logits = malloc(FZ.fx.m->hp.vocab * sizeof(float));
	if (!logits || engine_forward(e, rows, n, logits))
		fz_die("engine_forward", "the baseline's prefill failed");
	free(logits);
	sl->has_logits = k == 0;
	sl->has_pending = k != 0;
	sl->pending = 42;
	sl->last = (struct kvd_cqe){ .user_data = 100 + k, .res = (int32_t)n, .slot = k };
	sl->has_last = 1;
	persist_slot_save(ps, s, k);
}

/* The baseline: two sessions, three slots with KV, saved; then the image of the state file. */
static void baseline(void)
{
	struct kvpool *pool;
	struct engine *e;
	struct persist *ps = restart(&pool);
	if (engine_create(&e, FZ.fx.m, ST.be, pool, 64))
		fz_die("engine_create", "failed");
	struct session *s[2] = { session_new(2), session_new(1) };
	if (!s[0] || !s[1])
		fz_die("session_new", "out of memory");
	for (int i = 0; i < 2; i++) {
		s[i]->id = (1u << 8) | (uint32_t)i;
		persist_session_open(ps, s[i], 1000);
	}
	run_slot(e, ps, s[0], 0, 100, 40);	/* two full blocks and a partial one */
	run_slot(e, ps, s[0], 1, 300, 17);
	run_slot(e, ps, s[1], 0, 100, 33);	/* shares s[0] slot 0's first two blocks' keys */
	for (int i = 0; i < 2; i++) {
		for (uint32_t k = 0; k < s[i]->n_slots; k++)
			engine_seq_release(e, &s[i]->slots[k].seq);
		session_free(s[i]);
	}
	engine_destroy(e);
	kvpool_destroy(pool);
	persist_close(ps);
	int fd = open(ST.state, O_RDONLY | O_CLOEXEC);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) || !(ST.image = malloc((size_t)st.st_size)) ||
	    pread(fd, ST.image, (size_t)st.st_size, 0) != st.st_size)
		fz_die("state file", "cannot read the baseline");
	ST.image_len = (size_t)st.st_size;
	close(fd);
}

static void cleanup(void)
{
	char p[128];
	snprintf(p, sizeof(p), "%s/kvpool", ST.dir);
	unlink(p);
	unlink(ST.state);
	rmdir(ST.dir);
	free(ST.image);
}

static void setup(void)
{
	if (ST.image)
		return;
	fz_tokenizer();
	char why[256];
	if (backend_create(&ST.be, KB_BACKEND_CPU, 1, why, sizeof(why)))
		fz_die("cpu backend", why);
	snprintf(ST.dir, sizeof(ST.dir), "/tmp/kvd-fuzz-state.XXXXXX");
	if (!mkdtemp(ST.dir))
		fz_die("mkdtemp", strerror(errno));
	snprintf(ST.state, sizeof(ST.state), "%s/kvstate", ST.dir);
	ST.cfg = (struct server_config){ .state_dir = ST.dir, .state_records = ST_RECORDS,
					 .resume_timeout_s = 600 };
	const struct model *m = FZ.fx.m;
	ST.g = (struct persist_geom){
		.model_id = model_identity(m),
		.pool = { .n_blocks = ST_BLOCKS, .block_tokens = 16, .n_layers = m->hp.n_layers,
			  .kv_dim = m->hp.kv_dim, .kv_type = KB_F16 },
		.ctx_len = m->hp.ctx_len, .vocab = m->hp.vocab,
	};
	baseline();
	atexit(cleanup);
}

/* Every sequence the restore made, checked against the pool; the orphans freed. */
static void check_and_free(struct server *srv, struct kvpool *pool)
{
	const struct kvseq *seqs[ST_RECORDS * SRV_MAX_SLOTS];
	size_t n = 0;
	uint32_t vocab = FZ.fx.m->hp.vocab;
	for (struct session *o = srv->orphans; o; o = o->next_orphan)
		for (uint32_t k = 0; k < o->n_slots; k++) {
			const struct slot *sl = &o->slots[k];
			if (n < sizeof(seqs) / sizeof(seqs[0]))
				seqs[n++] = &sl->seq.kv;
			for (uint32_t i = 0; i < engine_seq_len(&sl->seq); i++)
				if (engine_seq_tokens(&sl->seq)[i] >= vocab)
					fz_die("restored slot", "a token id outside the vocabulary");
			for (uint32_t i = 0; i < sl->n_resume; i++)
				if (sl->resume[i] >= vocab)
					fz_die("restored slot", "a token to recompute outside the vocabulary");
			if (sl->has_pending && sl->pending >= vocab)
				fz_die("restored slot", "a pending token outside the vocabulary");
			if ((uint64_t)engine_seq_len(&sl->seq) + sl->n_resume > FZ.fx.m->hp.ctx_len)
				fz_die("restored slot", "more positions than the context");
		}
	char err[256];
	if (kvpool_check(pool, seqs, n, err, sizeof(err)))
		fz_die("kvpool_check after a restore", err);
	while (srv->orphans) {
		struct session *o = srv->orphans;
		srv->orphans = o->next_orphan;
		release_session(srv, NULL, o, 0);
		session_free(o);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	setup();
	struct fz_in in = { data, size };
	uint32_t flags = fz_take(&in, 1);
	size_t len = ST.image_len;
	if (flags & 2) {
		size_t cut = fz_take(&in, 3);
		len = cut < len ? cut : len;
	}
	uint8_t *img = malloc(ST.image_len);
	if (!img)
		fz_die("malloc", "out of memory");
	memcpy(img, ST.image, ST.image_len);
	while (in.left >= 4) {
		size_t off = fz_take(&in, 3);
		size_t n = fz_take(&in, 1);
		n = n < in.left ? n : in.left;
		off %= ST.image_len;
		if (n > ST.image_len - off)
			n = ST.image_len - off;
		memcpy(img + off, in.p, n);
		in.p += n;
		in.left -= n;
	}
	if (flags & 1)
		persist_image_reseal(img, len);
	int fd = open(ST.state, O_WRONLY | O_TRUNC | O_CLOEXEC);
	if (fd < 0 || (len && write(fd, img, len) != (ssize_t)len))
		fz_die("state file", "cannot write the input");
	close(fd);
	free(img);

	struct kvpool *pool;
	struct persist *ps = restart(&pool);
	struct engine *e;
	if (engine_create(&e, FZ.fx.m, ST.be, pool, 8))
		fz_die("engine_create", "failed");
	struct server *srv = calloc(1, sizeof(*srv));
	if (!srv)
		fz_die("calloc", "out of memory");
	srv->cfg = ST.cfg;
	srv->eng = e;
	srv->m = FZ.fx.m;
	persist_restore_sessions(ps, srv);
	/* The baseline itself must come back whole, or the harness tests nothing. */
	if (size <= 1 && !(flags & 2) &&
	    (srv->restored_sessions != 2 || srv->restored_prefixes != 3 || srv->restored_blocks != 5)) {
		fprintf(stderr, "restored %u sessions, %u prefix blocks, %u blocks held\n", srv->restored_sessions,
			srv->restored_prefixes, srv->restored_blocks);
		fz_die("the unpatched baseline", "did not restore its two sessions and three prefix blocks");
	}
	check_and_free(srv, pool);
	free(srv);
	engine_destroy(e);
	kvpool_destroy(pool);
	persist_close(ps);
	return 0;
}
