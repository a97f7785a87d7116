/* test_config.c — kvd.conf and the command line: precedence, --print-config, every error message, reload, kvd(8)'s option list. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/config.h"
#include "daemon/log.h"
#include "kernels/backend.h"

static char dir[64];
static char conf[96];

static int setup(void **state)
{
	(void)state;
	snprintf(dir, sizeof(dir), "/tmp/kvd-config.XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	snprintf(conf, sizeof(conf), "%s/kvd.conf", dir);
	/* Neither the machine's /etc/kvd/kvd.conf nor the test runner's model may leak in. */
	unsetenv("KVD_CONFIG");
	unsetenv("KVD_MODEL");
	unsetenv("STATE_DIRECTORY");
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	unlink(conf);
	rmdir(dir);
	return 0;
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

/* config_load over a NULL-terminated argument list (after "kvd"). */
static int load(struct kvd_options *o, char *err, size_t errlen, ...)
{
	static char *argv[32];
	int argc = 0;
	va_list ap;
	va_start(ap, errlen);
	argv[argc++] = "kvd";
	for (char *a; (a = va_arg(ap, char *)) && argc < 31;)
		argv[argc++] = a;
	va_end(ap);
	argv[argc] = NULL;
	err[0] = 0;
	return config_load(o, argc, argv, err, errlen);
}

/* The file holds text; loading it with --config must fail with exactly want. */
static void file_error(const char *text, const char *want)
{
	struct kvd_options o;
	char err[512], full[600];
	write_file(conf, text);
	int rc = load(&o, err, sizeof(err), "--config", conf, NULL);
	snprintf(full, sizeof(full), "%s:%s", conf, want);
	if (rc != -EINVAL || strcmp(err, full))
		print_message("text: %s\nwant: %s\ngot:  %s (rc %d)\n", text, full, err, rc);
	assert_int_equal(rc, -EINVAL);
	assert_string_equal(err, full);
	config_free(&o);
}

static void test_defaults(void **state)
{
	(void)state;
	struct kvd_options o;
	char err[512];
	write_file(conf, "");
	assert_int_equal(load(&o, err, sizeof(err), "--config", conf, NULL), 0);
	assert_int_equal(o.srv.max_sessions, 16);
	assert_int_equal(o.srv.max_slots, 8);
	assert_int_equal(o.srv.max_tokens, 8192);
	assert_int_equal(o.srv.max_uid_arena, 1ull << 30);
	assert_int_equal(o.srv.drain_timeout_ms, 5000);
	assert_int_equal(o.srv.max_batch_rows, 32);
	assert_int_equal(o.kv_block_tokens, 16);
	assert_int_equal(o.kv_type, KB_F16);
	assert_int_equal(o.log_level, LOG_NOTICE);
	assert_int_equal(o.bpf, KVD_BPF_AUTO);
	assert_int_equal(o.backend, KB_BACKEND_AUTO);
	assert_null(o.srv.socket_path);
	assert_int_equal(o.srv.socket_gid, (gid_t)-1);
	assert_string_equal(o.file_used, conf);
	config_free(&o);

	/* A default model in systemd's StateDirectory= comes first. */
	char models[128], model[256];
	snprintf(models, sizeof(models), "%s/models", dir);
	snprintf(model, sizeof(model), "%s/%s", models, CONFIG_MODEL_FILE);
	assert_int_equal(mkdir(models, 0755), 0);
	write_file(model, "");
	setenv("STATE_DIRECTORY", dir, 1);
	assert_int_equal(load(&o, err, sizeof(err), "--config", conf, NULL), 0);
	assert_string_equal(o.model, model);
	assert_null(o.model_tried);
	config_free(&o);
	unsetenv("STATE_DIRECTORY");
	unlink(model);
	rmdir(models);

	/* The default file may be missing; $KVD_CONFIG names another. */
	setenv("KVD_CONFIG", conf, 1);
	write_file(conf, "max-sessions = 3\n");
	assert_int_equal(load(&o, err, sizeof(err), NULL), 0);
	assert_int_equal(o.srv.max_sessions, 3);
	config_free(&o);
	unsetenv("KVD_CONFIG");
}

/*
 * Where kvd looks for the default model: the state directory (systemd's
 * first, else /var/lib/kvd), the install prefix's data directory, then the
 * source tree this binary was built in, found from the binary's path
 * (build/tests/test_config here), never from the current directory.
 */
static void test_model_places(void **state)
{
	(void)state;
	char places[CONFIG_MODEL_PLACES][CONFIG_PATH_MAX], want[CONFIG_PATH_MAX + 64];
	setenv("STATE_DIRECTORY", "/var/lib/kvd-a:/var/lib/kvd-b", 1);
	int n = config_model_places(places);
	unsetenv("STATE_DIRECTORY");
	assert_int_equal(n, CONFIG_MODEL_PLACES);
	assert_string_equal(places[0], "/var/lib/kvd-a/models/" CONFIG_MODEL_FILE);
	snprintf(want, sizeof(want), "%s/models/%s", config_datadir, CONFIG_MODEL_FILE);
	assert_string_equal(places[1], want);
	/* The tests run from the repository root, whose models/ the build's binaries find. */
	char cwd[CONFIG_PATH_MAX];
	struct stat st;
	assert_non_null(getcwd(cwd, sizeof(cwd)));
	snprintf(want, sizeof(want), "%s/models", cwd);
	if (!stat(want, &st) && S_ISDIR(st.st_mode)) {
		snprintf(want, sizeof(want), "%s/models/%s", cwd, CONFIG_MODEL_FILE);
		assert_string_equal(places[2], want);
	}
	/* From any other directory, the same places. */
	assert_int_equal(chdir("/"), 0);
	char again[CONFIG_MODEL_PLACES][CONFIG_PATH_MAX];
	assert_int_equal(config_model_places(again), n);
	assert_int_equal(chdir(cwd), 0);
	assert_string_equal(again[0], "/var/lib/kvd/models/" CONFIG_MODEL_FILE);
	assert_string_equal(again[2], places[2]);
}

static void test_every_key_from_the_file(void **state)
{
	(void)state;
	struct kvd_options o;
	char err[512];
	static const char every[] =
		"# a comment\n"
		"   ; another, after blanks\n"
		"\n"
		"model = /models/m.gguf\n"
		"backend = cpu\n"
		"threads = 3\n"
		"ctx = 2048\n"
		"kv-mem = 256M\n"
		"kv-blocks = 100\n"
		"kv-block-tokens = 32\n"
		"kv-type = q8_0\n"
		"prefix-global = yes\n"
		"no-prefix-cache = true\n"
		"socket = /tmp/x.sock\n"
		"socket-group = root\n"
		"log-level = debug\n"
		"bpf = off\n"
		"drain-timeout = 0\n"
		"max-sessions = 64\n"
		"max-slots = 2\n"
		"max-tokens = 1000\n"
		"max-inflight = 7\n"
		"max-uid-sessions = 9\n"
		"max-uid-inflight = 11\n"
		"max-uid-arena = 3G\n"
		"max-batch-tokens = 64\n"
		"kv-quota = 500\r\n";
	char buf[2048];
	/* One unknown key after all the good ones: named with its line. */
	snprintf(buf, sizeof(buf), "%s\tthreadz = 1\n", every);
	write_file(conf, buf);
	assert_int_equal(load(&o, err, sizeof(err), "--config", conf, NULL), -EINVAL);
	assert_non_null(strstr(err, ":28: unknown key 'threadz'"));
	config_free(&o);
	write_file(conf, every);
	assert_int_equal(load(&o, err, sizeof(err), "--config", conf, NULL), 0);
	assert_string_equal(o.model, "/models/m.gguf");
	assert_int_equal(o.backend, KB_BACKEND_CPU);
	assert_int_equal(o.threads, 3);
	assert_int_equal(o.ctx, 2048);
	assert_int_equal(o.kv_mem, 256ull << 20);
	assert_int_equal(o.kv_blocks, 100);
	assert_int_equal(o.kv_block_tokens, 32);
	assert_int_equal(o.kv_type, KB_Q8_0);
	assert_int_equal(o.srv.prefix_global, 1);
	assert_int_equal(o.srv.no_prefix_cache, 1);
	assert_string_equal(o.srv.socket_path, "/tmp/x.sock");
	assert_string_equal(o.socket_group, "root");
	assert_int_equal(o.srv.socket_gid, 0);
	assert_int_equal(o.log_level, LOG_DEBUG);
	assert_int_equal(o.bpf, KVD_BPF_OFF);
	assert_int_equal(o.srv.drain_timeout_ms, 0);
	assert_int_equal(o.srv.max_sessions, 64);
	assert_int_equal(o.srv.max_slots, 2);
	assert_int_equal(o.srv.max_tokens, 1000);
	assert_int_equal(o.srv.max_inflight, 7);
	assert_int_equal(o.srv.max_uid_sessions, 9);
	assert_int_equal(o.srv.max_uid_inflight, 11);
	assert_int_equal(o.srv.max_uid_arena, 3ull << 30);
	assert_int_equal(o.srv.max_batch_rows, 64);
	assert_int_equal(o.srv.kv_quota, 500);
	config_free(&o);
}

static void test_precedence_and_print(void **state)
{
	(void)state;
	struct kvd_options o;
	char err[512];
	write_file(conf, "max-sessions = 32\nkv-type = q8_0\nmodel = /from/file.gguf\nbpf = on\n");
	setenv("KVD_MODEL", "/from/env.gguf", 1);
	/* Options before and after the values the file sets; the command line wins. */
	assert_int_equal(load(&o, err, sizeof(err), "--max-sessions", "8", "--config", conf,
			      "--log-level=info", "--bpf", "off", NULL), 0);
	assert_int_equal(o.srv.max_sessions, 8);
	assert_int_equal(o.kv_type, KB_Q8_0);
	assert_string_equal(o.model, "/from/env.gguf");
	assert_int_equal(o.bpf, KVD_BPF_OFF);
	assert_int_equal(o.log_level, LOG_INFO);

	char *out = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&out, &len);
	assert_non_null(f);
	config_print(&o, f);
	fclose(f);
	char want[300];
	snprintf(want, sizeof(want), "kv-type = q8_0");
	assert_non_null(strstr(out, want));
	snprintf(want, sizeof(want), "# %s:2\n", conf);
	assert_non_null(strstr(strstr(out, "kv-type = q8_0"), want));
	assert_non_null(strstr(out, "max-sessions = 8"));
	assert_non_null(strstr(strstr(out, "max-sessions = 8"), "# command line, reloadable\n"));
	assert_non_null(strstr(strstr(out, "model = /from/env.gguf"), "# environment KVD_MODEL\n"));
	assert_non_null(strstr(strstr(out, "max-slots = 8"), "# default\n"));
	assert_non_null(strstr(strstr(out, "bpf = off"), "# command line\n"));
	assert_non_null(strstr(out, "max-uid-arena = 1G"));
	/* Command-line-only options are not part of the configuration. */
	assert_null(strstr(out, "prompt"));
	free(out);
	config_free(&o);

	/* Without the environment, the file's model stands. */
	unsetenv("KVD_MODEL");
	assert_int_equal(load(&o, err, sizeof(err), "--config", conf, NULL), 0);
	assert_string_equal(o.model, "/from/file.gguf");
	assert_int_equal(o.srv.max_sessions, 32);
	config_free(&o);
	/* And the command line's beats both. */
	setenv("KVD_MODEL", "/from/env.gguf", 1);
	assert_int_equal(load(&o, err, sizeof(err), "--config", conf, "-m", "/cli.gguf", NULL), 0);
	assert_string_equal(o.model, "/cli.gguf");
	config_free(&o);
	unsetenv("KVD_MODEL");
}

/* A value outside its option's type or range: the message says what was expected. */
static void test_file_bad_values(void **state)
{
	(void)state;
	file_error("max-sessions = 65\n",
		   "1: bad value '65' for max-sessions: expected an integer from 1 to 64");
	file_error("max-sessions = 0\n",
		   "1: bad value '0' for max-sessions: expected an integer from 1 to 64");
	file_error("max-sessions = 8 # eight\n",
		   "1: bad value '8 # eight' for max-sessions: expected an integer from 1 to 64");
	file_error("max-tokens = -1\n",
		   "1: bad value '-1' for max-tokens: expected an integer from 1 to 16777216");
	file_error("threads = 1.5\n",
		   "1: bad value '1.5' for threads: expected an integer from 0 to 1024");
	file_error("kv-block-tokens = 24\n",
		   "1: bad value '24' for kv-block-tokens: expected a power of two from 1 to 1024");
	file_error("kv-type = f8\n",
		   "1: bad value 'f8' for kv-type: expected one of f16, f32, q8_0");
	file_error("log-level = loud\n",
		   "1: bad value 'loud' for log-level: expected one of emerg, alert, crit, err, "
		   "warning, notice, info, debug");
	file_error("bpf = maybe\n", "1: bad value 'maybe' for bpf: expected one of auto, on, off");
	file_error("backend = tpu\n",
		   "1: bad value 'tpu' for backend: expected one of auto, cpu, cuda, ref");
	file_error("prefix-global = sure\n",
		   "1: bad value 'sure' for prefix-global: expected yes or no");
	file_error("kv-mem = 12T\n",
		   "1: bad value '12T' for kv-mem: expected a size in bytes with an optional K, M or "
		   "G suffix (0: automatic)");
	file_error("max-uid-arena = 0\n",
		   "1: bad value '0' for max-uid-arena: expected a size in bytes with an optional K, "
		   "M or G suffix, above 0");
	file_error("max-uid-arena = 99999999999999999999\n",
		   "1: bad value '99999999999999999999' for max-uid-arena: expected a size in bytes "
		   "with an optional K, M or G suffix, above 0");
	file_error("model =\n", "1: bad value '' for model: expected a non-empty string");
}

static void test_file_errors(void **state)
{
	(void)state;
	file_error("max-sessions = 8\nfrobnicate = 1\n", "2: unknown key 'frobnicate'");
	file_error("max-sessions 8\n", "1: expected 'key = value', got 'max-sessions 8'");
	file_error(" = 8\n", "1: a key is missing before '='");
	file_error("prompt = hi\n", "1: prompt can only be given on the command line");
	file_error("temp = 0.5\n", "1: temp can only be given on the command line");
	file_error("max-slots = 2\n\nmax-slots = 3\n", "3: max-slots is already set on line 1");
	char line[5000];
	memset(line, 'x', sizeof(line));
	memcpy(line, "model = ", 8);
	line[4500] = '\n';
	line[4501] = 0;
	file_error(line, "1: line longer than 4096 bytes");

	/* A NUL byte cannot be written through fputs; write it by hand. */
	int fd = open(conf, O_WRONLY | O_TRUNC);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "ctx = 1\nctx\0 = 2\n", 17), 17);
	close(fd);
	struct kvd_options o;
	char err[512], want[300];
	assert_int_equal(load(&o, err, sizeof(err), "--config", conf, NULL), -EINVAL);
	snprintf(want, sizeof(want), "%s:2: NUL byte in the line", conf);
	assert_string_equal(err, want);
	config_free(&o);

	/* A file named on the command line must exist; an unreadable one is an error. */
	assert_int_equal(load(&o, err, sizeof(err), "--config", "/nonexistent/kvd.conf", NULL), -ENOENT);
	assert_string_equal(err, "cannot read /nonexistent/kvd.conf: No such file or directory");
	config_free(&o);
	assert_int_equal(load(&o, err, sizeof(err), "--config", dir, NULL), -EISDIR);
	snprintf(want, sizeof(want), "cannot read %s: Is a directory", dir);
	assert_string_equal(err, want);
	config_free(&o);

	/* Errors found after parsing name the key. */
	write_file(conf, "socket-group = no-such-group-kvd\n");
	assert_int_equal(load(&o, err, sizeof(err), "--config", conf, NULL), -EINVAL);
	assert_string_equal(err, "socket-group: unknown group 'no-such-group-kvd'");
	config_free(&o);
#ifndef KVD_HAVE_CUDA
	write_file(conf, "backend = cuda\n");
	assert_int_equal(load(&o, err, sizeof(err), "--config", conf, NULL), -EINVAL);
	assert_string_equal(err, "backend = cuda: this kvd was built without the CUDA backend "
			    "(build with CUDA=1 where nvcc is installed), use auto or cpu");
	config_free(&o);
#endif
}

static void cli_error(const char *want, ...)
{
	struct kvd_options o;
	char err[512];
	char *argv[16];
	int argc = 0;
	va_list ap;
	va_start(ap, want);
	argv[argc++] = "kvd";
	for (char *a; (a = va_arg(ap, char *)) && argc < 15;)
		argv[argc++] = a;
	va_end(ap);
	argv[argc] = NULL;
	write_file(conf, "");
	setenv("KVD_CONFIG", conf, 1);
	int rc = config_load(&o, argc, argv, err, sizeof(err));
	unsetenv("KVD_CONFIG");
	if (rc != -EINVAL || strcmp(err, want))
		print_message("want: %s\ngot:  %s (rc %d)\n", want, err, rc);
	assert_int_equal(rc, -EINVAL);
	assert_string_equal(err, want);
	config_free(&o);
}

static void test_command_line_errors(void **state)
{
	(void)state;
	cli_error("unknown option '--frobnicate'", "--frobnicate", NULL);
	cli_error("unknown option '-x'", "-x", NULL);
	cli_error("option --max-sessions needs a value", "--max-sessions", NULL);
	cli_error("option --chat takes no value", "--chat=yes", NULL);
	cli_error("bad value 'lots' for --max-sessions: expected an integer from 1 to 64",
		  "--max-sessions", "lots", NULL);
	cli_error("bad value '2' for --top-p: expected a number from 0 to 1", "--top-p", "2", NULL);
	cli_error("bad value 'nan' for --temp: expected a number from 0 to 100", "--temp", "nan", NULL);
	cli_error("bad value 'gpu' for --backend: expected one of auto, cpu, cuda, ref",
		  "--backend=gpu", NULL);
	cli_error("unexpected argument 'extra'", "--info", "extra", NULL);
}

static void test_command_line_only(void **state)
{
	(void)state;
	struct kvd_options o;
	char err[512];
	write_file(conf, "");
	assert_int_equal(load(&o, err, sizeof(err), "--config", conf, "-p", "Hello", "-n", "5",
			      "--chat", "--system", "Be brief.", "--temp", "0.5", "--top-k", "40",
			      "--top-p", "0.9", "--min-p", "0.05", "--repeat-penalty", "1.1",
			      "--seed", "18446744073709551615", "--prefix-global", NULL), 0);
	assert_string_equal(o.prompt, "Hello");
	assert_int_equal(o.n_predict, 5);
	assert_int_equal(o.chat, 1);
	assert_string_equal(o.system, "Be brief.");
	assert_float_equal(o.sp.temperature, 0.5, 1e-6);
	assert_int_equal(o.sp.top_k, 40);
	assert_float_equal(o.sp.top_p, 0.9, 1e-6);
	assert_float_equal(o.sp.min_p, 0.05, 1e-6);
	assert_float_equal(o.sp.repeat_penalty, 1.1, 1e-6);
	assert_true(o.sp.seed == UINT64_MAX);
	assert_int_equal(o.srv.prefix_global, 1);
	config_free(&o);
	/* --help stops before the file is read, even a broken one. */
	write_file(conf, "broken\n");
	assert_int_equal(load(&o, err, sizeof(err), "--config", conf, "--help", NULL), 0);
	assert_int_equal(o.help, 1);
	config_free(&o);
}

/* Run config_reload with stderr captured; the log goes to *log (caller frees). */
static int reload_logged(struct kvd_options *o, struct server_config *live, char **log)
{
	char path[128];
	snprintf(path, sizeof(path), "%s/log", dir);
	fflush(stderr);
	int saved = dup(2), fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	assert_true(saved >= 0 && fd >= 0);
	dup2(fd, 2);
	int rc = config_reload(o, live);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	off_t n = lseek(fd, 0, SEEK_END);
	*log = calloc(1, (size_t)n + 1);
	assert_int_equal(pread(fd, *log, (size_t)n, 0), n);
	close(fd);
	unlink(path);
	return rc;
}

static void test_reload(void **state)
{
	(void)state;
	struct kvd_options o;
	char err[512], *log;
	write_file(conf, "max-sessions = 4\nkv-type = f16\nmax-tokens = 100\nlog-level = notice\n");
	static char *argv[] = { "kvd", "--config", conf, "--max-tokens", "200", NULL };
	assert_int_equal(config_load(&o, 5, argv, err, sizeof(err)), 0);
	log_set_level(o.log_level);
	struct server_config live = o.srv;
	assert_int_equal(live.max_tokens, 200);

	/* Live values apply; the model's shape needs a restart; the command line still wins. */
	write_file(conf, "max-sessions = 9\nkv-type = f32\nmax-tokens = 300\nlog-level = info\n"
			 "kv-quota = 77\nmax-slots = 3\n");
	int rc = reload_logged(&o, &live, &log);
	print_message("%s", log);
	assert_int_equal(rc, 3);	/* max-sessions, log-level, kv-quota */
	assert_int_equal(live.max_sessions, 9);
	assert_int_equal(live.kv_quota, 77);
	assert_int_equal(live.max_tokens, 200);
	assert_int_equal(live.max_slots, 8);
	assert_int_equal(o.kv_type, KB_F16);
	assert_int_equal(o.log_level, LOG_INFO);
	assert_non_null(strstr(log, "reload: max-sessions 4 -> 9 ("));
	assert_non_null(strstr(log, "reload: kv-quota 0 -> 77 ("));
	assert_non_null(strstr(log, "reload: kv-type = f32 ("));
	assert_non_null(strstr(log, ":2) needs a restart; still f16"));
	assert_non_null(strstr(log, "reload: max-slots = 3 ("));
	assert_null(strstr(log, "max-tokens"));
	free(log);

	/* A value still waiting for a restart is repeated on every reload. */
	rc = reload_logged(&o, &live, &log);
	assert_int_equal(rc, 0);
	assert_non_null(strstr(log, "reload: kv-type = f32 ("));
	free(log);

	/* Nothing differs from what runs: said so. */
	write_file(conf, "max-sessions = 9\nmax-tokens = 300\nlog-level = info\nkv-quota = 77\n");
	rc = reload_logged(&o, &live, &log);
	assert_int_equal(rc, 0);
	assert_non_null(strstr(log, "nothing changed"));
	free(log);

	/* A broken file changes nothing and says why. */
	write_file(conf, "max-sessions = 12\nmax-inflight = many\n");
	rc = reload_logged(&o, &live, &log);
	assert_int_equal(rc, -EINVAL);
	assert_int_equal(live.max_sessions, 9);
	assert_non_null(strstr(log, ":2: bad value 'many' for max-inflight"));
	assert_non_null(strstr(log, "the running configuration stays"));
	free(log);
	log_set_level(LOG_NOTICE);
	config_free(&o);
}

static void test_parse_text_direct(void **state)
{
	(void)state;
	struct kvd_options o;
	char err[256];
	config_defaults(&o);
	/* No newline at the end, CRLF lines, blanks around '='. */
	const char text[] = "max-inflight=5\r\n  socket\t=\t/a b/c.sock  \r\nkv-quota = 1";
	assert_int_equal(config_parse_text(&o, "t", text, sizeof(text) - 1, err, sizeof(err)), 0);
	assert_int_equal(o.srv.max_inflight, 5);
	assert_string_equal(o.srv.socket_path, "/a b/c.sock");
	assert_int_equal(o.srv.kv_quota, 1);
	config_free(&o);
	config_defaults(&o);
	assert_int_equal(config_parse_text(&o, "t", "x", 1, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "t:1: expected 'key = value', got 'x'");
	config_free(&o);
}

/* The whole of f's contents as a string (malloc'd), or NULL. */
static char *slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return NULL;
	char *buf = NULL;
	size_t len = 0;
	FILE *m = open_memstream(&buf, &len);
	int c;
	while (m && (c = fgetc(f)) != EOF)
		fputc(c, m);
	fclose(f);
	if (m)
		fclose(m);
	return buf;
}

/*
 * kvd(8)'s OPTIONS section is what the option table prints (kvd
 * --help-man), so the page cannot drift from the options. After changing
 * the table, regenerate it: replace the page from ".SH OPTIONS" up to the
 * next ".SH" with the output of `build/kvd --help-man`.
 */
static void test_man_page_options(void **state)
{
	(void)state;
	char *page = slurp("tools/man/kvd.8"), *want = NULL;
	size_t want_len = 0;
	assert_non_null(page);
	FILE *m = open_memstream(&want, &want_len);
	assert_non_null(m);
	config_man(m);
	fclose(m);
	char *start = strstr(page, "\n.SH OPTIONS\n");
	assert_non_null(start);
	start++;
	char *end = strstr(start + 1, "\n.SH ");
	assert_non_null(end);
	end[1] = '\0';
	if (strcmp(start, want)) {
		size_t i = 0;
		while (start[i] && start[i] == want[i])
			i++;
		size_t line = 1;
		for (size_t k = 0; k < i; k++)
			line += start[k] == '\n';
		fail_msg("tools/man/kvd.8's OPTIONS differ from the option table at line %zu of the "
			 "section (page: '%.40s', table: '%.40s'); regenerate it from `kvd --help-man`",
			 line, start + i, want + i);
	}
	/* Every option the table shows is in --help too, with its value's name. */
	char *usage = NULL;
	size_t usage_len = 0;
	m = open_memstream(&usage, &usage_len);
	assert_non_null(m);
	config_usage(m);
	fclose(m);
	assert_non_null(strstr(usage, "  -m, --model PATH  "));
	assert_non_null(strstr(usage, "      --kv-quota BLOCKS  "));
	assert_null(strstr(usage, "help-man"));
	free(usage);
	free(want);
	free(page);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defaults),
		cmocka_unit_test(test_model_places),
		cmocka_unit_test(test_every_key_from_the_file),
		cmocka_unit_test(test_precedence_and_print),
		cmocka_unit_test(test_file_bad_values),
		cmocka_unit_test(test_file_errors),
		cmocka_unit_test(test_command_line_errors),
		cmocka_unit_test(test_command_line_only),
		cmocka_unit_test(test_reload),
		cmocka_unit_test(test_parse_text_direct),
		cmocka_unit_test(test_man_page_options),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
