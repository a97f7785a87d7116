/*
 * fuzz_gguf.c — the GGUF reader on mutated files: parse from memory, read
 * every key through the typed getters, build a tokenizer from the metadata
 * and load the result as a model (through /proc/self/fd of a memfd, the
 * path model_load() takes). Seeds are small real-format files: the default
 * model's own metadata with its vocabulary cut short and tiny tensors.
 */
#include <sys/mman.h>
#include "tests/fuzz/harness.h"
#include "daemon/model/gguf.h"

static void read_everything(const struct gguf_file *f)
{
	for (uint64_t i = 0; i < f->n_kv; i++) {
		const struct gguf_kv *kv = &f->kv[i];
		char key[128];
		size_t n = kv->key.len < sizeof(key) - 1 ? kv->key.len : sizeof(key) - 1;
		memcpy(key, kv->key.ptr, n);
		key[n] = 0;
		uint32_t u;
		float x;
		int b;
		struct gguf_str s;
		const void *arr;
		uint64_t len;
		gguf_get_u32(f, key, &u);
		gguf_get_f32(f, key, &x);
		gguf_get_bool(f, key, &b);
		if (!gguf_get_str(f, key, &s) && s.len && s.ptr[s.len - 1] == 0x7f)
			b = 0;	/* touch both ends of the string */
		if (kv->type == GGUF_VT_ARRAY &&
		    !gguf_get_arr(f, key, kv->arr_type, &arr, &len) && kv->arr_type == GGUF_VT_STRING)
			for (uint64_t k = 0; k < len && k < 64; k++)
				s = gguf_arr_str(kv, len - 1 - k);
	}
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		const struct gguf_tensor *t = &f->tensors[i];
		volatile uint8_t sink;
		/* The reader promised the whole tensor lies inside the mapping. */
		if (t->size)
			sink = ((const uint8_t *)t->data)[t->size - 1];
		(void)sink;
	}
}

static void tokenize(const struct gguf_file *f)
{
	struct tokenizer *t;
	char err[256];
	if (tokenizer_create(&t, f, err, sizeof(err)))
		return;
	static const char text[] = "Hello world, <|im_start|>user\n\xf0\x9f\x98\x80 12345";
	uint32_t ids[64];
	int n = tokenizer_encode(t, text, sizeof(text) - 1, 1, 1, ids, 64);
	if (n > 64)
		n = 64;
	char out[512];
	if (n > 0)
		tokenizer_decode(t, ids, (size_t)n, out, sizeof(out));
	tokenizer_chat_format(t, &(struct chat_msg){ "user", "hi" }, 1, 1, out, sizeof(out));
	for (uint32_t i = 0; i < tokenizer_vocab_size(t) && i < 300; i++)
		tokenizer_token_bytes(t, i, 1, out, sizeof(out));
	tokenizer_destroy(t);
}

static void load_model(const uint8_t *data, size_t size)
{
	int fd = memfd_create("fuzz-gguf", MFD_CLOEXEC);
	if (fd < 0)
		return;
	if (write(fd, data, size) == (ssize_t)size) {
		char path[64], err[256];
		struct model *m;
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		if (!model_load(&m, path, err, sizeof(err)))
			model_free(m);
	}
	close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct gguf_file *f;
	char err[256];
	log_set_level(LOG_ERR);
	if (gguf_open_mem(&f, data, size, err, sizeof(err)))
		return 0;
	read_everything(f);
	tokenize(f);
	gguf_close(f);
	load_model(data, size);
	return 0;
}
