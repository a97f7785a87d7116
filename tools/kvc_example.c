/* kvc_example.c — the smallest libkvclient program: one streamed GENERATE. */
#include <stdio.h>
#include <string.h>
#include "shm/kvclient.h"

int main(int argc, char **argv)
{
	const char *prompt = argc > 1 ? argv[1] : "The capital of France is";
	struct kvc_conn *c = NULL;
	struct kvd_sqe sqe;
	struct kvd_cqe cqe;
	uint32_t session, in_off, out_off, len;
	int err;

	if ((err = kvc_connect(&c, NULL)) || (err = kvc_session_open(c, &session)))
		goto out;
	/* The prompt goes into the shared arena as text; the daemon tokenizes it. */
	if ((err = kvc_arena_alloc(c, strlen(prompt), &in_off)) ||
	    (err = kvc_arena_alloc(c, 64 * sizeof(uint32_t), &out_off)))
		goto out;
	uint8_t *arena = kvc_arena(c, NULL);
	memcpy(arena + in_off, prompt, strlen(prompt));

	kvc_prep_generate(&sqe, session, 0, 42, in_off, strlen(prompt), out_off, 64);
	sqe.flags = KVD_SQE_TEXT | KVD_SQE_STREAM;
	if ((err = kvc_submit(c, &sqe)))
		goto out;

	/* A CQE per token (KVD_CQE_MORE); the final one (res = tokens) carries the last. */
	while (!(err = kvc_wait(c, &cqe, -1)) && cqe.res > 0) {
		const char *text = kvc_token_bytes(c, cqe.token, &len);
		fwrite(text ? text : "", 1, text ? len : 0, stdout);
		fflush(stdout);
		if (!(cqe.flags & KVD_CQE_MORE))
			break;
	}
	if (!err && cqe.res < 0)
		err = cqe.res;
	putchar('\n');
out:
	if (err)
		fprintf(stderr, "kvc_example: %s\n", strerror(-err));
	kvc_close(c);
	return err ? 1 : 0;
}
