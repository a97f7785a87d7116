/* test_perplexity.c — kvd --perplexity and --kl-divergence: the 16-bit rows, the base file, its refusals, the PPL against a plain loop, and a file llama-perplexity wrote. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <signal.h>
#include <unistd.h>

#include "daemon/engine/engine.h"
#include "daemon/model/model.h"
#include "daemon/perplexity.h"
#include "daemon/tokenizer/tokenizer.h"
#include "tests/lib/fixture.h"

/*
 * The text: the start of the GPL, which every Debian-like system has. Two
 * chunks of 128 keep each kvd run to a few seconds on a CPU.
 */
#define LICENSE "/usr/share/common-licenses/GPL-3"
#define TEXT_BYTES 6000
#define CTX 128
#define CTX_S "128"

static char TMP[64];
static char TEXT[128], BASE[128], BAD[128];
static char OUT[1 << 16], ERR[1 << 16];	/* the last run's stdout and stderr */
static int STATUS;
static int PTY;				/* run_kvd puts stderr on a terminal */
static const char *MODEL;		/* run_kvd's model, when not the fixture's */
static struct fixture FX;
static float *LOGITS;
static double PPL_PLAIN = -1;		/* test_base_file's plain run, for test_reference */

static int setup(void **state)
{
	(void)state;
	snprintf(TMP, sizeof(TMP), "/tmp/kvd-ppl.XXXXXX");
	if (!mkdtemp(TMP))
		return -1;
	snprintf(TEXT, sizeof(TEXT), "%s/text.txt", TMP);
	snprintf(BASE, sizeof(BASE), "%s/base.kld", TMP);
	snprintf(BAD, sizeof(BAD), "%s/bad.kld", TMP);
	FILE *in = fopen(LICENSE, "rb"), *out = fopen(TEXT, "wb");
	char buf[TEXT_BYTES];
	size_t n = in ? fread(buf, 1, sizeof(buf), in) : 0;
	if (out && n)
		fwrite(buf, 1, n, out);
	if (in)
		fclose(in);
	if (out)
		fclose(out);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	fixture_close(&FX);
	free(LOGITS);
	LOGITS = NULL;
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", TMP);
	if (system(cmd))
		print_message("could not remove %s\n", TMP);
	return 0;
}

static void need_text(void)
{
	if (access(LICENSE, R_OK))
		skip();	/* no text to score on this system */
}

static const char *bin(void)
{
	const char *p = getenv("KVD_BIN");
	return p && *p ? p : "build/kvd";
}

/* Read what fd holds into buf (NUL-terminated, truncated to cap). */
static void slurp(int fd, char *buf, size_t cap)
{
	size_t n = 0;
	ssize_t got;
	lseek(fd, 0, SEEK_SET);
	while (n + 1 < cap && (got = read(fd, buf + n, cap - 1 - n)) > 0)
		n += (size_t)got;
	buf[n] = '\0';
}

/* Run kvd on the CPU, one thread, with the test's model and args (NULL-terminated); output into OUT, ERR. */
static int run_kvd(const char *first, ...)
{
	const char *argv[32] = { bin(), "--backend", "cpu", "-t", "1", "-m",
				 MODEL ? MODEL : fixture_model_path() };
	int argc = 7;
	va_list ap;
	va_start(ap, first);
	for (const char *a = first; a && argc < 31; a = va_arg(ap, const char *))
		argv[argc++] = a;
	va_end(ap);
	argv[argc] = NULL;
	char path[128];
	snprintf(path, sizeof(path), "%s/out.XXXXXX", TMP);
	int out = mkstemp(path);
	unlink(path);
	snprintf(path, sizeof(path), "%s/err.XXXXXX", TMP);
	int err = mkstemp(path);
	unlink(path);
	assert_true(out >= 0 && err >= 0);
	int master = -1, slave = -1;
	if (PTY) {
		master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
		assert_true(master >= 0);
		assert_int_equal(grantpt(master), 0);
		assert_int_equal(unlockpt(master), 0);
		slave = open(ptsname(master), O_RDWR | O_NOCTTY);
		assert_true(slave >= 0);
	}
	pid_t parent = getpid(), pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		int null = open("/dev/null", O_RDONLY);
		if (getppid() != parent || null < 0 || dup2(null, 0) < 0 || dup2(out, 1) < 0 ||
		    dup2(PTY ? slave : err, 2) < 0)
			_exit(126);
		setenv("KVD_CONFIG", "/dev/null", 1);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	/* No deadline: a hung kvd is the harness's to kill. */
	while (waitpid(pid, &STATUS, 0) < 0 && errno == EINTR)
		;
	slurp(out, OUT, sizeof(OUT));
	slurp(err, ERR, sizeof(ERR));
	if (PTY) {
		/* A few hundred bytes: the terminal held them all while kvd ran. */
		close(slave);
		ssize_t n = read(master, ERR, sizeof(ERR) - 1);
		ERR[n > 0 ? n : 0] = '\0';
		close(master);
	}
	close(out);
	close(err);
	return WIFEXITED(STATUS) ? WEXITSTATUS(STATUS) : 128 + WTERMSIG(STATUS);
}

static void expect_exit(int got, int want)
{
	if (got != want)
		fail_msg("kvd exited %d, not %d; stdout:\n%s\nstderr:\n%s", got, want, OUT, ERR);
}

/* The number after label in OUT. */
static double value_after(const char *label)
{
	const char *at = strstr(OUT, label);
	if (!at)
		fail_msg("no '%s' in:\n%s\nstderr:\n%s", label, OUT, ERR);
	return strtod(at + strlen(label), NULL);
}

static void expect_err(const char *want)
{
	if (!strstr(ERR, want))
		fail_msg("no '%s' on stderr:\n%s", want, ERR);
}

/* ---- (a) the 16-bit rows ---- */

static void test_nearest_int(void **state)
{
	(void)state;
	assert_int_equal(ppl_nearest_int(0.5f), 0);
	assert_int_equal(ppl_nearest_int(1.5f), 2);
	assert_int_equal(ppl_nearest_int(2.5f), 2);
	assert_int_equal(ppl_nearest_int(3.5f), 4);
	assert_int_equal(ppl_nearest_int(2.49f), 2);
	assert_int_equal(ppl_nearest_int(2.51f), 3);
	assert_int_equal(ppl_nearest_int(32767.5f), 32768);
	assert_int_equal(ppl_nearest_int(65534.5f), 65534);
	assert_int_equal(ppl_nearest_int(65535.f), 65535);
	assert_int_equal(ppl_nearest_int(-1.5f), -2);
}

static float stored_float(const uint16_t *row, int slot)
{
	float f;
	memcpy(&f, row + slot, sizeof(f));
	return f;
}

/*
 * A range of 65535/8192 makes the scale exactly 2^-13, so every value is
 * hand-computable: (l - min) * 8192, halves rounded to even.
 */
static void test_quantize_exact_scale(void **state)
{
	(void)state;
	const float min = -65535.f / 8192;
	const float l[5] = { 0.f, min, min + 2.5f / 8192, min + 3.5f / 8192, min + 32767.5f / 8192 };
	uint16_t row[10];
	assert_int_equal(ppl_row_slots(5), 10);	/* 4 for the floats, 5 values, 1 pad */
	memset(row, 0xff, sizeof(row));
	double sum = 0;
	for (int i = 0; i < 5; i++)
		sum += expf(l[i]);
	float lse = (float)log(sum);
	float nll = ppl_quantize_row(l, 5, 2, row);
	assert_true(stored_float(row, 0) == 1.f / 8192);
	assert_float_equal(stored_float(row, 2), min - lse, 1e-6);
	assert_int_equal(row[4], 65535);	/* the top */
	assert_int_equal(row[5], 0);		/* the bottom */
	assert_int_equal(row[6], 2);		/* 2.5 to even */
	assert_int_equal(row[7], 4);		/* 3.5 to even */
	assert_int_equal(row[8], 32768);	/* 32767.5 to even */
	assert_int_equal(row[9], 0);		/* the pad of an odd vocabulary */
	assert_float_equal(nll, lse - l[2], 1e-6);
	/* Dequantised: scale * q + min_log_prob, the true log-probability to within a step. */
	for (int i = 0; i < 5; i++) {
		float lp = ppl_row_log_prob(row, (uint32_t)i);
		assert_true(lp == stored_float(row, 0) * row[4 + i] + stored_float(row, 2));
		assert_float_equal(lp, l[i] - lse, 1.0 / 8192);
	}
}

/* Logits more than 16 below the top are clamped: stored as 0, read back at the clamp, ignored by the KLD. */
static void test_quantize_clamp(void **state)
{
	(void)state;
	const float l[4] = { -30.f, 0.f, -16.f, -8.f };
	uint16_t row[8];
	memset(row, 0xff, sizeof(row));
	ppl_quantize_row(l, 4, 1, row);
	double sum = 0;
	for (int i = 0; i < 4; i++)
		sum += expf(l[i]);
	float lse = (float)log(sum);
	assert_true(stored_float(row, 0) == 16.f / 65535.f);
	assert_float_equal(stored_float(row, 2), -16.f - lse, 1e-6);
	assert_int_equal(row[4], 0);		/* -30: below the clamp */
	assert_int_equal(row[5], 65535);
	assert_int_equal(row[6], 0);		/* -16: at the clamp, not above it */
	/* -8: 8 * 65535/16 = 32767.5 in exact math; the float scale puts it at one side. */
	assert_true(row[7] == 32767 || row[7] == 32768);
	assert_true(ppl_row_log_prob(row, 0) <= -16.f);
	/* The row against its own logits: KLD zero but for the quantisation, same top, Δp ~0. */
	struct ppl_kld k = { 0 };
	float kld, pd;
	ppl_kld_add(&k, l, row, 4, 3, &kld, &pd);
	assert_float_equal(kld, 0, 1e-4);
	assert_float_equal(pd, 0, 1e-4);
	assert_int_equal(k.n_same_top, 1);
	assert_int_equal(k.count, 1);
	/* A flat distribution has no range: scale 0 and every value 0. */
	const float flat[4] = { 1.f, 1.f, 1.f, 1.f };
	ppl_quantize_row(flat, 4, 0, row);
	assert_true(stored_float(row, 0) == 0.f);
	assert_int_equal(row[4] | row[5] | row[6] | row[7], 0);
	assert_float_equal(ppl_row_log_prob(row, 2), -logf(4), 1e-6);
}

/* ---- (b) the base file, read back by the same model ---- */

static void read_file(const char *path, void *buf, size_t len)
{
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	size_t got = fread(buf, 1, len, f);
	fclose(f);
	assert_int_equal(got, len);
}

static long file_size(const char *path)
{
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fclose(f);
	return n;
}

static uint32_t model_vocab(void)
{
	struct model *m;
	char err[256];
	if (model_load(&m, fixture_model_path(), err, sizeof(err)))
		fail_msg("%s: %s", fixture_model_path(), err);
	uint32_t v = m->hp.vocab;
	model_free(m);
	return v;
}

static void test_base_file(void **state)
{
	(void)state;
	need_text();
	expect_exit(run_kvd("--perplexity", TEXT, "--ctx", CTX_S, "--chunks", "2", NULL), 0);
	double plain = value_after("Final estimate: PPL = ");
	assert_non_null(strstr(OUT, "[1]"));
	assert_non_null(strstr(OUT, "[2]"));
	assert_null(strstr(OUT, "[3]"));
	expect_err(" tok/s)");
	PPL_PLAIN = plain;

	expect_exit(run_kvd("--perplexity", TEXT, "--ctx", CTX_S, "--chunks", "2",
			    "--kl-divergence-base", BASE, NULL), 0);
	double written = value_after("Final estimate: PPL = ");
	/* The writing run's NLL is llama.cpp's float one, the plain run's double: equal as printed. */
	assert_float_equal(written, plain, 1.5e-4);

	/* The header: magic, n_ctx, n_vocab, n_chunk; then the tokens; then the rows, to the byte. */
	unsigned char h[PPL_HEADER_BYTES];
	read_file(BASE, h, sizeof(h));
	assert_memory_equal(h, "_logits_", 8);
	int32_t v[3];
	memcpy(v, h + 8, sizeof(v));
	assert_int_equal(v[0], CTX);
	assert_int_equal(v[1], model_vocab());
	assert_int_equal(v[2], 2);
	assert_int_equal(file_size(BASE), ppl_file_bytes(CTX, (uint32_t)v[1], 2));
	assert_int_equal(file_size(BASE), 20 + 4 * 2 * CTX + 2 * (2 * ((v[1] + 1) / 2) + 4) * 2 * 63);

	expect_exit(run_kvd("--kl-divergence-base", BASE, "--kl-divergence", NULL), 0);
	double mean_kld = value_after("Mean    KLD: ");
	double same_top = value_after("Same top p: ");
	double ppl_q = value_after("Mean PPL(Q)                   : ");
	print_message("PPL %.4f, mean KLD against itself %.6f, same top %.3f%%\n", plain, mean_kld, same_top);
	/* Only the 16-bit rounding separates the two: a few 1e-6 (llama.cpp shows the same). */
	assert_true(fabs(mean_kld) < 1e-4);
	assert_float_equal(same_top, 100.0, 1e-9);
	assert_float_equal(ppl_q, plain, 1.5e-4);
	assert_non_null(strstr(OUT, "chunk             PPL               ln(PPL(Q)/PPL(base))"));
	assert_non_null(strstr(OUT, "\n   2    "));
	assert_non_null(strstr(OUT, "Maximum KLD: "));
	assert_non_null(strstr(OUT, "99.0%   KLD: "));
	assert_non_null(strstr(OUT, "Median  KLD: "));
	assert_non_null(strstr(OUT, "RMS Δp    : "));

	/* --chunks 1 of the file: its first chunk only, the same value as the table's first line. */
	expect_exit(run_kvd("--kl-divergence-base", BASE, "--kl-divergence", "--chunks", "1", NULL), 0);
	assert_null(strstr(OUT, "\n   2    "));
}

/* ---- (c) base files that are refused ---- */

/* BAD = BASE with len bytes at off replaced (len 0: cut to off bytes). */
static void make_bad(long off, const void *bytes, size_t len)
{
	long n = file_size(BASE);
	char *buf = malloc((size_t)n);
	assert_non_null(buf);
	read_file(BASE, buf, (size_t)n);
	if (len)
		memcpy(buf + off, bytes, len);
	FILE *f = fopen(BAD, "wb");
	size_t w = f ? fwrite(buf, 1, len ? (size_t)n : (size_t)off, f) : 0;
	if (f)
		fclose(f);
	free(buf);
	assert_true(w > 0);
}

static void test_bad_base(void **state)
{
	(void)state;
	need_text();
	if (access(BASE, R_OK))
		expect_exit(run_kvd("--perplexity", TEXT, "--ctx", CTX_S, "--chunks", "2",
				    "--kl-divergence-base", BASE, NULL), 0);
	long n = file_size(BASE);

	make_bad(n - 1000, NULL, 0);
	expect_exit(run_kvd("--kl-divergence-base", BAD, "--kl-divergence", NULL), 1);
	expect_err("it is cut short");

	int32_t vocab = 32000;
	make_bad(12, &vocab, sizeof(vocab));
	expect_exit(run_kvd("--kl-divergence-base", BAD, "--kl-divergence", NULL), 1);
	expect_err("a vocabulary of 32000 tokens; this model's has ");

	make_bad(0, "_logitz_", 8);
	expect_exit(run_kvd("--kl-divergence-base", BAD, "--kl-divergence", NULL), 1);
	expect_err("does not look like a file of log-probabilities");

	uint32_t tok = 0xfffffff0u;
	make_bad(PPL_HEADER_BYTES + 4 * 5, &tok, sizeof(tok));
	expect_exit(run_kvd("--kl-divergence-base", BAD, "--kl-divergence", NULL), 1);
	expect_err("token 5 is 4294967280, outside the vocabulary");

	expect_exit(run_kvd("--kl-divergence-base", BASE, "--kl-divergence", "--ctx", "64", NULL), 1);
	expect_err("was written with chunks of 128 tokens, not --ctx 64");

	/* Too short a text for two chunks: llama-perplexity's message. */
	expect_exit(run_kvd("--perplexity", TEXT, "--ctx", "4096", NULL), 1);
	expect_err("you need at least 8192 tokens to evaluate perplexity with a context of 4096");
	/* A refused writing run leaves no base file behind. */
	unlink(BAD);
	expect_exit(run_kvd("--perplexity", TEXT, "--ctx", "4096", "--kl-divergence-base", BAD, NULL), 1);
	assert_int_not_equal(access(BAD, F_OK), 0);
	/* A write that fails is an error naming the file; a device is not unlinked. */
	expect_exit(run_kvd("--perplexity", TEXT, "--ctx", CTX_S, "--chunks", "2",
			    "--kl-divergence-base", "/dev/full", NULL), 1);
	expect_err("cannot write /dev/full: No space left on device");
	assert_int_equal(access("/dev/full", F_OK), 0);
	expect_exit(run_kvd("--kl-divergence", NULL), 2);
	expect_err("--kl-divergence needs --kl-divergence-base FILE");
}

/* ---- (d) the PPL against a plain loop over the engine ---- */

/* The text's tokens as llama-perplexity takes them: one trailing newline off, BOS as the model wants. */
static uint32_t *text_ids(const struct tokenizer *tok, int *n)
{
	static char text[TEXT_BYTES + 1];
	FILE *f = fopen(TEXT, "rb");
	assert_non_null(f);
	size_t len = fread(text, 1, TEXT_BYTES, f);
	fclose(f);
	if (len && text[len - 1] == '\n')
		len--;
	*n = tokenizer_encode(tok, text, len, tokenizer_add_bos(tok), 0, NULL, 0);
	assert_true(*n >= 2 * CTX);
	uint32_t *ids = malloc((size_t)*n * sizeof(uint32_t));
	assert_non_null(ids);
	assert_int_equal(tokenizer_encode(tok, text, len, tokenizer_add_bos(tok), 0, ids, (size_t)*n), *n);
	return ids;
}

/*
 * Chunk 1, one position per forward pass, -log softmax in double: the
 * definition, with none of the tool's batching or row selection.
 */
static double reference_ppl(void)
{
	char err[256];
	if (fixture_open(&FX, 1, CTX / FIXTURE_BLOCK_TOKENS + 2, 1, err, sizeof(err)))
		fail_msg("%s", err);
	uint32_t vocab = FX.m->hp.vocab;
	int n;
	uint32_t *ids = text_ids(FX.tok, &n);
	LOGITS = malloc((size_t)vocab * sizeof(float));
	assert_non_null(LOGITS);
	struct engine_seq seq;
	engine_seq_init(FX.eng, &seq, 0);
	double nll = 0;
	int count = 0, rc = 0;
	for (uint32_t pos = 0; pos + 1 < CTX && !rc; pos++) {
		uint32_t t = pos == 0 && tokenizer_add_bos(FX.tok) ? tokenizer_bos(FX.tok) : ids[pos];
		struct engine_row r = { &seq, pos, t, 1 };
		if ((rc = engine_forward(FX.eng, &r, 1, LOGITS)) || pos < CTX / 2)
			continue;
		double max = LOGITS[0], sum = 0;
		for (uint32_t i = 1; i < vocab; i++)
			max = LOGITS[i] > max ? LOGITS[i] : max;
		for (uint32_t i = 0; i < vocab; i++)
			sum += exp(LOGITS[i] - max);
		nll += -(LOGITS[ids[pos + 1]] - max - log(sum));
		count++;
	}
	engine_seq_release(FX.eng, &seq);
	free(ids);
	assert_int_equal(rc, 0);
	assert_int_equal(count, ppl_scored(CTX));
	return exp(nll / count);
}

static void test_reference(void **state)
{
	(void)state;
	need_text();
	double ref = reference_ppl();
	expect_exit(run_kvd("--perplexity", TEXT, "--ctx", CTX_S, "--chunks", "1", NULL), 0);
	double ppl = value_after("Final estimate: PPL = ");
	print_message("chunk 1: kvd --perplexity %.4f, plain loop %.6f\n", ppl, ref);
	/* An off-by-one position or a wrong chunk would be far off, not a rounding away. */
	assert_float_equal(ppl, ref, 1.5e-4);
	assert_true(ppl > 1 && ppl < 1000);
	assert_float_equal(value_after("[1]"), ref, 1.5e-4);
	if (PPL_PLAIN > 0)
		assert_true(PPL_PLAIN > 1 && PPL_PLAIN < 1000);
}

/* On a terminal, stderr shows a progress line, taken off again before the end; stdout stays clean. */
static void test_progress(void **state)
{
	(void)state;
	need_text();
	PTY = 1;
	int rc = run_kvd("--perplexity", TEXT, "--ctx", CTX_S, "--chunks", "2", NULL);
	PTY = 0;
	expect_exit(rc, 0);
	if (!strstr(ERR, "\r\033[Kperplexity: chunk 2/2, 256/256 positions"))
		fail_msg("no progress line on the terminal:\n%s", ERR);
	assert_non_null(strstr(ERR, "\r\033[K"));
	assert_null(strchr(OUT, '\r'));
	assert_non_null(strstr(OUT, "[1]"));
	/* Without a terminal, none. */
	expect_exit(run_kvd("--perplexity", TEXT, "--ctx", CTX_S, "--chunks", "2", NULL), 0);
	assert_null(strstr(ERR, "perplexity: chunk"));
}

/* ---- (e) the round trip with llama.cpp's tool ---- */

/*
 * tests/golden/gen_tiny.py made a tiny model (random F32 weights, the
 * default model's tokenizer cut to 512 tokens) and had llama-perplexity
 * write tiny.kld for it over the GPL; it printed the PPL kept in
 * tiny.txt. kvd reads llama.cpp's file and computes the same model: the
 * divergence is only the file's 16-bit rounding.
 */
#define TINY "tests/golden/tiny.gguf"
#define TINY_KLD "tests/golden/tiny.kld"
#define TINY_TXT "tests/golden/tiny.txt"

static double tiny_peer_ppl(void)
{
	FILE *f = fopen(TINY_TXT, "r");
	char line[256];
	double v = -1;
	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "ppl %lf", &v) == 1)
			break;
	if (f)
		fclose(f);
	return v;
}

static void test_peer_file(void **state)
{
	(void)state;
	double peer = tiny_peer_ppl();
	assert_true(peer > 1);
	MODEL = TINY;
	int rc = run_kvd("--kl-divergence-base", TINY_KLD, "--kl-divergence", NULL);
	MODEL = NULL;
	expect_exit(rc, 0);
	double kld = value_after("Mean    KLD: "), top = value_after("Same top p: ");
	double ppl_q = value_after("Mean PPL(Q)                   : ");
	double ppl_base = value_after("Mean PPL(base)                : ");
	print_message("llama-perplexity's file for the tiny model: PPL %.4f (llama.cpp %.4f, from the file "
		      "%.4f), mean KLD %.6f, same top %.3f%%\n", ppl_q, peer, ppl_base, kld, top);
	/* The 16-bit rows' rounding is 16/65535 in a log-probability: a KLD of a few 1e-6. */
	assert_true(fabs(kld) < 1e-4);
	assert_float_equal(top, 100.0, 1e-9);
	/* llama-perplexity prints 4 decimals; both engines' float math sits far inside that. */
	assert_float_equal(ppl_q, peer, 1e-4 * peer);
	assert_float_equal(ppl_base, peer, 1e-3 * peer);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_nearest_int),
		cmocka_unit_test(test_quantize_exact_scale),
		cmocka_unit_test(test_quantize_clamp),
		cmocka_unit_test(test_base_file),
		cmocka_unit_test(test_bad_base),
		cmocka_unit_test(test_reference),
		cmocka_unit_test(test_progress),
		cmocka_unit_test(test_peer_file),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
