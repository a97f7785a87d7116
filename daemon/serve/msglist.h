/* msglist.h — a KVD_SQE_MESSAGES list, copied out of the arena, checked as untrusted input and turned into chat messages. */
#ifndef KVD_MSGLIST_H
#define KVD_MSGLIST_H

#include <stddef.h>
#include <stdint.h>

struct chat_msg;

struct msglist {
	struct chat_msg *msgs;	/* (n,) roles static, contents into text */
	size_t n;
	char *text;		/* the contents, each NUL-terminated */
	uint64_t content_bytes;	/* sum of the contents' lengths */
};

/* 1 when s[0, len) is well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF). */
int utf8_valid(const uint8_t *s, size_t len);

/*
 * Parse the len bytes of buf (a private copy) as kvd_chat_msg records
 * (uapi/kvd.h, "Message lists"). 0 with *out filled (free with
 * msglist_free()), -EINVAL for anything malformed: no record, more than
 * KVD_CHAT_MAX_MSGS, a record past the end or bytes left over, an unknown
 * role, nonzero resv, content that is not UTF-8 or holds a NUL; -ENOMEM.
 */
int msglist_parse(const uint8_t *buf, size_t len, struct msglist *out);
void msglist_free(struct msglist *l);

#endif
