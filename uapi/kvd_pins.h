/* kvd_pins.h — size and offset pins of every struct in uapi/kvd.h. */
#ifndef _UAPI_KVD_PINS_H
#define _UAPI_KVD_PINS_H

/*
 * Included by the daemon's control/region/admission code and by libkvclient,
 * so a layout change breaks the builds of both sides, not only a test that
 * might not run. Not installed: clients read sizes from kvd.h's comments and
 * the version from HELLO. C only (_Static_assert); __builtin_offsetof keeps
 * the uapi free of libc headers.
 */
#include "uapi/kvd.h"

#define KVD_PIN_SIZE(type, size) _Static_assert(sizeof(type) == (size), #type " resized")
#define KVD_PIN(type, field, off) \
	_Static_assert(__builtin_offsetof(type, field) == (off), #type "." #field " moved")

KVD_PIN_SIZE(struct kvd_msg_hdr, 24);
KVD_PIN(struct kvd_msg_hdr, magic, 0);
KVD_PIN(struct kvd_msg_hdr, type, 4);
KVD_PIN(struct kvd_msg_hdr, flags, 6);
KVD_PIN(struct kvd_msg_hdr, len, 8);
KVD_PIN(struct kvd_msg_hdr, seq, 12);
KVD_PIN(struct kvd_msg_hdr, status, 16);
KVD_PIN(struct kvd_msg_hdr, resv, 20);

KVD_PIN_SIZE(struct kvd_hello_req, 48);
KVD_PIN(struct kvd_hello_req, abi_version, 24);
KVD_PIN(struct kvd_hello_req, features, 28);
KVD_PIN(struct kvd_hello_req, resv, 32);

KVD_PIN_SIZE(struct kvd_hello_rep, 192);
KVD_PIN(struct kvd_hello_rep, abi_version, 24);
KVD_PIN(struct kvd_hello_rep, features, 28);
KVD_PIN(struct kvd_hello_rep, vocab_size, 32);
KVD_PIN(struct kvd_hello_rep, ctx_len, 36);
KVD_PIN(struct kvd_hello_rep, bos_id, 40);
KVD_PIN(struct kvd_hello_rep, eos_id, 44);
KVD_PIN(struct kvd_hello_rep, eot_id, 48);
KVD_PIN(struct kvd_hello_rep, max_sessions, 52);
KVD_PIN(struct kvd_hello_rep, max_sq_entries, 56);
KVD_PIN(struct kvd_hello_rep, max_cq_entries, 60);
KVD_PIN(struct kvd_hello_rep, max_arena_bytes, 64);
KVD_PIN(struct kvd_hello_rep, kv_block_tokens, 68);
KVD_PIN(struct kvd_hello_rep, kv_blocks_total, 72);
KVD_PIN(struct kvd_hello_rep, model_name, 80);
KVD_PIN(struct kvd_hello_rep, backend, 144);
KVD_PIN(struct kvd_hello_rep, flags, 160);
KVD_PIN(struct kvd_hello_rep, vocab_bytes, 164);
KVD_PIN(struct kvd_hello_rep, max_tokens, 168);
KVD_PIN(struct kvd_hello_rep, max_slots, 172);
KVD_PIN(struct kvd_hello_rep, daemon_pid, 176);
KVD_PIN(struct kvd_hello_rep, resv0, 180);
KVD_PIN(struct kvd_hello_rep, resv, 184);

KVD_PIN_SIZE(struct kvd_vocab_hdr, 64);
KVD_PIN(struct kvd_vocab_hdr, magic, 0);
KVD_PIN(struct kvd_vocab_hdr, n_tokens, 4);
KVD_PIN(struct kvd_vocab_hdr, offsets_off, 8);
KVD_PIN(struct kvd_vocab_hdr, bytes_off, 16);
KVD_PIN(struct kvd_vocab_hdr, bytes_len, 24);
KVD_PIN(struct kvd_vocab_hdr, flags_off, 32);
KVD_PIN(struct kvd_vocab_hdr, resv, 40);

KVD_PIN_SIZE(struct kvd_session_open_req, 56);
KVD_PIN(struct kvd_session_open_req, sq_entries, 24);
KVD_PIN(struct kvd_session_open_req, cq_entries, 28);
KVD_PIN(struct kvd_session_open_req, arena_bytes, 32);
KVD_PIN(struct kvd_session_open_req, flags, 36);
KVD_PIN(struct kvd_session_open_req, token, 40);

KVD_PIN_SIZE(struct kvd_session_open_rep, 120);
KVD_PIN(struct kvd_session_open_rep, session_id, 24);
KVD_PIN(struct kvd_session_open_rep, flags, 28);
KVD_PIN(struct kvd_session_open_rep, sq_entries, 32);
KVD_PIN(struct kvd_session_open_rep, cq_entries, 36);
KVD_PIN(struct kvd_session_open_rep, region_bytes, 40);
KVD_PIN(struct kvd_session_open_rep, sq_off, 48);
KVD_PIN(struct kvd_session_open_rep, sqes_off, 56);
KVD_PIN(struct kvd_session_open_rep, cq_off, 64);
KVD_PIN(struct kvd_session_open_rep, cqes_off, 72);
KVD_PIN(struct kvd_session_open_rep, arena_off, 80);
KVD_PIN(struct kvd_session_open_rep, arena_bytes, 88);
KVD_PIN(struct kvd_session_open_rep, resv0, 92);
KVD_PIN(struct kvd_session_open_rep, resume_token, 96);
KVD_PIN(struct kvd_session_open_rep, restored_slots, 112);
KVD_PIN(struct kvd_session_open_rep, lost_slots, 116);

KVD_PIN_SIZE(struct kvd_session_close_req, 32);
KVD_PIN(struct kvd_session_close_req, session_id, 24);
KVD_PIN(struct kvd_session_close_req, resv, 28);

KVD_PIN_SIZE(struct kvd_stats_rep, 144);
KVD_PIN(struct kvd_stats_rep, requests, 24);
KVD_PIN(struct kvd_stats_rep, tokens_prefilled, 32);
KVD_PIN(struct kvd_stats_rep, tokens_generated, 40);
KVD_PIN(struct kvd_stats_rep, kv_blocks_total, 48);
KVD_PIN(struct kvd_stats_rep, kv_blocks_used, 56);
KVD_PIN(struct kvd_stats_rep, kv_blocks_cached, 64);
KVD_PIN(struct kvd_stats_rep, prefix_hit_tokens, 72);
KVD_PIN(struct kvd_stats_rep, prefix_miss_tokens, 80);
KVD_PIN(struct kvd_stats_rep, evictions, 88);
KVD_PIN(struct kvd_stats_rep, preemptions, 96);
KVD_PIN(struct kvd_stats_rep, connections, 104);
KVD_PIN(struct kvd_stats_rep, sessions, 108);
KVD_PIN(struct kvd_stats_rep, steps, 112);
KVD_PIN(struct kvd_stats_rep, restored_sessions, 120);
KVD_PIN(struct kvd_stats_rep, restored_blocks, 124);
KVD_PIN(struct kvd_stats_rep, restored_prefixes, 128);
KVD_PIN(struct kvd_stats_rep, resumed_sessions, 132);
KVD_PIN(struct kvd_stats_rep, resv, 136);

/* The ring's two indices live on separate 64-byte cache lines. */
KVD_PIN_SIZE(struct kvd_ring_hdr, 192);
KVD_PIN(struct kvd_ring_hdr, head, 0);
KVD_PIN(struct kvd_ring_hdr, pad0, 4);
KVD_PIN(struct kvd_ring_hdr, tail, 64);
KVD_PIN(struct kvd_ring_hdr, pad1, 68);
KVD_PIN(struct kvd_ring_hdr, ring_mask, 128);
KVD_PIN(struct kvd_ring_hdr, ring_entries, 132);
KVD_PIN(struct kvd_ring_hdr, flags, 136);
KVD_PIN(struct kvd_ring_hdr, overflow, 140);
KVD_PIN(struct kvd_ring_hdr, resv, 144);

KVD_PIN_SIZE(struct kvd_sqe, 128);
KVD_PIN(struct kvd_sqe, opcode, 0);
KVD_PIN(struct kvd_sqe, priority, 1);
KVD_PIN(struct kvd_sqe, flags, 2);
KVD_PIN(struct kvd_sqe, session_id, 4);
KVD_PIN(struct kvd_sqe, user_data, 8);
KVD_PIN(struct kvd_sqe, tokens_off, 16);
KVD_PIN(struct kvd_sqe, n_tokens, 20);
KVD_PIN(struct kvd_sqe, out_off, 24);
KVD_PIN(struct kvd_sqe, max_tokens, 28);
KVD_PIN(struct kvd_sqe, seed, 32);
KVD_PIN(struct kvd_sqe, temperature_milli, 40);
KVD_PIN(struct kvd_sqe, top_k, 42);
KVD_PIN(struct kvd_sqe, top_p_e4, 44);
KVD_PIN(struct kvd_sqe, min_p_e4, 46);
KVD_PIN(struct kvd_sqe, repeat_penalty_milli, 48);
KVD_PIN(struct kvd_sqe, repeat_last_n, 50);
KVD_PIN(struct kvd_sqe, slot, 52);
KVD_PIN(struct kvd_sqe, target_user_data, 56);
KVD_PIN(struct kvd_sqe, system_off, 64);
KVD_PIN(struct kvd_sqe, system_len, 68);
KVD_PIN(struct kvd_sqe, logprobs_off, 72);
KVD_PIN(struct kvd_sqe, top_logprobs, 76);
KVD_PIN(struct kvd_sqe, resv1, 77);
KVD_PIN(struct kvd_sqe, presence_milli, 78);
KVD_PIN(struct kvd_sqe, frequency_milli, 80);
KVD_PIN(struct kvd_sqe, resv2, 82);
KVD_PIN(struct kvd_sqe, resv3, 84);
KVD_PIN(struct kvd_sqe, resv, 88);

KVD_PIN_SIZE(struct kvd_chat_msg, 8);
KVD_PIN(struct kvd_chat_msg, role, 0);
KVD_PIN(struct kvd_chat_msg, resv, 1);
KVD_PIN(struct kvd_chat_msg, len, 4);

KVD_PIN_SIZE(struct kvd_logprob, 8);
KVD_PIN(struct kvd_logprob, token, 0);
KVD_PIN(struct kvd_logprob, logprob, 4);

KVD_PIN_SIZE(struct kvd_cqe, 32);
KVD_PIN(struct kvd_cqe, user_data, 0);
KVD_PIN(struct kvd_cqe, res, 8);
KVD_PIN(struct kvd_cqe, flags, 12);
KVD_PIN(struct kvd_cqe, token, 16);
KVD_PIN(struct kvd_cqe, n_out, 20);
KVD_PIN(struct kvd_cqe, slot, 24);
KVD_PIN(struct kvd_cqe, aux, 28);

#endif /* _UAPI_KVD_PINS_H */
