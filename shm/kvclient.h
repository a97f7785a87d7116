/* kvclient.h — libkvclient, the client side of kvd's ABI. */
#ifndef KVD_KVCLIENT_H
#define KVD_KVCLIENT_H

#include <stdint.h>
#include "uapi/kvd.h"

/* The ABI version this library speaks (KVD_ABI_VERSION of its uapi/kvd.h). */
uint32_t kvc_abi_version(void);

/*
 * Fill a control-message header for a request of the given type and total
 * length; the caller zeroes the rest of the message first.
 */
void kvc_msg_init(struct kvd_msg_hdr *h, uint16_t type, uint32_t len, uint32_t seq);

/*
 * Check a reply received for request seq of the given type and minimum
 * length: magic, reply flag, type, length and status. Returns the reply's
 * status (0 or -errno) or -EPROTO if the reply itself is malformed.
 */
int kvc_msg_check_reply(const struct kvd_msg_hdr *h, size_t got, uint16_t type,
			uint32_t min_len, uint32_t seq);

#endif
