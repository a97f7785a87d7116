/* fixture.h — the model/engine fixture: the default model, its tokenizer, a CPU backend, a small pool, an engine. */
/*
 * What every in-process test that computes builds first. The model is
 * $KVD_MODEL, else the default one; the pool has the daemon's layout
 * (16-token f16 blocks, all layers). Each part can be made alone, in order:
 * fixture_load() (model, tokenizer), fixture_pool() (backend, pool),
 * fixture_engine() (engine over them); fixture_open() does all three.
 * Functions return 0 or -errno and leave made parts for fixture_close().
 */
#ifndef KVD_TESTS_LIB_FIXTURE_H
#define KVD_TESTS_LIB_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

struct backend;
struct engine;
struct kvpool;
struct model;
struct tokenizer;

struct fixture {
	struct model *m;
	struct tokenizer *tok;
	struct backend *be;
	struct kvpool *pool;
	struct engine *eng;
};

#define FIXTURE_BLOCK_TOKENS 16

/* $KVD_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf. */
const char *fixture_model_path(void);
/* Zero fx, then load the model and its tokenizer; on failure err says why (run `make model`). */
int fixture_load(struct fixture *fx, char *err, size_t errlen);
/* A CPU backend of threads (0: one per core) and an f16 pool of n_blocks 16-token blocks. */
int fixture_pool(struct fixture *fx, uint32_t threads, uint32_t n_blocks);
/* An engine over fx's model, backend and pool, max_rows rows a step. */
int fixture_engine(struct fixture *fx, uint32_t max_rows);
/* All three; err says which part failed and why. */
int fixture_open(struct fixture *fx, uint32_t threads, uint32_t n_blocks, uint32_t max_rows,
		 char *err, size_t errlen);
/* Free the engine, pool and backend (the model stays, for another pool). */
void fixture_close_engine(struct fixture *fx);
/* Free whatever of fx was made; fx is zeroed. */
void fixture_close(struct fixture *fx);

#endif
