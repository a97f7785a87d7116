/* ref.c — the reference generator of ref.h, over the fixture's engine. */
#include <errno.h>
#include <stdlib.h>
#include "daemon/engine/engine.h"
#include "daemon/engine/sampler.h"
#include "daemon/model/model.h"
#include "daemon/tokenizer/tokenizer.h"
#include "tests/lib/fixture.h"
#include "tests/lib/ref.h"

int ref_generate(struct fixture *fx, const struct sampler_params *sp, const uint32_t *prompt,
		 uint32_t n, uint32_t max_out, int ignore_eos, uint32_t *out, int *eos)
{
	const uint32_t vocab = fx->m->hp.vocab, max_rows = engine_max_rows(fx->eng);
	struct sampler_params greedy;
	struct sampler *smp = NULL;
	struct engine_seq seq;
	int rc;
	if (eos)
		*eos = 0;
	if (!n || !max_out || !max_rows)
		return -EINVAL;
	float *logits = malloc((size_t)vocab * sizeof(float));
	struct engine_row *rows = calloc(max_rows, sizeof(*rows));
	if (!sp) {
		sampler_params_default(&greedy);
		sp = &greedy;
	}
	if (!logits || !rows) {
		rc = -ENOMEM;
		goto out_free;
	}
	if ((rc = sampler_create(&smp, sp, vocab)))
		goto out_free;
	engine_seq_init(fx->eng, &seq, 0);
	for (uint32_t p = 0; p < n; p += max_rows) {
		uint32_t k = n - p < max_rows ? n - p : max_rows;
		for (uint32_t i = 0; i < k; i++)
			rows[i] = (struct engine_row){ &seq, p + i, prompt[p + i], p + i + 1 == n };
		if ((rc = engine_forward(fx->eng, rows, k, logits)))
			goto out_seq;
	}
	for (uint32_t got = 0;;) {
		/* The history is what the sequence has cached: the prompt and the tokens fed so far. */
		uint32_t t = sampler_sample(smp, logits, seq.kv.tokens, seq.kv.n_tokens);
		out[got++] = t;
		if (!ignore_eos && tokenizer_is_eog(fx->tok, t)) {
			if (eos)
				*eos = 1;
			rc = (int)got;
			break;
		}
		if (got == max_out) {
			rc = (int)got;
			break;
		}
		struct engine_row row = { &seq, engine_seq_len(&seq), t, 1 };
		if ((rc = engine_forward(fx->eng, &row, 1, logits)))
			break;
	}
out_seq:
	engine_seq_release(fx->eng, &seq);
out_free:
	sampler_destroy(smp);
	free(rows);
	free(logits);
	return rc;
}
