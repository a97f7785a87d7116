/* ref.c — the reference generator of ref.h: engine/generate.c over the fixture's engine. */
#include <errno.h>
#include <stdlib.h>
#include "daemon/engine/engine.h"
#include "daemon/engine/generate.h"
#include "daemon/engine/sampler.h"
#include "daemon/model/model.h"
#include "tests/lib/fixture.h"
#include "tests/lib/ref.h"

struct ref_out {
	uint32_t *out;
	uint32_t n;
};

static int ref_token(void *arg, uint32_t token, int eog)
{
	(void)eog;
	struct ref_out *o = arg;
	o->out[o->n++] = token;
	return 0;
}

int ref_generate(struct fixture *fx, const struct sampler_params *sp, const uint32_t *prompt,
		 uint32_t n, uint32_t max_out, int ignore_eos, uint32_t *out, int *eos)
{
	struct sampler_params greedy;
	struct sampler *smp = NULL;
	struct engine_seq seq;
	if (eos)
		*eos = 0;
	if (!n || !max_out)
		return -EINVAL;
	if (!sp) {
		sampler_params_default(&greedy);
		sp = &greedy;
	}
	int rc = sampler_create(&smp, sp, fx->m->hp.vocab);
	if (rc)
		return rc;
	struct ref_out o = { out, 0 };
	struct generate_params gp = { .max_tokens = max_out, .tok = ignore_eos ? NULL : fx->tok,
				      .on_token = ref_token, .arg = &o };
	struct generate_result res;
	engine_seq_init(fx->eng, &seq, 0);
	rc = generate(fx->eng, smp, &seq, prompt, n, &gp, &res);
	engine_seq_release(fx->eng, &seq);
	sampler_destroy(smp);
	if (rc)
		return rc;
	if (eos)
		*eos = res.stop == GENERATE_EOS;
	return (int)o.n;
}
