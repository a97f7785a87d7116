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
#include "shm/kvring.h"
#include "shm/kvclient.h"

#define PIN(type, field, off) \
	_Static_assert(offsetof(type, field) == (off), #type "." #field " moved")

_Static_assert(sizeof(struct kvd_msg_hdr) == 24, "msg hdr size");
PIN(struct kvd_msg_hdr, magic, 0);
PIN(struct kvd_msg_hdr, type, 4);
PIN(struct kvd_msg_hdr, flags, 6);
PIN(struct kvd_msg_hdr, len, 8);
PIN(struct kvd_msg_hdr, seq, 12);
PIN(struct kvd_msg_hdr, status, 16);
PIN(struct kvd_msg_hdr, resv, 20);

_Static_assert(sizeof(struct kvd_hello_req) == 48, "hello req size");
PIN(struct kvd_hello_req, abi_version, 24);
PIN(struct kvd_hello_req, features, 28);
PIN(struct kvd_hello_req, resv, 32);

_Static_assert(sizeof(struct kvd_hello_rep) == 192, "hello rep size");
PIN(struct kvd_hello_rep, abi_version, 24);
PIN(struct kvd_hello_rep, vocab_size, 32);
PIN(struct kvd_hello_rep, kv_block_tokens, 68);
PIN(struct kvd_hello_rep, kv_blocks_total, 72);
PIN(struct kvd_hello_rep, model_name, 80);
PIN(struct kvd_hello_rep, backend, 144);
PIN(struct kvd_hello_rep, flags, 160);
PIN(struct kvd_hello_rep, vocab_bytes, 164);
PIN(struct kvd_hello_rep, max_tokens, 168);
PIN(struct kvd_hello_rep, max_slots, 172);
PIN(struct kvd_hello_rep, resv, 176);
_Static_assert(sizeof(struct kvd_vocab_hdr) == 64, "vocab hdr size");
PIN(struct kvd_vocab_hdr, n_tokens, 4);
PIN(struct kvd_vocab_hdr, offsets_off, 8);
PIN(struct kvd_vocab_hdr, bytes_off, 16);
PIN(struct kvd_vocab_hdr, bytes_len, 24);
PIN(struct kvd_vocab_hdr, flags_off, 32);

_Static_assert(sizeof(struct kvd_session_open_req) == 56, "open req size");
PIN(struct kvd_session_open_req, sq_entries, 24);
PIN(struct kvd_session_open_req, arena_bytes, 32);
PIN(struct kvd_session_open_req, resv, 40);

_Static_assert(sizeof(struct kvd_session_open_rep) == 96, "open rep size");
PIN(struct kvd_session_open_rep, session_id, 24);
PIN(struct kvd_session_open_rep, region_bytes, 40);
PIN(struct kvd_session_open_rep, sq_off, 48);
PIN(struct kvd_session_open_rep, sqes_off, 56);
PIN(struct kvd_session_open_rep, cq_off, 64);
PIN(struct kvd_session_open_rep, cqes_off, 72);
PIN(struct kvd_session_open_rep, arena_off, 80);
PIN(struct kvd_session_open_rep, arena_bytes, 88);

_Static_assert(sizeof(struct kvd_session_close_req) == 32, "close req size");
_Static_assert(sizeof(struct kvd_stats_rep) == 144, "stats rep size");
PIN(struct kvd_stats_rep, requests, 24);
PIN(struct kvd_stats_rep, preemptions, 96);
PIN(struct kvd_stats_rep, connections, 104);
PIN(struct kvd_stats_rep, steps, 112);
PIN(struct kvd_stats_rep, resv, 120);

/* The ring's two indices live on separate 64-byte cache lines. */
_Static_assert(sizeof(struct kvd_ring_hdr) == 192, "ring hdr size");
PIN(struct kvd_ring_hdr, head, 0);
PIN(struct kvd_ring_hdr, tail, 64);
PIN(struct kvd_ring_hdr, ring_mask, 128);
PIN(struct kvd_ring_hdr, ring_entries, 132);
PIN(struct kvd_ring_hdr, flags, 136);
PIN(struct kvd_ring_hdr, overflow, 140);

_Static_assert(sizeof(struct kvd_sqe) == 64, "sqe size");
PIN(struct kvd_sqe, opcode, 0);
PIN(struct kvd_sqe, priority, 1);
PIN(struct kvd_sqe, flags, 2);
PIN(struct kvd_sqe, session_id, 4);
PIN(struct kvd_sqe, user_data, 8);
PIN(struct kvd_sqe, tokens_off, 16);
PIN(struct kvd_sqe, n_tokens, 20);
PIN(struct kvd_sqe, out_off, 24);
PIN(struct kvd_sqe, max_tokens, 28);
PIN(struct kvd_sqe, seed, 32);
PIN(struct kvd_sqe, temperature_milli, 40);
PIN(struct kvd_sqe, top_k, 42);
PIN(struct kvd_sqe, top_p_e4, 44);
PIN(struct kvd_sqe, min_p_e4, 46);
PIN(struct kvd_sqe, repeat_penalty_milli, 48);
PIN(struct kvd_sqe, repeat_last_n, 50);
PIN(struct kvd_sqe, slot, 52);
PIN(struct kvd_sqe, target_user_data, 56);

_Static_assert(sizeof(struct kvd_cqe) == 32, "cqe size");
PIN(struct kvd_cqe, user_data, 0);
PIN(struct kvd_cqe, res, 8);
PIN(struct kvd_cqe, flags, 12);
PIN(struct kvd_cqe, token, 16);
PIN(struct kvd_cqe, n_out, 20);
PIN(struct kvd_cqe, slot, 24);
PIN(struct kvd_cqe, resv, 28);

/* Runtime checks of the same facts, so a compiler that packs differently shows up as a failure too. */
static void test_sizes_runtime(void **state)
{
	(void)state;
	assert_int_equal(sizeof(struct kvd_sqe), 64);
	assert_int_equal(sizeof(struct kvd_cqe), 32);
	assert_int_equal(offsetof(struct kvd_ring_hdr, tail) / 64, 1);
	assert_int_equal(offsetof(struct kvd_ring_hdr, ring_mask) / 64, 2);
	assert_int_equal(_Alignof(struct kvd_sqe), 8);
	assert_int_equal(_Alignof(struct kvd_cqe), 8);
	/* 64 SQEs tile a 4 KiB page exactly; entries never straddle lines. */
	assert_int_equal(4096 % sizeof(struct kvd_sqe), 0);
	assert_int_equal(64 % sizeof(struct kvd_cqe), 0);
}

static void test_constants(void **state)
{
	(void)state;
	assert_memory_equal(&(uint32_t){KVD_MAGIC}, "KVD1", 4);
	assert_memory_equal(&(uint32_t){KVD_VOCAB_MAGIC}, "KVDV", 4);
	assert_int_equal(KVD_ABI_VERSION, 1);
	assert_int_equal(KVD_FEAT_ALL, 0x7f);
	assert_int_equal(KVD_MSG_LAST, 6);
	assert_int_equal(KVD_OP_LAST, 6);
	/* Flags are distinct single bits. */
	uint32_t cqe = KVD_CQE_MORE | KVD_CQE_EOS | KVD_CQE_LENGTH | KVD_CQE_CANCELLED |
		       KVD_CQE_PREFIX_HIT;
	assert_int_equal(__builtin_popcount(cqe), 5);
	assert_int_equal(KVD_SQE_FLAGS_ALL, KVD_SQE_APPEND | KVD_SQE_STREAM | KVD_SQE_IGNORE_EOS |
						 KVD_SQE_TEXT | KVD_SQE_CHAT);
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
		cmocka_unit_test(test_constants),
		cmocka_unit_test(test_reply_check),
		cmocka_unit_test(test_ring_spsc),
		cmocka_unit_test(test_ring_wakeup_flag),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
