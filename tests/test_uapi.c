/* test_uapi.c — pins the ABI of uapi/kvd.h and exercises the shared ring helpers. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "uapi/kvd.h"
#include "uapi/kvd_pins.h"
#include "shm/kvring.h"
#include "shm/kvclient.h"

/* Every size and offset is pinned at compile time by uapi/kvd_pins.h, the same
 * header the daemon and libkvclient compile. */

/* Runtime checks of the same facts, so a compiler that packs differently shows up as a failure too. */
static void test_sizes_runtime(void **state)
{
	(void)state;
	assert_int_equal(sizeof(struct kvd_sqe), 128);
	assert_int_equal(sizeof(struct kvd_cqe), 32);
	assert_int_equal(offsetof(struct kvd_ring_hdr, tail) / 64, 1);
	assert_int_equal(offsetof(struct kvd_ring_hdr, ring_mask) / 64, 2);
	assert_int_equal(_Alignof(struct kvd_sqe), 8);
	assert_int_equal(_Alignof(struct kvd_cqe), 8);
	/* 32 SQEs tile a 4 KiB page exactly; entries never straddle lines. */
	assert_int_equal(4096 % sizeof(struct kvd_sqe), 0);
	assert_int_equal(64 % sizeof(struct kvd_cqe), 0);
	assert_int_equal(sizeof(struct kvd_sqe) % 64, 0);
}

/* The SQE builders zero the reserved tail the daemon checks. */
static void test_prep_zeroes_resv(void **state)
{
	(void)state;
	struct kvd_sqe q;
	memset(&q, 0xa5, sizeof(q));
	kvc_prep_generate(&q, 1, 0, 7, 0, 4, 16, 8);
	for (size_t i = 0; i < sizeof(q.resv) / sizeof(q.resv[0]); i++)
		assert_int_equal(q.resv[i], 0);
	assert_int_equal(q.opcode, KVD_OP_GENERATE);
	assert_int_equal(q.user_data, 7);
}

static void test_constants(void **state)
{
	(void)state;
	assert_memory_equal(&(uint32_t){KVD_MAGIC}, "KVD1", 4);
	assert_memory_equal(&(uint32_t){KVD_VOCAB_MAGIC}, "KVDV", 4);
	assert_int_equal(KVD_ABI_VERSION, 2);
	assert_int_equal(KVD_FEAT_ALL, 0x7fff);
	assert_int_equal(KVD_MSG_LAST, 6);
	assert_int_equal(KVD_OP_LAST, 6);
	/* Flags are distinct single bits. */
	uint32_t cqe = KVD_CQE_MORE | KVD_CQE_EOS | KVD_CQE_LENGTH | KVD_CQE_CANCELLED |
		       KVD_CQE_PREFIX_HIT | KVD_CQE_SHUTDOWN | KVD_CQE_PROGRESS | KVD_CQE_REPLAY |
		       KVD_CQE_RESTARTED;
	assert_int_equal(__builtin_popcount(cqe), 9);
	assert_int_equal(KVD_SQE_FLAGS_ALL, KVD_SQE_APPEND | KVD_SQE_STREAM | KVD_SQE_IGNORE_EOS |
						 KVD_SQE_TEXT | KVD_SQE_CHAT | KVD_SQE_PLAIN |
						 KVD_SQE_SPECIAL | KVD_SQE_PROGRESS | KVD_SQE_MESSAGES |
						 KVD_SQE_NO_GEN_PROMPT | KVD_SQE_LOGPROBS);
	assert_int_equal(kvc_abi_version(), KVD_ABI_VERSION);
}

static void test_reply_check(void **state)
{
	(void)state;
	struct kvd_hello_rep rep;
	memset(&rep, 0, sizeof(rep));
	kvc_msg_init(&rep.hdr, KVD_MSG_HELLO, sizeof(rep), 7);
	/* A request is not a reply. */
	assert_int_equal(kvc_msg_check_reply(&rep.hdr, sizeof(rep), KVD_MSG_HELLO, sizeof(rep), 7),
			 -EPROTO);
	rep.hdr.flags = KVD_MSGF_REPLY;
	assert_int_equal(kvc_msg_check_reply(&rep.hdr, sizeof(rep), KVD_MSG_HELLO, sizeof(rep), 7), 0);
	/* Wrong seq, short datagram, length disagreeing with the datagram. */
	assert_int_equal(kvc_msg_check_reply(&rep.hdr, sizeof(rep), KVD_MSG_HELLO, sizeof(rep), 8),
			 -EPROTO);
	assert_int_equal(kvc_msg_check_reply(&rep.hdr, 10, KVD_MSG_HELLO, sizeof(rep), 7), -EPROTO);
	assert_int_equal(kvc_msg_check_reply(&rep.hdr, sizeof(rep) - 8, KVD_MSG_HELLO,
					     sizeof(rep), 7), -EPROTO);
	/* A daemon error travels as the reply's status. */
	rep.hdr.status = -ENOSPC;
	assert_int_equal(kvc_msg_check_reply(&rep.hdr, sizeof(rep), KVD_MSG_HELLO, sizeof(rep), 7),
			 -ENOSPC);
	rep.hdr.type = KVD_MSG_ERROR;
	rep.hdr.status = -EINVAL;
	assert_int_equal(kvc_msg_check_reply(&rep.hdr, sizeof(rep), KVD_MSG_HELLO, sizeof(rep), 7),
			 -EINVAL);
	rep.hdr.type = KVD_MSG_HELLO;
	rep.hdr.status = 0;
	rep.hdr.magic ^= 1;
	assert_int_equal(kvc_msg_check_reply(&rep.hdr, sizeof(rep), KVD_MSG_HELLO, sizeof(rep), 7),
			 -EPROTO);
}

#define RING_N 8
#define ITEMS 200000

struct ring_mem {
	struct kvd_ring_hdr hdr;
	uint64_t slots[RING_N];
};

static void *producer(void *arg)
{
	struct ring_mem *m = arg;
	uint32_t tail = 0;
	for (uint64_t v = 1; v <= ITEMS;) {
		if (kvring_space(&m->hdr, tail) == 0)
			continue;
		m->slots[tail & m->hdr.ring_mask] = v++;
		kvring_publish(&m->hdr, ++tail);
	}
	return NULL;
}

/* Every value arrives once, in order, across threads; the ring never over-fills. */
static void test_ring_spsc(void **state)
{
	(void)state;
	struct ring_mem *m = aligned_alloc(64, sizeof(*m));
	assert_non_null(m);
	assert_int_equal(kvring_init(&m->hdr, 6), -EINVAL);
	assert_int_equal(kvring_init(&m->hdr, RING_N), 0);
	pthread_t th;
	assert_int_equal(pthread_create(&th, NULL, producer, m), 0);
	uint32_t head = 0;
	uint64_t expect = 1;
	while (expect <= ITEMS) {
		uint32_t n = kvring_ready(&m->hdr, head);
		assert_true(n <= RING_N);
		for (uint32_t i = 0; i < n; i++) {
			assert_int_equal(m->slots[head & m->hdr.ring_mask], expect);
			expect++;
			head++;
		}
		if (n)
			kvring_consume(&m->hdr, head);
	}
	pthread_join(th, NULL);
	assert_int_equal(kvring_ready(&m->hdr, head), 0);
	assert_int_equal(kvring_space(&m->hdr, head), RING_N);
	free(m);
}

static void test_ring_wakeup_flag(void **state)
{
	(void)state;
	struct kvd_ring_hdr r;
	assert_int_equal(kvring_init(&r, 4), 0);
	assert_false(kvring_needs_wakeup(&r));
	kvring_set_need_wakeup(&r);
	assert_true(kvring_needs_wakeup(&r));
	kvring_clear_need_wakeup(&r);
	assert_false(kvring_needs_wakeup(&r));
	/* Index wrap-around near 2^32 keeps counts right. */
	r.head = UINT32_MAX - 1;
	r.tail = 2;
	assert_int_equal(kvring_ready(&r, r.head), 4);
	assert_int_equal(kvring_space(&r, r.tail), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sizes_runtime),
		cmocka_unit_test(test_prep_zeroes_resv),
		cmocka_unit_test(test_constants),
		cmocka_unit_test(test_reply_check),
		cmocka_unit_test(test_ring_spsc),
		cmocka_unit_test(test_ring_wakeup_flag),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
