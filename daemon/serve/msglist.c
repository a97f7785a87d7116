/* msglist.c — KVD_SQE_MESSAGES records to chat messages, every length, role and byte checked. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/serve/msglist.h"
#include "daemon/tokenizer/tokenizer.h"
#include "uapi/kvd_pins.h"

/* The length of the well-formed sequence starting at s[0] (at most n bytes), 0 if ill-formed. */
static size_t utf8_seq(const uint8_t *s, size_t n)
{
	uint8_t c = s[0];
	size_t k;
	uint8_t lo = 0x80, hi = 0xbf;	/* the second byte's range (Unicode table 3-7) */

	if (c < 0x80)
		return 1;
	if (c < 0xc2 || c > 0xf4)
		return 0;
	k = c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
	if (c == 0xe0)
		lo = 0xa0;
	else if (c == 0xed)
		hi = 0x9f;	/* no surrogates */
	else if (c == 0xf0)
		lo = 0x90;
	else if (c == 0xf4)
		hi = 0x8f;	/* nothing past U+10FFFF */
	if (n < k || s[1] < lo || s[1] > hi)
		return 0;
	for (size_t i = 2; i < k; i++)
		if ((s[i] & 0xc0) != 0x80)
			return 0;
	return k;
}

int utf8_valid(const uint8_t *s, size_t len)
{
	for (size_t i = 0; i < len;) {
		size_t k = utf8_seq(s + i, len - i);

		if (!k)
			return 0;
		i += k;
	}
	return 1;
}

static const char *role_name(uint8_t role)
{
	switch (role) {
	case KVD_ROLE_SYSTEM:
		return "system";
	case KVD_ROLE_USER:
		return "user";
	case KVD_ROLE_ASSISTANT:
		return "assistant";
	}
	return NULL;
}

/* How many records buf holds, all checked but their content; -EINVAL if any is malformed. */
static int count_records(const uint8_t *buf, size_t len, uint64_t *content)
{
	size_t off = 0;
	int n = 0;

	*content = 0;
	while (off < len) {
		struct kvd_chat_msg h;

		if (len - off < sizeof(h) || n >= KVD_CHAT_MAX_MSGS)
			return -EINVAL;
		memcpy(&h, buf + off, sizeof(h));
		off += sizeof(h);
		if (!role_name(h.role) || h.resv[0] || h.resv[1] || h.resv[2] || h.len > len - off)
			return -EINVAL;
		if (memchr(buf + off, 0, h.len) || !utf8_valid(buf + off, h.len))
			return -EINVAL;
		off += h.len;
		*content += h.len;
		n++;
	}
	return n ? n : -EINVAL;
}

int msglist_parse(const uint8_t *buf, size_t len, struct msglist *out)
{
	uint64_t content;
	int n = count_records(buf, len, &content);

	memset(out, 0, sizeof(*out));
	if (n < 0)
		return n;
	out->msgs = malloc((size_t)n * sizeof(*out->msgs));
	out->text = malloc((size_t)content + (size_t)n);
	if (!out->msgs || !out->text) {
		msglist_free(out);
		return -ENOMEM;
	}
	char *w = out->text;
	for (size_t off = 0, i = 0; i < (size_t)n; i++) {
		struct kvd_chat_msg h;

		memcpy(&h, buf + off, sizeof(h));
		off += sizeof(h);
		memcpy(w, buf + off, h.len);
		w[h.len] = 0;
		out->msgs[i] = (struct chat_msg){ role_name(h.role), w };
		w += h.len + 1;
		off += h.len;
	}
	out->n = (size_t)n;
	out->content_bytes = content;
	return 0;
}

void msglist_free(struct msglist *l)
{
	free(l->msgs);
	free(l->text);
	memset(l, 0, sizeof(*l));
}
