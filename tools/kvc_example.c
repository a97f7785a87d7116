/* kvc_example.c — a whole libkvclient program: one chat turn, streamed as text. */
#include <stdio.h>
#include <string.h>
#include <kvd/kvclient.h>

#define SLOT 0		/* a session has kvc_info(c)->max_slots sequences; this uses one */
#define MAX_TOKENS 64

int main(int argc, char **argv)
{
	const char *prompt = argc > 1 ? argv[1] : "What is the capital of France?";
	struct kvc_conn *c = NULL;
	struct kvc_utf8 u = { 0 };	/* tokens split characters: hold a partial one back */
	struct kvd_sqe sqe;
	struct kvd_cqe cqe;
	uint32_t session, in_off, out_off, len, done = 0;
	char text[256 + 3];
	int err;

	if ((err = kvc_connect(&c, NULL)) || (err = kvc_session_open(c, &session)))
		goto out;
	/* The prompt goes into the shared arena as text; the daemon tokenizes it. */
	if ((err = kvc_arena_alloc(c, strlen(prompt), &in_off)) ||
	    (err = kvc_arena_alloc(c, MAX_TOKENS * sizeof(uint32_t), &out_off)))
		goto out;
	uint8_t *arena = kvc_arena(c, NULL);
	memcpy(arena + in_off, prompt, strlen(prompt));

	kvc_prep_generate(&sqe, session, SLOT, 42, in_off, strlen(prompt), out_off, MAX_TOKENS);
	/* A user turn in the model's chat template, one CQE per token. */
	sqe.flags = KVD_SQE_TEXT | KVD_SQE_CHAT | KVD_SQE_STREAM;
	sqe.priority = KVD_PRIO_INTERACTIVE;
	if ((err = kvc_submit(c, &sqe)))
		goto out;

	/* CQEs with KVD_CQE_MORE bring tokens (n_out so far, ids in place at out_off); the
	 * final one (no MORE) has res = tokens in all and why it stopped in its flags. */
	const uint32_t *ids = (const uint32_t *)(arena + out_off);
	do {
		if ((err = kvc_wait(c, &cqe, -1)))
			goto out;
		if (cqe.res < 0) {
			err = cqe.res;
			goto out;
		}
		uint32_t upto = cqe.flags & KVD_CQE_MORE ? cqe.n_out : (uint32_t)cqe.res;
		for (; done < upto && done < MAX_TOKENS; done++) {
			const char *t = kvc_token_bytes(c, ids[done], &len);
			if (t && len <= 256)
				fwrite(text, 1, kvc_utf8_feed(&u, t, len, text), stdout);
		}
		fflush(stdout);
	} while (cqe.flags & KVD_CQE_MORE);
	fwrite(text, 1, kvc_utf8_flush(&u, text), stdout);
	printf("\n[%u tokens, %s]\n", done, cqe.flags & KVD_CQE_EOS ? "end of turn" :
	       cqe.flags & KVD_CQE_LENGTH ? "length" : "cancelled");
out:
	if (err)
		fprintf(stderr, "kvc_example: %s\n", kvc_strerror(err));
	kvc_close(c);
	return err ? 1 : 0;
}
