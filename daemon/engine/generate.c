/* generate.c — one sequence to completion: chunked prefill, then sample, report, feed, until a stop. */
#include <errno.h>
#include <stdlib.h>
#include "daemon/engine/generate.h"
#include "daemon/engine/sampler.h"
#include "daemon/log.h"
#include "daemon/model/model.h"
#include "daemon/tokenizer/tokenizer.h"

int generate_prefill(struct engine *e, struct engine_seq *s, const uint32_t *tokens, uint32_t n,
		     float *logits, const struct generate_params *gp)
{
	uint32_t max = engine_max_rows(e), p0 = engine_seq_len(s);
	struct engine_row *rows = calloc(n < max ? n : max, sizeof(*rows));
	int rc = 0;
	if (!rows)
		return -ENOMEM;
	/* Only the prompt's last row pays for the LM head. */
	for (uint32_t p = 0; p < n && !rc; p += max) {
		uint32_t c = n - p < max ? n - p : max;
		for (uint32_t i = 0; i < c; i++)
			rows[i] = (struct engine_row){ s, p0 + p + i, tokens[p + i], p + i == n - 1 };
		rc = engine_forward(e, rows, c, logits);
		if (!rc && gp && gp->on_prefill)
			gp->on_prefill(gp->arg, p + c, n);
	}
	free(rows);
	return rc;
}

/* The stop that comes with token (just counted), or 0 to feed it and go on. */
static int stop_after(const struct generate_params *gp, uint32_t ctx, const struct engine_seq *s,
		      uint32_t token, uint32_t n_out)
{
	int eog = gp->tok && tokenizer_is_eog(gp->tok, token);
	int stop = gp->on_token && gp->on_token(gp->arg, token, eog);
	if (eog)
		return GENERATE_EOS;
	if (n_out >= gp->max_tokens)
		return GENERATE_LENGTH;
	if (engine_seq_len(s) + 1 >= ctx)
		return GENERATE_CONTEXT;
	return stop ? GENERATE_CALLER : 0;
}

int generate_decode(struct engine *e, struct sampler *smp, struct engine_seq *s, float *logits,
		    const struct generate_params *gp, struct generate_result *res)
{
	uint32_t model_ctx = engine_model(e)->hp.ctx_len;
	uint32_t ctx = gp->ctx && gp->ctx < model_ctx ? gp->ctx : model_ctx;
	uint64_t t0 = log_now_ns();
	int rc = 0;
	res->n_out = 0;
	res->stop = gp->max_tokens ? 0 : GENERATE_LENGTH;
	while (!res->stop) {
		/* The history is what the sequence has cached: the prompt and every token fed since. */
		uint32_t token = sampler_sample(smp, logits, engine_seq_tokens(s), engine_seq_len(s));
		res->n_out++;
		res->stop = stop_after(gp, ctx, s, token, res->n_out);
		if (res->stop)
			break;
		struct engine_row r = { s, engine_seq_len(s), token, 1 };
		if ((rc = engine_forward(e, &r, 1, logits)))
			break;
	}
	res->decode_ns = log_now_ns() - t0;
	return rc;
}

int generate(struct engine *e, struct sampler *smp, struct engine_seq *s, const uint32_t *prompt,
	     uint32_t n, const struct generate_params *gp, struct generate_result *res)
{
	*res = (struct generate_result){ .n_prompt = n };
	if (n == 0)
		return -EINVAL;
	float *logits = malloc((size_t)engine_model(e)->hp.vocab * sizeof(float));
	if (!logits)
		return -ENOMEM;
	uint64_t t0 = log_now_ns();
	int rc = generate_prefill(e, s, prompt, n, logits, gp);
	res->prefill_ns = log_now_ns() - t0;
	if (!rc)
		rc = generate_decode(e, smp, s, logits, gp, res);
	free(logits);
	return rc;
}
