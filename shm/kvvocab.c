/* kvvocab.c — libkvclient's copy of the daemon's vocabulary: mapping it, token ids to text. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "shm/kvclient.h"
#include "shm/kvclient_priv.h"

/* The vocabulary at v checks out: lookups then need only bounds on ids. 0 or -EPROTO. */
static int vocab_check(const uint8_t *v, size_t len)
{
	const struct kvd_vocab_hdr *h = (const void *)v;
	if (len < sizeof(*h) || h->magic != KVD_VOCAB_MAGIC || h->n_tokens == 0 ||
	    h->offsets_off % sizeof(uint32_t) != 0 ||
	    !kvc__in_bounds(h->offsets_off, ((uint64_t)h->n_tokens + 1) * sizeof(uint32_t), len) ||
	    !kvc__in_bounds(h->bytes_off, h->bytes_len, len) ||
	    !kvc__in_bounds(h->flags_off, h->n_tokens, len))
		return -EPROTO;
	return 0;
}

static void vocab_use(struct kvc_conn *c, const uint8_t *v, size_t len)
{
	const struct kvd_vocab_hdr *h = (const void *)v;
	c->vocab = v;
	c->vocab_len = len;
	c->n_tokens = h->n_tokens;
	c->tok_off = (const uint32_t *)(v + h->offsets_off);
	c->tok_bytes = v + h->bytes_off;
	c->tok_bytes_len = h->bytes_len;
	c->tok_flags = v + h->flags_off;
}

/*
 * Keep a replaced vocabulary mapped until kvc_close(): kvc_token_bytes()
 * pointers into it stay valid. 0, or -ENOMEM (then it is unmapped).
 */
static int vocab_retire(struct kvc_conn *c)
{
	size_t n = c->n_old_vocab + 1;
	void **v = realloc(c->old_vocab, n * sizeof(*v));
	if (v)
		c->old_vocab = v;
	size_t *l = v ? realloc(c->old_vocab_len, n * sizeof(*l)) : NULL;
	if (!l) {
		munmap((void *)c->vocab, c->vocab_len);
		return -ENOMEM;
	}
	c->old_vocab_len = l;
	v[n - 1] = (void *)c->vocab;
	l[n - 1] = c->vocab_len;
	c->n_old_vocab = n;
	return 0;
}

int kvc__map_vocab(struct kvc_conn *c, int fd, size_t len)
{
	int err = 0;
	uint8_t *v = kvc__map_fd(fd, len, PROT_READ, &err);
	if (!v)
		return err;
	if ((err = vocab_check(v, len))) {
		munmap(v, len);
		return err;
	}
	if (c->vocab && c->vocab_len == len &&
	    mmap((void *)c->vocab, len, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0) != MAP_FAILED) {
		munmap(v, len);
		v = (uint8_t *)c->vocab;
	} else if (c->vocab) {
		vocab_retire(c);
	}
	vocab_use(c, v, len);
	return 0;
}

const char *kvc_token_bytes(const struct kvc_conn *c, uint32_t id, uint32_t *len)
{
	if (!c->vocab || id >= c->n_tokens)
		return NULL;
	uint32_t a = c->tok_off[id], b = c->tok_off[id + 1];
	if (a > b || b > c->tok_bytes_len)
		return NULL;
	*len = b - a;
	return (const char *)c->tok_bytes + a;
}

int kvc_token_text(const struct kvc_conn *c, uint32_t id, char *buf, size_t cap)
{
	uint32_t len;
	if (!c->vocab)
		return -ENODATA;
	const char *p = kvc_token_bytes(c, id, &len);
	if (!p)
		return -ERANGE;
	if (cap == 0)
		return -ENOSPC;
	if (len >= cap || len > INT32_MAX) {
		buf[0] = '\0';
		return -ENOSPC;
	}
	memcpy(buf, p, len);
	buf[len] = '\0';
	return (int)len;
}

int kvc_token_flags(const struct kvc_conn *c, uint32_t id)
{
	if (!c->vocab)
		return -ENODATA;
	if (id >= c->n_tokens)
		return -ERANGE;
	return c->tok_flags[id];
}
