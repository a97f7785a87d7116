/* kvclient.c — control-message helpers of libkvclient. */
#include <errno.h>
#include <stddef.h>
#include "shm/kvclient.h"

uint32_t kvc_abi_version(void)
{
	return KVD_ABI_VERSION;
}

void kvc_msg_init(struct kvd_msg_hdr *h, uint16_t type, uint32_t len, uint32_t seq)
{
	h->magic = KVD_MAGIC;
	h->type = type;
	h->flags = 0;
	h->len = len;
	h->seq = seq;
	h->status = 0;
	h->resv = 0;
}

int kvc_msg_check_reply(const struct kvd_msg_hdr *h, size_t got, uint16_t type,
			uint32_t min_len, uint32_t seq)
{
	if (got < sizeof(*h) || h->magic != KVD_MAGIC || !(h->flags & KVD_MSGF_REPLY) ||
	    h->len != got || h->seq != seq || h->resv != 0)
		return -EPROTO;
	if (h->type == KVD_MSG_ERROR)
		return h->status < 0 ? h->status : -EPROTO;
	if (h->type != type)
		return -EPROTO;
	if (h->status < 0)
		return h->status;
	if (got < min_len)
		return -EPROTO;
	return 0;
}
