/* persist.c — the pool and state memfds across restarts: found or made, checked, restored into orphan sessions, kept up to date at request ends. */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY	/* XXH3_state_t on the stack */
#include <xxhash.h>
#include "daemon/log.h"
#include "daemon/serve/persist.h"
#include "daemon/serve/server.h"
#include "daemon/serve/service.h"

#define PST_MAGIC	0x315441545344564bull	/* "KVDSTAT1" */
#define PST_VERSION	1u
#define PST_HDR_BYTES	4096u

/* The state memfd's first page: what made it, and where everything is. */
struct pst_hdr {
	uint64_t magic;		/* PST_MAGIC, written last */
	uint32_t version;
	uint32_t hdr_bytes;
	uint64_t model_id;
	uint32_t n_blocks, block_tokens, n_layers, kv_dim;
	uint32_t kv_type, ctx_len, vocab, n_recs;
	uint64_t pool_bytes;
	uint64_t blocks_off, rec_bytes;		/* n_blocks block records */
	uint64_t slots_off, copy_bytes;		/* n_recs slot records of two copies */
	uint64_t total_bytes;
	uint64_t sum;		/* XXH3 of everything above */
};

/* pst_slot.flags */
#define PST_PENDING	(1u << 0)	/* pending: sampled, not in the KV */
#define PST_LOGITS	(1u << 1)	/* the last position's logits were there: a DECODE may follow */
#define PST_LAST	(1u << 2)	/* last: the final CQE of its last request */
#define PST_LOST	(1u << 3)	/* its KV was lost before: APPEND and DECODE fail */
#define PST_FLAGS	((1u << 4) - 1)

/*
 * One copy of a slot's record. The valid copy (sum right) with the higher
 * gen is the record; a write goes to the other copy, gen last, so a crash
 * in the middle leaves the one before.
 */
struct pst_slot {
	uint64_t gen;		/* 0: unused */
	uint64_t sum;		/* XXH3 from token to the end of tokens[n_tokens] */
	uint64_t token[2];	/* its session's */
	uint32_t uid;
	uint32_t session_id;
	uint32_t slot;
	uint32_t n_slots;
	uint32_t ns;		/* its sequence's prefix-cache namespace */
	uint32_t n_tokens;	/* positions at its last request's end */
	uint32_t flags;		/* PST_* */
	uint32_t pending;
	uint64_t lost_mask;	/* slot 0's: slots whose state found no record */
	struct kvd_cqe last;
	uint32_t tokens[];	/* (ctx_len,) */
};

enum persist_mode { PERSIST_FDSTORE, PERSIST_DIR };

struct persist {
	enum persist_mode mode;
	int pool_fd, state_fd;
	uint8_t *map;		/* (total_bytes,) the state memfd */
	struct pst_hdr want;	/* the header this run writes and expects */
	int valid;		/* what the last run left checks out */
	struct kvpool *pool;
	struct kvpool_restored rs;
	uint32_t *free;		/* (n_recs,) a stack of unused record indices */
	uint32_t n_free;
	int warned_full;
};

static uint64_t align_up(uint64_t x, uint64_t a)
{
	return (x + a - 1) / a * a;
}

static uint64_t hdr_sum(const struct pst_hdr *h)
{
	return XXH3_64bits(h, offsetof(struct pst_hdr, sum));
}

/* The header g and cfg call for; 0, or -EINVAL when it would not fit in memory. */
static int make_hdr(struct pst_hdr *h, const struct server_config *cfg, const struct persist_geom *g)
{
	memset(h, 0, sizeof(*h));
	h->magic = PST_MAGIC;
	h->version = PST_VERSION;
	h->hdr_bytes = PST_HDR_BYTES;
	h->model_id = g->model_id;
	h->n_blocks = g->pool.n_blocks;
	h->block_tokens = g->pool.block_tokens;
	h->n_layers = g->pool.n_layers;
	h->kv_dim = g->pool.kv_dim;
	h->kv_type = g->pool.kv_type;
	h->ctx_len = g->ctx_len;
	h->vocab = g->vocab;
	h->n_recs = cfg->state_records;
	h->pool_bytes = kvpool_pool_bytes(&g->pool);
	h->blocks_off = PST_HDR_BYTES;
	h->rec_bytes = kvpool_rec_bytes(g->pool.block_tokens);
	h->slots_off = align_up(h->blocks_off + (uint64_t)h->n_blocks * h->rec_bytes, 4096);
	h->copy_bytes = align_up(sizeof(struct pst_slot) + (uint64_t)g->ctx_len * 4, 64);
	h->total_bytes = h->slots_off + (uint64_t)h->n_recs * 2 * h->copy_bytes;
	h->sum = hdr_sum(h);
	return h->pool_bytes && h->total_bytes < (1ull << 46) ? 0 : -EINVAL;
}

/* Why the header the last run left is not this run's, into why; 0 when it is. */
static int hdr_mismatch(const struct pst_hdr *got, const struct pst_hdr *want, char *why, size_t len)
{
#define DIFF(f, what)									\
	if (got->f != want->f) {							\
		snprintf(why, len, what " (%llu then, %llu now)",			\
			 (unsigned long long)got->f, (unsigned long long)want->f);	\
		return 1;								\
	}
	if (got->magic != PST_MAGIC) {
		snprintf(why, len, "it is not a kvd state file (or was never completed)");
		return 1;
	}
	DIFF(version, "its layout version differs")
	if (got->sum != hdr_sum(got)) {
		snprintf(why, len, "its header is corrupt (checksum)");
		return 1;
	}
	if (got->model_id != want->model_id) {
		snprintf(why, len, "it was made with another model (identity %016llx then, %016llx now)",
			 (unsigned long long)got->model_id, (unsigned long long)want->model_id);
		return 1;
	}
	DIFF(n_blocks, "the pool had another size in blocks")
	DIFF(block_tokens, "the blocks held another number of tokens")
	DIFF(kv_type, "the KV cache had another type")
	DIFF(n_layers, "another layer count")
	DIFF(kv_dim, "another kv_dim")
	DIFF(ctx_len, "the context length differs")
	DIFF(vocab, "the vocabulary differs")
	DIFF(n_recs, "state-records differs")
	DIFF(hdr_bytes, "its header size differs")
	DIFF(pool_bytes, "its pool size differs")
	DIFF(blocks_off, "its layout differs")
	DIFF(rec_bytes, "its layout differs")
	DIFF(slots_off, "its layout differs")
	DIFF(copy_bytes, "its layout differs")
	DIFF(total_bytes, "its size differs")
#undef DIFF
	return 0;
}

static off_t fd_size(int fd)
{
	struct stat st;
	return fstat(fd, &st) ? -1 : st.st_size;
}

/* Does what the last run left check out? 0, or 1 with the reason in why. */
static int check_old(struct persist *ps, char *why, size_t len)
{
	struct pst_hdr got;
	off_t ss = fd_size(ps->state_fd), pool = fd_size(ps->pool_fd);
	if (ss < (off_t)sizeof(got) || pool <= 0) {
		snprintf(why, len, "it is empty");
		return 1;
	}
	if (pread(ps->state_fd, &got, sizeof(got), 0) != (ssize_t)sizeof(got)) {
		snprintf(why, len, "its header cannot be read");
		return 1;
	}
	if (hdr_mismatch(&got, &ps->want, why, len))
		return 1;
	if ((uint64_t)ss != ps->want.total_bytes || (uint64_t)pool != ps->want.pool_bytes) {
		snprintf(why, len, "its files have the wrong sizes (%lld and %lld bytes)",
			 (long long)ss, (long long)pool);
		return 1;
	}
	return 0;
}

/* The files of --state-dir, the state one locked: one kvd per directory. *made: they were empty. */
static int open_dir(struct persist *ps, const char *dir, int *made)
{
	char path[4096];
	if (mkdir(dir, 0700) && errno != EEXIST)
		return -errno;
	snprintf(path, sizeof(path), "%s/kvstate", dir);
	ps->state_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (ps->state_fd < 0)
		return -errno;
	if (flock(ps->state_fd, LOCK_EX | LOCK_NB))
		return errno == EWOULDBLOCK ? -EBUSY : -errno;
	snprintf(path, sizeof(path), "%s/kvpool", dir);
	ps->pool_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (ps->pool_fd < 0)
		return -errno;
	*made = fd_size(ps->state_fd) == 0;
	return 0;
}

/* The memfds systemd kept, else new ones (stored once they are sized). */
static int open_fdstore(struct persist *ps, int *made)
{
	ps->pool_fd = service_take_stored("kvpool");
	ps->state_fd = service_take_stored("kvstate");
	*made = 0;
	if (ps->pool_fd >= 0 && ps->state_fd >= 0)
		return 0;
	if (ps->pool_fd >= 0)
		close(ps->pool_fd);
	if (ps->state_fd >= 0)
		close(ps->state_fd);
	ps->pool_fd = memfd_create("kvd-pool", MFD_CLOEXEC);
	ps->state_fd = memfd_create("kvd-state", MFD_CLOEXEC);
	*made = 1;
	return ps->pool_fd < 0 || ps->state_fd < 0 ? -errno : 0;
}

/* Empty both files at their new sizes and write the header, magic last. */
static int start_fresh(struct persist *ps)
{
	if (ftruncate(ps->state_fd, 0) || ftruncate(ps->state_fd, (off_t)ps->want.total_bytes) ||
	    ftruncate(ps->pool_fd, 0) || ftruncate(ps->pool_fd, (off_t)ps->want.pool_bytes))
		return -errno;
	struct pst_hdr h = ps->want;
	h.magic = 0;
	if (pwrite(ps->state_fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h))
		return -EIO;
	return pwrite(ps->state_fd, &ps->want.magic, sizeof(ps->want.magic), 0) ==
	       (ssize_t)sizeof(ps->want.magic) ? 0 : -EIO;
}

int persist_wanted(const struct server_config *cfg)
{
	return !cfg->no_persist && (cfg->state_dir || getenv("NOTIFY_SOCKET"));
}

int persist_open(struct persist **out, const struct server_config *cfg, const struct persist_geom *g)
{
	*out = NULL;
	if (!persist_wanted(cfg))
		return 0;
	struct persist *ps = calloc(1, sizeof(*ps));
	if (!ps)
		return -ENOMEM;
	ps->pool_fd = ps->state_fd = -1;
	int rc = make_hdr(&ps->want, cfg, g), made = 0;
	if (rc) {
		log_msg(LOG_ERR, "the kept state would be too large");
		goto err;
	}
	ps->mode = cfg->state_dir ? PERSIST_DIR : PERSIST_FDSTORE;
	rc = ps->mode == PERSIST_DIR ? open_dir(ps, cfg->state_dir, &made) : open_fdstore(ps, &made);
	if (rc) {
		if (rc == -EBUSY)
			log_msg(LOG_ERR, "state-dir %s: another kvd uses it", cfg->state_dir);
		else
			log_msg(LOG_ERR, "%s: %s", ps->mode == PERSIST_DIR ? cfg->state_dir : "memfd_create",
				strerror(-rc));
		goto err;
	}
	char why[200];
	const char *where = ps->mode == PERSIST_DIR ? cfg->state_dir : "systemd's file-descriptor store";
	if (made) {
		log_msg(LOG_NOTICE, "no KV state from a last run in %s: starting empty", where);
	} else if (check_old(ps, why, sizeof(why))) {
		log_msg(LOG_WARNING, "KV state from the last run in %s not used: %s; starting empty",
			where, why);
	} else {
		ps->valid = 1;
	}
	if (!ps->valid && (rc = start_fresh(ps))) {
		log_msg(LOG_ERR, "cannot size the kept state (%llu + %llu bytes): %s",
			(unsigned long long)ps->want.total_bytes, (unsigned long long)ps->want.pool_bytes,
			strerror(-rc));
		goto err;
	}
	ps->map = mmap(NULL, ps->want.total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, ps->state_fd, 0);
	if (ps->map == MAP_FAILED) {
		ps->map = NULL;
		rc = -errno;
		goto err;
	}
	ps->free = malloc((size_t)ps->want.n_recs * sizeof(*ps->free));
	if (!ps->free) {
		rc = -ENOMEM;
		goto err;
	}
	for (uint32_t i = ps->want.n_recs; i-- > 0;)
		ps->free[ps->n_free++] = i;
	if (made && ps->mode == PERSIST_FDSTORE && ((rc = service_store_fd("kvpool", ps->pool_fd)) ||
		     (rc = service_store_fd("kvstate", ps->state_fd))))
		log_msg(LOG_WARNING, "FDSTORE: %s: KV will not survive a restart", strerror(-rc));
	*out = ps;
	return 0;
err:
	persist_close(ps);
	return rc;
}

int persist_pool_fd(const struct persist *ps)
{
	return ps->pool_fd;
}

void persist_attach(struct persist *ps, struct kvpool *pool)
{
	ps->pool = pool;
	kvpool_set_records(pool, ps->map + ps->want.blocks_off);
	if (ps->valid)
		kvpool_restore(pool, ps->want.vocab, &ps->rs);
}

void persist_close(struct persist *ps)
{
	if (!ps)
		return;
	if (ps->map)
		munmap(ps->map, ps->want.total_bytes);
	if (ps->pool_fd >= 0)
		close(ps->pool_fd);
	if (ps->state_fd >= 0)
		close(ps->state_fd);	/* and its lock */
	free(ps->free);
	free(ps);
}

/* ---- slot records ---- */

static uint64_t slot_sum(const struct pst_slot *c, const uint32_t *tokens, uint32_t n_tokens);

void persist_image_reseal(uint8_t *image, size_t len)
{
	struct pst_hdr h;
	if (len < sizeof(h))
		return;
	memcpy(&h, image, sizeof(h));
	h.sum = hdr_sum(&h);
	memcpy(image, &h, sizeof(h));
	if (h.copy_bytes < sizeof(struct pst_slot) || h.slots_off > len || h.copy_bytes > len ||
	    h.slots_off % 8 || h.copy_bytes % 8)
		return;	/* not a layout kvd writes: nothing to reseal */
	for (uint64_t i = 0; i < (uint64_t)h.n_recs * 2; i++) {
		uint64_t off = h.slots_off + i * h.copy_bytes;
		if (off > len || len - off < h.copy_bytes)
			return;
		struct pst_slot *c = (struct pst_slot *)(image + off);
		uint64_t room = (h.copy_bytes - sizeof(*c)) / 4;
		if (c->gen && c->n_tokens <= room)
			c->sum = slot_sum(c, c->tokens, c->n_tokens);
	}
}

static struct pst_slot *copy_at(const struct persist *ps, uint32_t rec, int k)
{
	return (struct pst_slot *)(ps->map + ps->want.slots_off + ((uint64_t)rec * 2 + (uint64_t)k) *
				   ps->want.copy_bytes);
}

/* The checksum of a copy: its fields from token on, then n_tokens of tokens (which may lie elsewhere). */
static uint64_t slot_sum(const struct pst_slot *c, const uint32_t *tokens, uint32_t n_tokens)
{
	size_t from = offsetof(struct pst_slot, token);
	XXH3_state_t st;
	XXH3_64bits_reset(&st);
	XXH3_64bits_update(&st, (const uint8_t *)c + from, offsetof(struct pst_slot, tokens) - from);
	XXH3_64bits_update(&st, tokens, (size_t)n_tokens * 4);
	return XXH3_64bits_digest(&st);
}

/*
 * A copy as it stood when read, in private memory: the memfd is as
 * untrusted as a client's region, and another writer could change it
 * between a check and a use, so everything is checked and used from here.
 */
struct snap {
	struct pst_slot hdr;
	uint32_t *tokens;	/* (hdr.n_tokens,) malloc'd; NULL when n_tokens is 0 */
};

/* Copy k of record rec, copied out and checked: 0, or -1 (nothing held). */
static int copy_load(const struct persist *ps, uint32_t rec, int k, struct snap *out)
{
	const struct pst_slot *c = copy_at(ps, rec, k);
	struct pst_slot *h = &out->hdr;
	memcpy(h, c, sizeof(*h));
	out->tokens = NULL;
	uint32_t n = h->n_tokens;
	if (!h->gen || n > ps->want.ctx_len || h->slot >= h->n_slots || h->n_slots > SRV_MAX_SLOTS ||
	    (h->session_id & 0xff) >= SRV_MAX_SESSIONS || (h->flags & ~PST_FLAGS) ||
	    (!h->token[0] && !h->token[1]) || ((h->flags & PST_PENDING) && h->pending >= ps->want.vocab))
		return -1;
	if (n && !(out->tokens = malloc((size_t)n * 4)))
		return -1;
	if (n)
		memcpy(out->tokens, c->tokens, (size_t)n * 4);
	int ok = h->sum == slot_sum(h, out->tokens, n);
	for (uint32_t i = 0; ok && i < n; i++)
		ok = out->tokens[i] < ps->want.vocab;
	if (!ok) {
		free(out->tokens);
		out->tokens = NULL;
		return -1;
	}
	return 0;
}

/* Record rec's current copy into *out: the valid one of the higher generation. 0, or -1: neither. */
static int rec_current(const struct persist *ps, uint32_t rec, struct snap *out)
{
	struct snap a, b;
	int ha = !copy_load(ps, rec, 0, &a), hb = !copy_load(ps, rec, 1, &b);
	if (ha && hb) {
		int pick_a = a.hdr.gen >= b.hdr.gen;
		free(pick_a ? b.tokens : a.tokens);
		*out = pick_a ? a : b;
		return 0;
	}
	if (ha || hb) {
		*out = ha ? a : b;
		return 0;
	}
	return -1;
}

static void rec_clear(struct persist *ps, uint32_t rec)
{
	__atomic_store_n(&copy_at(ps, rec, 0)->gen, 0, __ATOMIC_RELEASE);
	__atomic_store_n(&copy_at(ps, rec, 1)->gen, 0, __ATOMIC_RELEASE);
}

/* Write slot k of s into record rec: the older copy, gen last. */
static void rec_write(struct persist *ps, uint32_t rec, const struct session *s, uint32_t k)
{
	const struct slot *sl = &s->slots[k];
	struct pst_slot *a = copy_at(ps, rec, 0), *b = copy_at(ps, rec, 1);
	uint64_t ga = a->gen, gb = b->gen;
	struct pst_slot *w = ga <= gb ? a : b;
	uint64_t gen = (ga > gb ? ga : gb) + 1;
	uint32_t len = sl->live ? engine_seq_len(&sl->seq) : 0;
	uint64_t n = (uint64_t)len + sl->n_resume;

	__atomic_store_n(&w->gen, 0, __ATOMIC_RELEASE);
	w->token[0] = s->token[0];
	w->token[1] = s->token[1];
	w->uid = (uint32_t)s->uid;
	w->session_id = s->id;
	w->slot = k;
	w->n_slots = s->n_slots;
	w->ns = sl->live ? engine_seq_ns(&sl->seq) : 0;
	w->flags = 0;
	w->pending = sl->has_pending ? sl->pending : 0;
	w->lost_mask = k == 0 ? s->lost_mask : 0;
	memset(&w->last, 0, sizeof(w->last));
	if (n > ps->want.ctx_len) {
		n = 0;		/* cannot happen: positions never pass the context */
		w->flags |= PST_LOST;
	}
	/* Its positions: those in the KV, then those a preemption or restore left to recompute. */
	if (len)
		memcpy(w->tokens, engine_seq_tokens(&sl->seq), (size_t)len * 4);
	if (n && sl->n_resume)
		memcpy(w->tokens + len, sl->resume, (size_t)sl->n_resume * 4);
	w->n_tokens = (uint32_t)n;
	if (sl->has_pending)
		w->flags |= PST_PENDING;
	if (sl->has_logits || (sl->n_resume && sl->resume_logits))
		w->flags |= PST_LOGITS;
	if (sl->lost)
		w->flags |= PST_LOST;
	if (sl->has_last) {
		w->last = sl->last;
		w->flags |= PST_LAST;
	}
	w->sum = slot_sum(w, w->tokens, w->n_tokens);
	__atomic_store_n(&w->gen, gen, __ATOMIC_RELEASE);
}

static int rec_take(struct persist *ps, uint32_t *rec)
{
	if (!ps->n_free) {
		if (!ps->warned_full++)
			log_msg(LOG_WARNING, "the kept state is full (state-records = %u): further "
				"sessions and slots will not survive a restart", ps->want.n_recs);
		return -ENOSPC;
	}
	*rec = ps->free[--ps->n_free];
	return 0;
}

static void rec_give(struct persist *ps, uint32_t rec)
{
	rec_clear(ps, rec);
	ps->free[ps->n_free++] = rec;
}

void persist_session_open(struct persist *ps, struct session *s, uid_t uid)
{
	uint32_t rec;
	s->token[0] = s->token[1] = 0;
	s->uid = uid;
	if (!ps || rec_take(ps, &rec))
		return;
	/* 128 random bits: the token is the whole of the claim, with the uid. */
	while (!s->token[0] && !s->token[1])
		if (getrandom(s->token, sizeof(s->token), 0) != (ssize_t)sizeof(s->token)) {
			rec_give(ps, rec);
			s->token[0] = s->token[1] = 0;
			return;
		}
	s->slots[0].rec1 = rec + 1;
	rec_write(ps, rec, s, 0);
}

void persist_slot_save(struct persist *ps, struct session *s, uint32_t k)
{
	if (!ps || (!s->token[0] && !s->token[1]) || k >= s->n_slots)
		return;
	struct slot *sl = &s->slots[k];
	uint32_t rec;
	if (!sl->rec1) {
		if (rec_take(ps, &rec)) {
			/* Lost on a restart: slot 0's record says so, so it never resumes as empty. */
			if (k < 64 && !(s->lost_mask & (1ull << k))) {
				s->lost_mask |= 1ull << k;
				rec_write(ps, s->slots[0].rec1 - 1, s, 0);
			}
			return;
		}
		sl->rec1 = rec + 1;
	}
	rec_write(ps, sl->rec1 - 1, s, k);
}

void persist_session_drop(struct persist *ps, struct session *s)
{
	if (!ps)
		return;
	for (uint32_t k = 0; k < s->n_slots; k++)
		if (s->slots[k].rec1) {
			rec_give(ps, s->slots[k].rec1 - 1);
			s->slots[k].rec1 = 0;
		}
	s->token[0] = s->token[1] = 0;
}

/* ---- restore ---- */

struct found {
	uint32_t rec;
	struct snap c;
};

static int found_cmp(const void *a, const void *b)
{
	const struct pst_slot *x = &((const struct found *)a)->c.hdr, *y = &((const struct found *)b)->c.hdr;
	if (x->token[0] != y->token[0])
		return x->token[0] < y->token[0] ? -1 : 1;
	if (x->token[1] != y->token[1])
		return x->token[1] < y->token[1] ? -1 : 1;
	return x->slot < y->slot ? -1 : x->slot > y->slot;
}

/* Slot sl from its record: the prefix index's blocks, the rest to recompute. 0, or -ENOMEM. */
static int restore_slot(struct server *srv, struct slot *sl, const struct snap *sn, uint32_t rec,
			uint32_t *blocks, uint32_t *recompute)
{
	const struct pst_slot *c = &sn->hdr;
	const uint32_t *tokens = sn->tokens;
	sl->rec1 = rec + 1;
	if (c->flags & PST_LAST) {
		sl->last = c->last;
		sl->has_last = 1;
	}
	sl->lost = !!(c->flags & PST_LOST);
	if (c->flags & PST_PENDING) {
		sl->pending = c->pending;
		sl->has_pending = 1;
	}
	if (!c->n_tokens)
		return 0;
	engine_seq_init(srv->eng, &sl->seq, c->ns);
	sl->live = 1;
	int hit = engine_seq_attach_prefix(srv->eng, &sl->seq, tokens, c->n_tokens);
	uint32_t h = hit > 0 ? (uint32_t)hit : 0, rest = c->n_tokens - h;
	*blocks += engine_seq_blocks(&sl->seq);
	*recompute += rest;
	if (rest) {
		if (!(sl->resume = malloc((size_t)rest * 4)))
			return -ENOMEM;
		memcpy(sl->resume, tokens + h, (size_t)rest * 4);
		sl->n_resume = rest;
	}
	sl->resume_logits = !!(c->flags & PST_LOGITS);
	return 0;
}

/* One kept session from its records f[0, n) (same token, by slot): an orphan, or NULL. */
static struct session *restore_session(struct server *srv, const struct found *f, uint32_t n,
				       uint32_t *blocks, uint32_t *recompute)
{
	const struct pst_slot *head = &f[0].c.hdr;
	if (head->slot != 0)
		return NULL;	/* its slot 0's record is gone: the session cannot be trusted whole */
	for (uint32_t i = 1; i < n; i++)
		if (f[i].c.hdr.slot == f[i - 1].c.hdr.slot || f[i].c.hdr.uid != head->uid ||
		    f[i].c.hdr.session_id != head->session_id || f[i].c.hdr.n_slots != head->n_slots)
			return NULL;
	struct session *s = session_new(head->n_slots);
	if (!s)
		return NULL;
	s->id = head->session_id;
	s->token[0] = head->token[0];
	s->token[1] = head->token[1];
	s->uid = (uid_t)head->uid;
	s->lost_mask = head->lost_mask & (head->n_slots >= 64 ? ~0ull : (1ull << head->n_slots) - 1);
	for (uint32_t k = 0; k < s->n_slots && k < 64; k++)
		if (s->lost_mask & (1ull << k))
			s->slots[k].lost = 1;
	for (uint32_t i = 0; i < n; i++)
		if (restore_slot(srv, &s->slots[f[i].c.hdr.slot], &f[i].c, f[i].rec, blocks, recompute))
			s->slots[f[i].c.hdr.slot].lost = 1;
	return s;
}

void persist_restore_sessions(struct persist *ps, struct server *srv)
{
	if (!ps)
		return;
	srv->restored_prefixes = ps->rs.registered;
	if (!ps->valid)
		return;
	uint32_t n_recs = ps->want.n_recs, n = 0, dropped = 0, n_sessions = 0, slots = 0;
	uint32_t blocks = 0, recompute = 0, positions = 0;
	struct found *f = malloc((size_t)n_recs * sizeof(*f));
	uint8_t *used = calloc(n_recs, 1);
	if (!f || !used) {
		log_msg(LOG_WARNING, "out of memory restoring sessions: starting without them");
		for (uint32_t i = 0; i < n_recs; i++)
			rec_clear(ps, i);
		free(f);
		free(used);
		return;
	}
	for (uint32_t i = 0; i < n_recs; i++) {
		f[n].rec = i;
		if (!rec_current(ps, i, &f[n].c))
			n++;
		else if (copy_at(ps, i, 0)->gen || copy_at(ps, i, 1)->gen)
			dropped++;
	}
	qsort(f, n, sizeof(*f), found_cmp);
	for (uint32_t i = 0, j; i < n; i = j) {
		for (j = i + 1; j < n && !memcmp(f[j].c.hdr.token, f[i].c.hdr.token, sizeof(f[i].c.hdr.token)); j++)
			;
		struct session *s = restore_session(srv, f + i, j - i, &blocks, &recompute);
		if (!s) {
			dropped += j - i;
			continue;
		}
		for (uint32_t k = i; k < j; k++) {
			used[f[k].rec] = 1;
			positions += f[k].c.hdr.n_tokens;
		}
		slots += j - i;
		s->orphan_deadline_ns = log_now_ns() + (uint64_t)srv->cfg.resume_timeout_s * 1000000000ull;
		s->next_orphan = srv->orphans;
		srv->orphans = s;
		n_sessions++;
	}
	/* What is not some orphan's is free: cleared, on the stack. */
	ps->n_free = 0;
	for (uint32_t i = n_recs; i-- > 0;)
		if (!used[i]) {
			rec_clear(ps, i);
			ps->free[ps->n_free++] = i;
		}
	for (uint32_t i = 0; i < n; i++)
		free(f[i].c.tokens);
	free(f);
	free(used);
	srv->restored_sessions = n_sessions;
	srv->restored_blocks = blocks;
	char tail[96] = "";
	if (dropped || ps->rs.dropped)
		snprintf(tail, sizeof(tail), "; %u slot and %u block records did not check out (dropped)",
			 dropped, ps->rs.dropped);
	log_msg(LOG_NOTICE, "restored from the last run: %u sessions (%u slots, %u positions: %u from "
		"%u KV blocks, %u to recompute), %u prefix-cache blocks%s",
		n_sessions, slots, positions, positions - recompute, blocks, recompute,
		ps->rs.registered, tail);
}
