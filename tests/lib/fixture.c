/* fixture.c — the model/engine fixture of fixture.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/engine/engine.h"
#include "daemon/engine/kvpool.h"
#include "daemon/model/model.h"
#include "daemon/tokenizer/tokenizer.h"
#include "kernels/backend.h"
#include "tests/lib/fixture.h"

const char *fixture_model_path(void)
{
	const char *p = getenv("KVD_MODEL");
	return p && *p ? p : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

int fixture_load(struct fixture *fx, char *err, size_t errlen)
{
	char why[256] = "";
	memset(fx, 0, sizeof(*fx));
	int rc = model_load(&fx->m, fixture_model_path(), why, sizeof(why));
	if (rc) {
		fx->m = NULL;
		snprintf(err, errlen, "cannot load model '%s': %s (run `make model`)", fixture_model_path(), why);
		return rc;
	}
	rc = tokenizer_create(&fx->tok, fx->m->gguf, why, sizeof(why));
	if (rc) {
		fx->tok = NULL;
		snprintf(err, errlen, "tokenizer of '%s': %s", fixture_model_path(), why);
	}
	return rc;
}

int fixture_pool(struct fixture *fx, uint32_t threads, uint32_t n_blocks)
{
	int rc = backend_cpu_create(&fx->be, threads);
	if (rc) {
		fx->be = NULL;
		return rc;
	}
	struct kvpool_config pc = { .n_blocks = n_blocks, .block_tokens = FIXTURE_BLOCK_TOKENS,
				    .n_layers = fx->m->hp.n_layers, .kv_dim = fx->m->hp.kv_dim,
				    .kv_type = KB_F16 };
	rc = kvpool_create(&fx->pool, &pc);
	if (rc)
		fx->pool = NULL;
	return rc;
}

int fixture_engine(struct fixture *fx, uint32_t max_rows)
{
	int rc = engine_create(&fx->eng, fx->m, fx->be, fx->pool, max_rows);
	if (rc)
		fx->eng = NULL;
	return rc;
}

int fixture_open(struct fixture *fx, uint32_t threads, uint32_t n_blocks, uint32_t max_rows,
		 char *err, size_t errlen)
{
	int rc = fixture_load(fx, err, errlen);
	if (rc)
		return rc;
	if ((rc = fixture_pool(fx, threads, n_blocks)))
		snprintf(err, errlen, "CPU backend or a pool of %u blocks: %s", n_blocks, strerror(-rc));
	else if ((rc = fixture_engine(fx, max_rows)))
		snprintf(err, errlen, "engine of %u rows: %s", max_rows, strerror(-rc));
	return rc;
}

void fixture_close_engine(struct fixture *fx)
{
	engine_destroy(fx->eng);
	fx->eng = NULL;
	if (fx->pool)
		kvpool_destroy(fx->pool);
	fx->pool = NULL;
	if (fx->be)
		fx->be->ops->destroy(fx->be);
	fx->be = NULL;
}

void fixture_close(struct fixture *fx)
{
	fixture_close_engine(fx);
	if (fx->tok)
		tokenizer_destroy(fx->tok);
	if (fx->m)
		model_free(fx->m);
	memset(fx, 0, sizeof(*fx));
}
