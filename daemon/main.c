/* main.c — kvd's entry point: parse the options, set up model, backend and KV pool, run the mode asked for. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "daemon/config.h"
#include "daemon/engine/kvpool.h"
#include "daemon/engine/selfcheck.h"
#include "daemon/log.h"
#include "daemon/serve/persist.h"
#include "daemon/serve/server.h"
#include "daemon/serve/service.h"
#include "daemon/model/gguf.h"
#include "daemon/model/model.h"
#include "daemon/oneshot.h"
#include "daemon/perplexity.h"
#include "daemon/serve/obs.h"
#include "daemon/tokenizer/tokenizer.h"
#include "kernels/backend.h"

/* SIGHUP, on the loop thread: the file and command line again; the live values into *live. */
static void reload_config(void *arg, struct server_config *live)
{
	config_reload(arg, live);
}

static int serve(struct kvd_options *o, struct model *m, struct backend *be, struct kvpool *pool,
		 struct persist *ps)
{
	char err[256], path[256];
	struct tokenizer *tok;
	struct server *srv;
	int rc = tokenizer_for_model(&tok, m, err, sizeof(err));
	if (rc) {
		log_msg(LOG_ERR, "tokenizer: %s", err);
		return rc;
	}
	rc = tokenizer_chat_select(tok, o->chat_template, err, sizeof(err));
	if (rc) {
		log_msg(LOG_ERR, "%s", err);
		tokenizer_destroy(tok);
		return rc;
	}
	if (!o->srv.socket_path) {
		o->srv.socket_path = config_default_socket(path, sizeof(path));
		if (!strcmp(o->srv.socket_path, "/run/kvd/kvd.sock"))
			mkdir("/run/kvd", 0755);
	}
	o->srv.reload = reload_config;
	o->srv.reload_arg = o;
	struct kvd_bpf *obs;
	rc = obs_start((enum kvd_bpf_mode)o->bpf, o->srv.socket_path, o->instance, o->srv.socket_gid, &obs);
	if (!rc)
		rc = server_create(&srv, &o->srv, m, tok, be, pool, ps);
	if (!rc) {
		log_msg(LOG_NOTICE, "model %s, %s backend (%u threads)", m->hp.name,
			be->ops->name, be->n_threads);
		rc = server_run(srv);
		server_destroy(srv);
	}
	obs_stop(obs);
	tokenizer_destroy(tok);
	return rc;
}

/*
 * The KV pool's shape. The daemon's (tokens 0): --kv-blocks, else
 * --kv-mem, else 64k tokens. --prompt's: room for its one request of
 * tokens positions and a block to spare, whatever the daemon's size says.
 */
static int pool_config(const struct kvd_options *o, const struct model *m, uint32_t tokens,
		       struct kvpool_config *pc)
{
	*pc = (struct kvpool_config){
		.block_tokens = o->kv_block_tokens, .n_layers = m->hp.n_layers,
		.kv_dim = m->hp.kv_dim, .kv_type = o->kv_type,
	};
	size_t blk = kvpool_token_bytes(pc->kv_type, pc->n_layers, pc->kv_dim) * pc->block_tokens;
	if (tokens)
		pc->n_blocks = (tokens + pc->block_tokens - 1) / pc->block_tokens + 1;
	else if (o->kv_blocks)
		pc->n_blocks = o->kv_blocks;
	else if (o->kv_mem)
		pc->n_blocks = (uint32_t)(o->kv_mem / blk < UINT32_MAX ? o->kv_mem / blk : UINT32_MAX);
	else
		pc->n_blocks = (65536 + pc->block_tokens - 1) / pc->block_tokens;
	if (pc->n_blocks == 0) {
		log_msg(LOG_ERR, "kv-mem is smaller than one block (%zu bytes)", blk);
		return -EINVAL;
	}
	return 0;
}

static void pool_logged(const struct kvd_options *o, const struct kvpool_config *pc)
{
	size_t tok = kvpool_token_bytes(pc->kv_type, pc->n_layers, pc->kv_dim);
	size_t blk = tok * pc->block_tokens;
	log_msg(LOG_NOTICE, "KV cache %s: %zu bytes per token (2 x %u layers x %u kv_dim x %s), pool %u blocks x %u tokens = %llu tokens, %.1f MiB",
		o->kv_type == KB_F32 ? "f32" : o->kv_type == KB_Q8_0 ? "q8_0" : "f16", tok,
		pc->n_layers, pc->kv_dim, o->kv_type == KB_F32 ? "4 B" : o->kv_type == KB_Q8_0 ? "34/32 B" : "2 B",
		pc->n_blocks, pc->block_tokens, (unsigned long long)pc->n_blocks * pc->block_tokens,
		(double)blk * pc->n_blocks / (1 << 20));
}

/* --kv-prefault: every page of the pool now, rather than as blocks are first written. */
static void pool_prefault(const struct kvd_options *o, struct kvpool *p)
{
	struct timespec t0, t1;
	if (!o->kv_prefault)
		return;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int rc = kvpool_prefault(p);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (rc)
		log_msg(LOG_WARNING, "kv-prefault: cannot commit the KV pool's memory now (%s); "
			"its pages come as blocks are first written", strerror(-rc));
	else
		log_msg(LOG_NOTICE, "kv-prefault: KV pool committed in %.2f s",
			(double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9);
}

static int make_pool(const struct kvd_options *o, const struct model *m, struct backend *be,
		     uint32_t tokens, struct kvpool **out)
{
	struct kvpool_config pc;
	int rc = pool_config(o, m, tokens, &pc);
	if (!rc && (rc = kvpool_create_on(out, &pc, be)))
		log_msg(LOG_ERR, "cannot reserve the KV pool (%u blocks of %zu bytes): %s", pc.n_blocks,
			kvpool_token_bytes(pc.kv_type, pc.n_layers, pc.kv_dim) * pc.block_tokens,
			strerror(-rc));
	if (!rc) {
		pool_logged(o, &pc);
		pool_prefault(o, *out);
	}
	return rc;
}

/*
 * The daemon's pool: in the memfd the last run left (systemd's fd store or
 * --state-dir) when its state checks out, so its KV and sessions come back;
 * in a fresh one otherwise. A pool in device memory cannot outlive kvd.
 */
static int make_daemon_pool(struct kvd_options *o, struct model *m, struct backend *be,
			    struct kvpool **out, struct persist **ps)
{
	struct kvpool_config pc;
	int rc = pool_config(o, m, 0, &pc);
	*ps = NULL;
	if (rc)
		return rc;
	const int want = persist_wanted(&o->srv);
	if (!be->host_mem && want)
		log_msg(LOG_NOTICE, "KV is not kept across restarts on the %s backend: its pool is "
			"in device memory", be->ops->name);
	if (be->host_mem && !o->srv.no_persist && !want)
		log_msg(LOG_INFO, "KV is not kept across restarts: no file-descriptor store (systemd) "
			"and no --state-dir");
	/* Nothing to keep: no model hash, no memfds. */
	if (!be->host_mem || !want)
		return make_pool(o, m, be, 0, out);
	struct persist_geom g = { model_identity(m), pc, m->hp.ctx_len, m->hp.vocab };
	if ((rc = persist_open(ps, &o->srv, &g)))
		return rc;
	if (!*ps)
		return make_pool(o, m, be, 0, out);
	if ((rc = kvpool_create_fd(out, &pc, persist_pool_fd(*ps)))) {
		log_msg(LOG_ERR, "cannot map the KV pool (%u blocks): %s", pc.n_blocks, strerror(-rc));
		persist_close(*ps);
		*ps = NULL;
		return rc;
	}
	persist_attach(*ps, *out);
	pool_logged(o, &pc);
	pool_prefault(o, *out);
	return 0;
}

/* The compute backend --backend asks for; its choice is logged. */
static int make_backend(const struct kvd_options *o, struct backend **out)
{
	char why[512];
	int rc = backend_create(out, (enum kb_kind)o->backend, o->threads, why, sizeof(why));
	if (rc) {
		log_msg(LOG_ERR, "%s: %s", why, strerror(-rc));
		return rc;
	}
	log_msg(LOG_NOTICE, "%s", why);
	return 0;
}

/*
 * A device backend is checked against the CPU on this model before anything
 * runs on it (daemon/engine/selfcheck.h): when the two differ, backend =
 * auto runs on the CPU instead and backend = cuda refuses to start. The
 * CPU backend of the check is the one a fallback keeps.
 */
static int check_backend(const struct kvd_options *o, struct model *m, struct backend **be)
{
	const char *name = (*be)->ops->name;
	struct selfcheck_report r;
	struct backend *cpu;
	char why[768];
	if ((*be)->host_mem)
		return 0;
	if (o->no_backend_check) {
		log_msg(LOG_WARNING, "%s backend: not checked against the CPU (no-backend-check)", name);
		return 0;
	}
	int rc = backend_cpu_create(&cpu, o->threads);
	if (rc) {
		log_msg(LOG_ERR, "cannot start the CPU backend to check the %s backend against: %s",
			name, strerror(-rc));
		return rc;
	}
	service_notify("STATUS=checking the %s backend against the CPU", name);
	rc = selfcheck_run(m, *be, cpu, (uint32_t)o->kv_type, &r, why, sizeof(why));
	if (!rc) {
		log_msg(LOG_NOTICE, "%s backend checked against the CPU in %.1f s: layer 0's operations within their bounds (closest: %s, at %.2g of its bound); %u next-token distributions, KL divergence mean %.2g, max %.2g",
			name, r.seconds, r.worst_op, r.worst_err, r.positions, r.mean_kld, r.max_kld);
		cpu->ops->destroy(cpu);
		return 0;
	}
	if (o->backend == KB_BACKEND_AUTO) {
		log_msg(LOG_WARNING, "%s backend check failed: %s. Running on the CPU instead "
			"(backend = cuda would refuse to start)", name, why);
		(*be)->ops->destroy(*be);
		*be = cpu;
		log_msg(LOG_NOTICE, "cpu backend: auto, the %s backend failed its check (%u threads)",
			name, cpu->n_threads);
		return 0;
	}
	log_msg(LOG_ERR, "%s backend check failed: %s. Refusing to start: backend = auto would "
		"run on the CPU, no-backend-check skips the check", name, why);
	cpu->ops->destroy(cpu);
	return rc;
}

/* Exit status: 0, 1 for a runtime error, 2 for a usage or configuration error. */
int main(int argc, char **argv)
{
	struct kvd_options o;
	struct model *m;
	struct backend *be;
	struct kvpool *pool;
	char err[512];
	int status = 1;
	int rc = config_load(&o, argc, argv, err, sizeof(err));
	if (rc || o.help || o.help_man) {
		if (rc)
			log_msg(LOG_ERR, "%s (`kvd --help` lists the options)", err);
		else if (o.help)
			config_usage(stdout);
		else
			config_man(stdout);
		status = rc ? 2 : 0;
		goto out_config;
	}
	if (o.print_config) {
		config_print(&o, stdout);
		status = 0;
		goto out_config;
	}
	log_set_level(o.log_level);
	if (!o.model) {
		log_msg(LOG_ERR, "no model named, and none of the places kvd looks holds the default one: "
			"%s. Run `make model` in kvd's source tree to fetch it (`make install` then puts "
			"it in %s/models), or name a model with --model PATH, model = PATH in the "
			"configuration file or $KVD_MODEL", o.model_tried, config_datadir);
		goto out_config;
	}
	int daemon = !o.prompt && !o.info && !perplexity_mode(&o);
	if (daemon) {
		server_block_signals(NULL);	/* before any thread exists, so none gets one */
		service_collect_fds();		/* the socket and the fd store's memfds, once */
		service_notify("STATUS=loading model %s", o.model);
	}
	if ((rc = model_load(&m, o.model, err, sizeof(err)))) {
		log_msg(LOG_ERR, "%s: %s", o.model, err);
		goto out_config;
	}
	if (m->gguf->copied)
		log_msg(LOG_NOTICE, "%s: others may write it, so it is read into kvd's own memory rather "
			"than mapped (make it owned by kvd's user and not group- or world-writable to map it)",
			o.model);
	if ((rc = model_set_ctx(m, o.ctx, err, sizeof(err)))) {
		log_msg(LOG_ERR, "%s", err);
		status = 2;
		goto out_model;
	}
	if (o.info) {
		oneshot_info(m, &o);
		status = 0;
		goto out_model;
	}
	if (make_backend(&o, &be))
		goto out_model;
	if (check_backend(&o, m, &be))
		goto out_backend;
	if (o.prompt) {
		/* Its pool waits for the prompt's length. */
		status = oneshot_prompt(&o, m, be, make_pool) ? 1 : 0;
		goto out_backend;
	}
	if (perplexity_mode(&o)) {
		/* Its pool is one chunk's, and the chunk is its own context. */
		status = perplexity_run(&o, m, be, make_pool) ? 1 : 0;
		goto out_backend;
	}
	service_notify("STATUS=reserving the KV pool");
	struct persist *ps;
	if ((rc = make_daemon_pool(&o, m, be, &pool, &ps))) {
		/* A size that cannot be, a state directory another kvd holds: configuration. */
		status = rc == -EINVAL || rc == -EBUSY ? 2 : 1;
		goto out_backend;
	}
	status = serve(&o, m, be, pool, ps) ? 1 : 0;
	kvpool_destroy(pool);
	persist_close(ps);
out_backend:
	be->ops->destroy(be);
out_model:
	model_free(m);
out_config:
	config_free(&o);
	return status;
}
