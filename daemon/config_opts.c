/* config_opts.c — kvd's option table: each option's name, type, range, where it may be set, and its --help and kvd(8) text. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include "daemon/config.h"
#include "daemon/config_int.h"
#include "kernels/backend.h"

static const char *const levels[] = { "emerg", "alert", "crit", "err", "warning", "notice",
				      "info", "debug", NULL };
static const int level_vals[] = { 0, 1, 2, 3, 4, 5, 6, 7 };
static const char *const kv_types[] = { "f16", "f32", "q8_0", NULL };
static const int kv_type_vals[] = { KB_F16, KB_F32, KB_Q8_0 };
static const char *const bpf_modes[] = { "auto", "on", "off", NULL };
static const int bpf_vals[] = { KVD_BPF_AUTO, KVD_BPF_ON, KVD_BPF_OFF };
static const char *const backends[] = { "auto", "cpu", "cuda", "ref", NULL };
static const int backend_vals[] = { KB_BACKEND_AUTO, KB_BACKEND_CPU, KB_BACKEND_CUDA,
				    KB_BACKEND_REF };

#define O(f) .off = offsetof(struct kvd_options, f)
#define S(f) .off = offsetof(struct kvd_options, srv.f)
#define RANGE(l, h) .lo = l, .hi = h
#define ENUM(n, v) .names = n, .vals = v

const struct cfg_opt config_opts[] = {
	/* modes and in-process generation */
	{ "config", 0, CT_STR, F_CLI, SEC_CONFIG, O(config_path), .arg = "PATH",
	  .help = "configuration file (default $KVD_CONFIG or " CONFIG_DEFAULT_PATH ")",
	  .man = "Read\n.I PATH\ninstead of\n.B $KVD_CONFIG\nor\n.IR /etc/kvd/kvd.conf .\n"
		 "A file named this way must exist; the default file may be missing." },
	{ "print-config", 0, CT_BOOL, F_CLI, SEC_CONFIG, O(print_config),
	  .help = "print each option's value and where it came from, and exit",
	  .man = "Print each option as\n.IB key \" = \" value\n"
		 "followed by its source (default, the file and line, environment, command\n"
		 "line) and whether SIGHUP can change it, then exit." },
	{ "help", 'h', CT_BOOL, F_CLI, SEC_CONFIG, O(help),
	  .help = "print this list and exit",
	  .man = "Print the options and exit." },
	{ "help-man", 0, CT_BOOL, F_CLI, SEC_HIDDEN, O(help_man),
	  .help = "the OPTIONS section of kvd(8) in roff, from this table" },
	{ "info", 0, CT_BOOL, F_CLI, SEC_GEN, O(info),
	  .help = "print the model's metadata and exit",
	  .man = "Print the model's metadata and exit." },
	{ "prompt", 'p', CT_STR, F_CLI, SEC_GEN, O(prompt), .arg = "TEXT",
	  .help = "generate a continuation of TEXT and exit",
	  .man = "Generate a continuation of\n.I TEXT\nand exit. Its KV pool holds this one\n"
		 "request (prompt plus\n.BR \\-\\-n\\-predict ,\nwithin\n.BR \\-\\-ctx ),\n"
		 "whatever\n.B kv\\-mem\nand\n.B kv\\-blocks\nsay: those size the daemon's pool.\n"
		 "A prefill that takes over a second shows its progress on stderr when that is\n"
		 "a terminal." },
	{ "system", 0, CT_STR, F_CLI, SEC_GEN, O(system), .arg = "TEXT",
	  .help = "system message for --chat",
	  .man = "A system message for\n.BR \\-\\-chat ." },
	{ "chat", 0, CT_BOOL, F_CLI, SEC_GEN, O(chat),
	  .help = "wrap the prompt in the model's chat template",
	  .man = "Wrap the prompt in the model's chat template." },
	{ "n-predict", 'n', CT_INT, F_CLI, SEC_GEN, O(n_predict), RANGE(0, 1 << 20), .arg = "N",
	  .help = "tokens to generate (default 128; 0: prefill only)",
	  .man = "Tokens to generate (default 128). 0 only prefills the prompt (so its speed\n"
		 "can be measured) and says so on stderr:\n"
		 ".I prefill only: N prompt positions cached, no tokens generated" },
	{ "temp", 0, CT_F32, F_CLI, SEC_GEN, O(sp.temperature), RANGE(0, 100), .arg = "T",
	  .help = "temperature (default 0: greedy)",
	  .man = "Sampling temperature (default 0: greedy)." },
	{ "top-k", 0, CT_U32, F_CLI, SEC_GEN, O(sp.top_k), RANGE(0, 1 << 24), .arg = "K",
	  .help = "keep the K most likely tokens (0: off)",
	  .man = "Keep the\n.I K\nmost likely tokens (0: off)." },
	{ "top-p", 0, CT_F32, F_CLI, SEC_GEN, O(sp.top_p), RANGE(0, 1), .arg = "P",
	  .help = "nucleus sampling mass (1: off)",
	  .man = "Nucleus sampling: keep the most likely tokens up to probability mass\n.I P\n(1: off)." },
	{ "min-p", 0, CT_F32, F_CLI, SEC_GEN, O(sp.min_p), RANGE(0, 1), .arg = "P",
	  .help = "drop tokens below P x the top probability (0: off)",
	  .man = "Drop tokens below\n.I P\ntimes the top probability (0: off)." },
	{ "repeat-penalty", 0, CT_F32, F_CLI, SEC_GEN, O(sp.repeat_penalty), RANGE(0, 100),
	  .arg = "R", .help = "penalise the last 64 tokens (1: off)",
	  .man = "Penalise the last 64 tokens by\n.I R\n(1: off)." },
	{ "seed", 0, CT_U64, F_CLI, SEC_GEN, O(sp.seed), .arg = "S",
	  .help = "sampler seed (default 0)",
	  .man = "Sampler seed (default 0); the same seed and prompt give the same text." },
	/* measuring accuracy: llama-perplexity's scores and files */
	{ "perplexity", 0, CT_STR, F_CLI, SEC_PPL, O(perplexity), .arg = "FILE",
	  .help = "perplexity of the model on the text in FILE, as\n"
		  "llama-perplexity computes it, and exit",
	  .man = "Print the perplexity of the model on the text in\n.I FILE\n"
		 "the way llama.cpp's\n.B llama\\-perplexity\ndoes: the text (less one trailing\n"
		 "newline) is cut into chunks of\n.B \\-\\-ctx\ntokens (default 512 here, whatever the\n"
		 "configuration file says), each evaluated from an empty sequence with its first\n"
		 "token replaced by BOS when the model wants one; the second half of each chunk is\n"
		 "scored. It prints the running value after each chunk and\n"
		 ".I Final estimate: PPL = N +/- E\non stdout, the speed on stderr, and a progress\n"
		 "line on stderr when that is a terminal. The text must hold at least two chunks." },
	{ "chunks", 0, CT_U32, F_CLI, SEC_PPL, O(chunks), RANGE(0, 1 << 24), .arg = "N",
	  .help = "evaluate the first N chunks (default 0: all)",
	  .man = "Evaluate only the first\n.I N\nchunks of the text or of the base file\n"
		 "(default 0: all)." },
	{ "kl-divergence-base", 0, CT_STR, F_CLI, SEC_PPL, O(kld_base), .arg = "FILE",
	  .help = "with --perplexity: also write every scored position's\n"
		  "log-probabilities to FILE (llama.cpp's format);\n"
		  "with --kl-divergence: read them from it",
	  .man = "With\n.BR \\-\\-perplexity :\nalso write the tokens and every scored position's\n"
		 "log-probabilities to\n.IR FILE ,\nin the format of llama.cpp's\n"
		 ".BR \"llama\\-perplexity \\-\\-kl\\-divergence\\-base\" ,\n"
		 "so either program can read it. With\n.BR \\-\\-kl\\-divergence :\nread it." },
	{ "kl-divergence", 0, CT_BOOL, F_CLI, SEC_PPL, O(kld),
	  .help = "compare the model with the base file: KL divergence,\n"
		  "perplexity ratio, token probabilities, same top token",
	  .man = "Evaluate the tokens of the\n.B \\-\\-kl\\-divergence\\-base\nfile (its chunk size is\n"
		 "the context; a different\n.B \\-\\-ctx\nis refused, as is a file made for another\n"
		 "vocabulary or cut short) and compare the model's distributions with the\n"
		 "file's, printing what llama\\-perplexity prints: per chunk PPL, ln(PPL ratio),\n"
		 "KL divergence, RMS \\(*Dp and same top p, then the statistics (mean KLD, its\n"
		 "percentiles, median, maximum, \\(*Dp percentiles, RMS \\(*Dp, same top p)." },
	/* the model, compute and the KV pool */
	{ "model", 'm', CT_STR, 0, SEC_MODEL, O(model), .arg = "PATH",
	  .help = "GGUF model (default $KVD_MODEL, else " CONFIG_MODEL_FILE "\n"
		  "in the first of $STATE_DIRECTORY/models (or /var/lib/kvd/models),\n"
		  "PREFIX/share/kvd/models and the source tree's models/)",
	  .man = "The GGUF model. Without it (and without\n.BR KVD_MODEL ),\nkvd uses the first of\n"
		 ".IR $STATE_DIRECTORY/models/SmolLM2\\-135M\\-Instruct.Q4_1.gguf\n"
		 "(systemd sets\n.B STATE_DIRECTORY\nfor kvd.service;\n.I /var/lib/kvd/models/\n"
		 "without it),\n.I PREFIX/share/kvd/models/\n(the install prefix's, where\n"
		 ".B make install\nputs the model\n.B make model\nfetched) and the\n.I models/\n"
		 "folder of the source tree kvd was built in (found from the binary's own path,\n"
		 "so\n.B build/kvd\nworks from any directory) that holds that file; never the\n"
		 "current directory. When none does, kvd names the places it looked and exits 1.\n"
		 "A relative\n.I PATH\nis taken from the current directory." },
	{ "chat-template", 0, CT_STR, 0, SEC_MODEL, O(chat_template), .arg = "NAME",
	  .help = "chat template to use instead of the model's: chatml, llama3,\n"
		  "llama2, phi3, gemma, mistral or zephyr",
	  .man = "Render chat prompts with the built-in template\n.I NAME\n"
		 "instead of the model's own\n.RB ( tokenizer.chat_template ):\n"
		 ".B chatml\n(OpenHermes 2.5),\n.B llama3\n(Meta Llama 3 Instruct),\n"
		 ".B llama2\n(Llama 2 chat),\n.B phi3\n(Phi 3.5 mini),\n.B gemma\n(Gemma 2),\n"
		 ".B mistral\n(Mistral Nemo) or\n.B zephyr\n(Zephyr 7B beta), each its model's own text.\n"
		 "kvd runs a model's template with its own Jinja interpreter, as Hugging Face's\n"
		 "apply_chat_template does; a template that uses what the interpreter lacks is\n"
		 "refused when the model loads, naming the construct, unless this option is set." },
	{ "backend", 0, CT_ENUM, 0, SEC_DAEMON, O(backend), ENUM(backends, backend_vals), .arg = "B",
	  .help = "auto (CUDA when a device is present), cpu, cuda, or ref\n"
		  "(exact f32/f64 reference, one thread, slow; f32 KV by default)",
	  .man = ".B auto\n(CUDA when a device is present, else the CPU),\n.BR cpu ,\n.B cuda\nor\n.BR ref .\n"
		 "A kvd built without the CUDA backend refuses\n.BR cuda .\n"
		 ".B ref\nis the exact reference the fast kernels are measured against: weights\n"
		 "dequantized to f32, activations never quantized, every sum in f64, on one\n"
		 "thread and many times slower than\n.BR cpu ;\n"
		 "its KV cache is f32 unless\n.B kv\\-type\nis set (f16 and q8_0 are then stored as\n"
		 "asked and read back exactly).\n.B auto\nnever picks it." },
	{ "no-backend-check", 0, CT_BOOL, 0, SEC_DAEMON, O(no_backend_check),
	  .help = "start a device backend without checking it against the CPU",
	  .man = "Do not check a device backend against the CPU before using it. By default,\n"
		 "when the backend is not the CPU (CUDA), kvd first runs layer 0 of the model\n"
		 "on a few rows operation by operation, and the distributions of a short prompt\n"
		 "through both backends, and compares them (a few seconds, and for that time the\n"
		 "CPU's copy of the weights too); if they differ it says why and, with\n"
		 ".B backend = auto\n(the default), runs on the CPU instead; with\n"
		 ".B backend = cuda\nit refuses to start." },
	{ "threads", 't', CT_U32, 0, SEC_MODEL, O(threads), RANGE(0, 1024), .arg = "N",
	  .help = "compute threads (default 0: all cores)",
	  .man = "Compute threads (default 0: one per core)." },
	{ "ctx", 0, CT_U32, 0, SEC_MODEL, O(ctx), RANGE(0, 1 << 24), .arg = "N",
	  .help = "positions a sequence may use, at most the model's trained\n"
		  "context, or what its RoPE scaling reaches (default 0: the trained)",
	  .man = "Positions one sequence may use: prompt, generated tokens and everything a\n"
		 "session's slot keeps (default 0: the model's trained context,\n"
		 ".B kvd \\-\\-info\nshows it). Requests that need more fail with E2BIG, the\n"
		 "HELLO reply's\n.B ctx_len\n(which\n.B kvctl info\nprints) is it, and\n"
		 ".B \\-\\-prompt\nobeys it. A value above the trained context is refused\n"
		 "(positions past it would give garbage), unless the file has linear or\n"
		 "YaRN RoPE scaling by a factor f: then up to the original context times f." },
	{ "kv-mem", 0, CT_SIZE, 0, SEC_MODEL, O(kv_mem), .arg = "BYTES",
	  .help = "KV-cache pool size (suffix K, M, G; default: 64k tokens)",
	  .man = "KV pool size, with an optional K, M or G suffix (default: room for 65536 tokens)." },
	{ "kv-blocks", 0, CT_U32, 0, SEC_MODEL, O(kv_blocks), RANGE(0, 1u << 30), .arg = "N",
	  .help = "KV-cache pool size in blocks (instead of --kv-mem)",
	  .man = "KV pool size in blocks, instead of\n.BR \\-\\-kv\\-mem ." },
	{ "kv-block-tokens", 0, CT_POW2, 0, SEC_MODEL, O(kv_block_tokens), RANGE(1, 1024),
	  .arg = "N", .help = "tokens per KV block, a power of two (default 16)",
	  .man = "Tokens per block, a power of two (default 16)." },
	{ "kv-type", 0, CT_ENUM, 0, SEC_MODEL, O(kv_type), ENUM(kv_types, kv_type_vals), .arg = "T",
	  .help = "K/V element type: f16 (default), f32, q8_0",
	  .man = "K/V element type:\n.B f16\n(default),\n.B f32\nor\n.BR q8_0 ." },
	{ "kv-prefault", 0, CT_BOOL, 0, SEC_MODEL, O(kv_prefault),
	  .help = "commit the KV pool's memory at start (default: on first use)",
	  .man = "Commit all of the KV pool's memory at start, as llama.cpp does with its\n"
		 "cache, instead of page by page as blocks are first written: the whole pool\n"
		 "counts in the daemon's resident memory from the start and start-up takes\n"
		 "longer (the default pool: 1.4 GiB, about 3 s here), but no step waits on\n"
		 "the kernel clearing fresh pages (16 clients, 128/128, on a fresh daemon\n"
		 "here: about a quarter more output tokens per second). A device's pool is\n"
		 "allocated whole either way." },
	{ "prefix-global", 0, CT_BOOL, 0, SEC_MODEL, S(prefix_global),
	  .help = "share cached prompt prefixes across users (default: per uid)",
	  .man = "Share cached prompt prefixes between users (default: per uid, so one user\n"
		 "cannot learn another's prompts by timing)." },
	{ "no-prefix-cache", 0, CT_BOOL, F_LIVE, SEC_DAEMON, S(no_prefix_cache),
	  .help = "never reuse cached prompt prefixes",
	  .man = "Never reuse cached prompt prefixes." },
	/* KV that survives a restart */
	{ "no-persist", 0, CT_BOOL, 0, SEC_DAEMON, S(no_persist),
	  .help = "do not keep the KV pool and sessions across a restart",
	  .man = "Do not keep the KV pool, the prefix cache and the sessions across a\n"
		 "restart. By default kvd keeps them in two memfds it hands to systemd's\n"
		 "file-descriptor store (kvd.service sets\n.BR FileDescriptorStoreMax= )\n"
		 "or, with\n.BR \\-\\-state\\-dir ,\nin files; after a restart or a crash,\n"
		 "clients reopen their sessions by token and find their KV there." },
	{ "state-dir", 0, CT_STR, 0, SEC_DAEMON, S(state_dir), .arg = "DIR",
	  .help = "keep the KV pool and sessions in DIR/kvpool and DIR/kvstate\n"
		  "(use a tmpfs: the pool file is as large as the pool)",
	  .man = "Keep the KV pool and the session state as the files\n.I DIR/kvpool\nand\n"
		 ".IR DIR/kvstate ,\nfor running without systemd's file-descriptor store\n"
		 "(a crash then a manual start resumes the same way). Put\n.I DIR\n"
		 "on a tmpfs such as\n.IR /run :\nthe pool file is as large as the pool, and\n"
		 "a disk would be written to. One kvd at a time may use a directory." },
	{ "state-records", 0, CT_U32, 0, SEC_DAEMON, S(state_records), RANGE(1, 1 << 20),
	  .arg = "N", .help = "sequence slots the kept state holds, all sessions together (default 1024)",
	  .man = "Sequence slots the kept state can describe, all sessions together\n"
		 "(default 1024). Each takes 4 bytes per context position, paid in memory\n"
		 "only as it is used; a session's slot beyond them is not kept." },
	{ "resume-timeout", 0, CT_U32, F_LIVE, SEC_DAEMON, S(resume_timeout_s), RANGE(1, 1 << 24),
	  .arg = "S", .help = "let go of a restored session nobody reopens after S seconds (default 600)",
	  .man = "A session restored at start that no client reopens within\n.I S\n"
		 "seconds (default 600) is let go: its blocks stay in the prefix cache." },
	/* the service */
	{ "socket", 0, CT_STR, 0, SEC_DAEMON, S(socket_path), .arg = "PATH",
	  .help = "endpoint (default $RUNTIME_DIRECTORY/kvd.sock under systemd,\n"
		  "/run/kvd/kvd.sock as root, else $XDG_RUNTIME_DIR/kvd.sock);\n"
		  "a socket passed by systemd (kvd.socket) takes precedence",
	  .man = "The socket to bind. Default:\n.I $RUNTIME_DIRECTORY/kvd.sock\nwhen systemd sets\n"
		 ".B RUNTIME_DIRECTORY\n(kvd.service does),\n.I /run/kvd/kvd.sock\nas root, else\n"
		 ".IR $XDG_RUNTIME_DIR/kvd.sock .\nA socket passed by systemd (socket activation,\n"
		 ".BR sd_listen_fds (3))\nis used instead, and is left in place on exit." },
	{ "socket-group", 0, CT_STR, 0, SEC_DAEMON, O(socket_group), .arg = "NAME",
	  .help = "group that may connect (the socket is mode 0660)",
	  .man = "Give a socket kvd binds itself to group\n.IR NAME ." },
	{ "log-level", 0, CT_ENUM, F_LIVE, SEC_DAEMON, O(log_level), ENUM(levels, level_vals),
	  .arg = "L", .help = "err, warning, notice (default), info, debug",
	  .man = ".BR err \", \" warning \", \" notice \" (default), \" info \" or \" debug ." },
	{ "bpf", 0, CT_ENUM, 0, SEC_DAEMON, O(bpf), ENUM(bpf_modes, bpf_vals), .arg = "MODE",
	  .help = "metrics programs on the USDT probes: auto (default: load\n"
		  "when CAP_BPF is held), on (failure is fatal), off",
	  .man = "BPF observability on the daemon's USDT probes:\n.B auto\n"
		 "loads the programs when CAP_BPF is held,\n.B on\nmakes a failure to load fatal,\n"
		 ".B off\nnever loads them. See\n.BR kvtop (8)." },
	{ "instance", 0, CT_STR, 0, SEC_DAEMON, O(instance), .arg = "NAME",
	  .help = "name of this daemon's BPF pin directory,\n"
		  "/sys/fs/bpf/kvd/NAME (default: after the socket,\n"
		  "\"kvd\" for /run/kvd/kvd.sock); kvtop --instance NAME",
	  .man = "Pin the BPF metrics maps under\n.IR /sys/fs/bpf/kvd/NAME ,\n"
		 "1 to 48 letters, digits, '_', '.' or '\\-', not starting with '.'.\n"
		 "Default: named after the socket, so each daemon has its own (see\n"
		 ".B KVD_BPF_PIN_DIR\nbelow)." },
	{ "drain-timeout", 0, CT_U32, F_LIVE, SEC_DAEMON, S(drain_timeout_ms), RANGE(0, 3600000),
	  .arg = "MS", .help = "on SIGTERM, finish in-flight work for at most MS (default 5000)",
	  .man = "On SIGTERM or SIGINT, finish requests in flight for at most\n.I MS\n"
		 "milliseconds (default 5000)." },
	{ "max-sessions", 0, CT_U32, F_LIVE, SEC_DAEMON, S(max_sessions), RANGE(1, SRV_MAX_SESSIONS),
	  .arg = "N", .help = "sessions per connection (default 16)",
	  .man = "Sessions per connection (1\\(en64, default 16)." },
	{ "max-slots", 0, CT_U32, 0, SEC_DAEMON, S(max_slots), RANGE(1, SRV_MAX_SLOTS), .arg = "N",
	  .help = "sequence slots per session (default 8)",
	  .man = "Sequence slots per session (1\\(en64, default 8)." },
	{ "max-tokens", 0, CT_U32, F_LIVE, SEC_DAEMON, S(max_tokens), RANGE(1, 1 << 24), .arg = "N",
	  .help = "prompt plus generated tokens per request (default 8192)",
	  .man = "Prompt plus generated tokens of one request (default 8192)." },
	{ "max-inflight", 0, CT_U32, F_LIVE, SEC_DAEMON, S(max_inflight), RANGE(1, 1 << 20),
	  .arg = "N", .help = "requests in flight per connection (default 256)",
	  .man = "Requests in flight per connection (default 256)." },
	{ "max-uid-connections", 0, CT_U32, F_LIVE, SEC_DAEMON, S(max_uid_conns), RANGE(1, 1 << 20),
	  .arg = "N", .help = "connections of one uid (default 64)",
	  .man = "Connections one uid may hold at once (default 64). One more is refused with "
		 "EMFILE, so no uid can use up the daemon's file descriptors." },
	{ "max-uid-sessions", 0, CT_U32, F_LIVE, SEC_DAEMON, S(max_uid_sessions), RANGE(1, 1 << 20),
	  .arg = "N", .help = "sessions of all connections of one uid (default 64)",
	  .man = "Sessions over all connections of one uid (default 64)." },
	{ "max-uid-inflight", 0, CT_U32, F_LIVE, SEC_DAEMON, S(max_uid_inflight), RANGE(1, 1 << 24),
	  .arg = "N", .help = "requests in flight of all connections of one uid\n(default 1024)",
	  .man = "Requests in flight over all connections of one uid (default 1024)." },
	{ "max-uid-arena", 0, CT_SIZE, F_LIVE, SEC_DAEMON, S(max_uid_arena), RANGE(1, 0),
	  .arg = "BYTES", .help = "session arena bytes of all connections of one uid\n(default 1G)",
	  .man = "Session arena bytes over all connections of one uid, with an optional K,\n"
		 "M or G suffix (default 1G)." },
	{ "max-batch-tokens", 0, CT_U32, 0, SEC_DAEMON, S(max_batch_rows), RANGE(1, 1 << 16),
	  .arg = "N", .help = "rows per engine step (default 32: every decoder\n"
			      "waits for a step's prefill rows, ~2 ms each on a\n"
			      "2-core CPU, so short steps keep token gaps even)",
	  .man = "Rows (prefill positions plus decodes) in one engine step (default 32)." },
	{ "kv-quota", 0, CT_U32, F_LIVE, SEC_DAEMON, S(kv_quota), RANGE(0, 1u << 30), .arg = "BLOCKS",
	  .help = "KV blocks one uid may hold (default 0: no quota)",
	  .man = "KV blocks one uid may hold; a uid over it preempts its own newest sequence\n"
		 "or waits (default 0: no quota)." },
};
const size_t config_n_opts = sizeof(config_opts) / sizeof(config_opts[0]);
_Static_assert(sizeof(config_opts) / sizeof(config_opts[0]) <= CONFIG_MAX_OPTS,
	       "raise CONFIG_MAX_OPTS");

/* ---- the option list, for --help and kvd(8) ---- */

static const struct {
	const char *help;	/* --help's heading; NULL: none */
	const char *man;	/* the man page's .SS title */
	const char *note;	/* --help's lines after the section, or NULL */
} sections[SEC_LAST] = {
	[SEC_CONFIG] = { NULL, "Configuration", NULL },
	[SEC_DAEMON] = { "daemon:", "Daemon",
			 "  SIGHUP re-reads the file: log-level, the max-* limits, kv-quota, drain-timeout\n"
			 "  and no-prefix-cache change live; the rest is logged as needing a restart.\n" },
	[SEC_MODEL] = { "model and KV cache:", "Model and KV cache", NULL },
	[SEC_GEN] = { "in-process generation (command line only):",
		      "In-process generation (command line only)", NULL },
	[SEC_PPL] = { "measuring accuracy (command line only):",
		      "Measuring accuracy (command line only)", NULL },
};

#define HELP_COL 26	/* where --help's descriptions start */

static void usage_option(const struct cfg_opt *t, FILE *f)
{
	char flag[64];
	int n = snprintf(flag, sizeof(flag), "--%s%s%s", t->name, t->arg ? " " : "",
			 t->arg ? t->arg : "");
	if (t->short_opt)
		fprintf(f, "  -%c, %s", t->short_opt, flag);
	else
		fprintf(f, "      %s", flag);
	/* A name too long for the column gets one space; a description always follows. */
	fprintf(f, "%*s", n + 6 < HELP_COL ? HELP_COL - 6 - n : 1, "");
	for (const char *l = t->help; *l;) {
		const char *nl = strchr(l, '\n');
		int len = nl ? (int)(nl - l) : (int)strlen(l);
		fprintf(f, "%s%.*s\n", l == t->help ? "" : "                          ", len, l);
		l += len + (nl != NULL);
	}
}

void config_usage(FILE *f)
{
	fprintf(f,
		"usage: kvd [--model PATH] [daemon options]      serve clients on a socket\n"
		"       kvd [--model PATH] --prompt TEXT [options]  generate in-process and exit\n"
		"       kvd [--model PATH] --perplexity FILE [--ctx N] [--chunks N]\n"
		"           [--kl-divergence-base FILE [--kl-divergence]]  score a text and exit\n"
		"       kvd [--model PATH] --info\n"
		"       kvd [options] --print-config                 show the effective configuration\n"
		"\n"
		"Every daemon option can also be set in the configuration file as\n"
		"`name = value` (see kvd.conf(5)); the command line wins over the file.\n");
	for (int sec = 0; sec < SEC_HIDDEN; sec++) {
		if (sections[sec].help)
			fprintf(f, "\n%s\n", sections[sec].help);
		for (size_t i = 0; i < config_n_opts; i++)
			if (config_opts[i].sec == sec)
				usage_option(&config_opts[i], f);
		if (sections[sec].note)
			fputs(sections[sec].note, f);
	}
}

/* s with roff's hyphen escaped, as option names are set in a man page. */
static void man_name(FILE *f, const char *s)
{
	for (; *s; s++)
		fprintf(f, *s == '-' ? "\\-" : "%c", *s);
}

static void man_option(const struct cfg_opt *t, FILE *f)
{
	/* .B/.BR for a flag, .BI for one with a value: roman commas, italic value names. */
	fprintf(f, ".TP\n.B%s ", t->arg ? "I" : t->short_opt ? "R" : "");
	if (t->short_opt)
		fprintf(f, "\\-%c \", \" ", t->short_opt);
	fputs("\\-\\-", f);
	man_name(f, t->name);
	if (t->arg)
		fprintf(f, " \" %s\"", t->arg);
	fprintf(f, "\n%s\n", t->man);
}

void config_man(FILE *f)
{
	fputs(".SH OPTIONS\n", f);
	for (int sec = 0; sec < SEC_HIDDEN; sec++) {
		fprintf(f, ".SS %s\n", sections[sec].man);
		for (size_t i = 0; i < config_n_opts; i++)
			if (config_opts[i].sec == sec)
				man_option(&config_opts[i], f);
	}
}
