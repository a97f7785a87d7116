/* chat.c — chat prompt rendering for the template families kvd recognises (ChatML, Llama 2, Llama 3). */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/model/gguf.h"
#include "daemon/tokenizer/tokenizer_int.h"

static const char *find(const char *s, size_t n, const char *needle)
{
	return memmem(s, n, needle, strlen(needle));
}

/*
 * ChatML templates that insert a default system prompt spell it as a
 * literal: '<|im_start|>system\n<prompt><|im_end|>'. Take the first such
 * literal whose text has no template syntax in it, undoing Jinja escapes.
 */
static int chatml_default_system(struct tokenizer *t, const char *s, size_t n)
{
	static const char open[] = "<|im_start|>system";
	const char *end = s + n, *p = s;

	while ((p = find(p, (size_t)(end - p), open))) {
		const char *q = p + sizeof(open) - 1, *close;
		char *out;
		size_t w = 0;

		p = q;
		if (end - q >= 2 && q[0] == '\\' && q[1] == 'n')
			q += 2;
		else if (q < end && q[0] == '\n')
			q++;
		else
			continue;
		close = find(q, (size_t)(end - q), "<|im_end|>");
		if (!close || close == q)
			continue;
		if (memchr(q, '{', (size_t)(close - q)) || memchr(q, '}', (size_t)(close - q)) ||
		    memchr(q, '\'', (size_t)(close - q)) || memchr(q, '"', (size_t)(close - q)))
			continue;
		out = malloc((size_t)(close - q) + 1);
		if (!out)
			return -ENOMEM;
		for (const char *c = q; c < close; c++) {
			if (c[0] == '\\' && c + 1 < close) {
				c++;
				out[w++] = c[0] == 'n' ? '\n' : c[0] == 't' ? '\t' : c[0];
			} else {
				out[w++] = c[0];
			}
		}
		out[w] = 0;
		t->chat_system = out;
		t->chat_system_len = w;
		return 0;
	}
	return 0;
}

int tok_chat_init(struct tokenizer *t, const struct gguf_file *f)
{
	struct gguf_str tmpl;

	t->chat = CHAT_NONE;
	if (gguf_get_str(f, "tokenizer.chat_template", &tmpl) != 0)
		return 0;
	if (find(tmpl.ptr, tmpl.len, "<|im_start|>")) {
		t->chat = CHAT_CHATML;
		return chatml_default_system(t, tmpl.ptr, tmpl.len);
	}
	if (find(tmpl.ptr, tmpl.len, "<|start_header_id|>"))
		t->chat = CHAT_LLAMA3;
	else if (find(tmpl.ptr, tmpl.len, "[INST]"))
		t->chat = CHAT_LLAMA2;
	return 0;
}

/*
 * Output that counts every byte and stores what fits below cap - 1; with
 * spans, where each message's text landed (in the order put).
 */
struct sbuf {
	char *p;
	size_t cap, n;
	struct tok_span *spans;
	size_t n_spans;
};

static void put(struct sbuf *b, const char *s, size_t n)
{
	if (b->n < b->cap) {
		size_t room = b->cap - 1 - b->n;

		memcpy(b->p + b->n, s, n < room ? n : room);
	}
	b->n += n;
}

static void puts_(struct sbuf *b, const char *s)
{
	put(b, s, strlen(s));
}

/* A message's own text, as opposed to the template's: its span is recorded. */
static void put_msg(struct sbuf *b, const char *s, size_t n)
{
	if (b->spans)
		b->spans[b->n_spans++] = (struct tok_span){ b->n, n };
	put(b, s, n);
}

static int is_space(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static void put_trimmed(struct sbuf *b, const char *s)
{
	size_t n = strlen(s);

	while (n && is_space(*s))
		s++, n--;
	while (n && is_space(s[n - 1]))
		n--;
	put_msg(b, s, n);
}

/* next: a later turn, which gets no default system prompt. */
static void render_chatml(const struct tokenizer *t, const struct chat_msg *m, size_t n,
			  int add_assistant, int next, struct sbuf *b)
{
	for (size_t i = 0; i < n; i++) {
		if (i == 0 && !next && t->chat_system && strcmp(m[0].role, "system") != 0) {
			puts_(b, "<|im_start|>system\n");
			put(b, t->chat_system, t->chat_system_len);
			puts_(b, "<|im_end|>\n");
		}
		puts_(b, "<|im_start|>");
		puts_(b, m[i].role);
		puts_(b, "\n");
		put_msg(b, m[i].content, strlen(m[i].content));
		puts_(b, "<|im_end|>\n");
	}
	if (add_assistant)
		puts_(b, "<|im_start|>assistant\n");
}
/* BOS comes from the tokenizer (add_bos), so the text does not repeat it. */
static void render_llama3(const struct chat_msg *m, size_t n, int add_assistant, struct sbuf *b)
{
	for (size_t i = 0; i < n; i++) {
		puts_(b, "<|start_header_id|>");
		puts_(b, m[i].role);
		puts_(b, "<|end_header_id|>\n\n");
		put_trimmed(b, m[i].content);
		puts_(b, "<|eot_id|>");
	}
	if (add_assistant)
		puts_(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/*
 * Meta's format: [INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {answer} </s><s>[INST] ...
 * The first <s> comes from add_bos; the model answers after [/INST].
 */
static void render_llama2(const struct chat_msg *m, size_t n, struct sbuf *b)
{
	int in_turn = 1;

	puts_(b, "[INST] ");
	for (size_t i = 0; i < n; i++) {
		if (!in_turn) {
			puts_(b, "<s>[INST] ");
			in_turn = 1;
		}
		if (strcmp(m[i].role, "system") == 0) {
			puts_(b, "<<SYS>>\n");
			put_trimmed(b, m[i].content);
			puts_(b, "\n<</SYS>>\n\n");
		} else if (strcmp(m[i].role, "user") == 0) {
			put_trimmed(b, m[i].content);
			puts_(b, " [/INST]");
		} else {
			puts_(b, " ");
			put_trimmed(b, m[i].content);
			puts_(b, " </s>");
			in_turn = 0;
		}
	}
}

/*
 * msgs in the model's template into b: a whole conversation, or with next
 * the turns that continue one whose last answer ended with its end-of-turn
 * token (no default system prompt then). 0, -EINVAL or -ENOTSUP.
 */
static int render(const struct tokenizer *t, const struct chat_msg *msgs, size_t n,
		  int add_assistant, int next, struct sbuf *b)
{
	for (size_t i = 0; i < n; i++)
		if (!msgs[i].role || !msgs[i].content)
			return -EINVAL;
	switch (t->chat) {
	case CHAT_CHATML:
		if (next)
			puts_(b, "\n");
		render_chatml(t, msgs, n, add_assistant, next, b);
		break;
	case CHAT_LLAMA3:
		render_llama3(msgs, n, add_assistant, b);
		break;
	case CHAT_LLAMA2:
		if (next)
			puts_(b, "<s>");
		render_llama2(msgs, n, b);
		break;
	default:
		return -ENOTSUP;
	}
	return 0;
}

static int render_out(const struct tokenizer *t, const struct chat_msg *msgs, size_t n,
		      int add_assistant, int next, char *out, size_t cap)
{
	struct sbuf b = { out, out ? cap : 0, 0, NULL, 0 };
	int ret = render(t, msgs, n, add_assistant, next, &b);

	if (ret)
		return ret;
	if (b.cap)
		b.p[b.n < b.cap ? b.n : b.cap - 1] = 0;
	return b.n > INT_MAX ? -EOVERFLOW : (int)b.n;
}

int tokenizer_chat_format(const struct tokenizer *t, const struct chat_msg *msgs,
			  size_t n, int add_assistant, char *out, size_t cap)
{
	return render_out(t, msgs, n, add_assistant, 0, out, cap);
}

int tokenizer_chat_next_turn(const struct tokenizer *t, const char *content, char *out, size_t cap)
{
	if (!content)
		return -EINVAL;
	return render_out(t, &(struct chat_msg){ "user", content }, 1, 1, 1, out, cap);
}

int tokenizer_chat_encode(const struct tokenizer *t, const struct chat_msg *msgs, size_t n,
			  unsigned flags, uint32_t *out, size_t cap)
{
	int next = (flags & TOK_CHAT_NEXT_TURN) != 0;
	int need = render_out(t, msgs, n, 1, next, NULL, 0);
	struct sbuf b = { NULL, 0, 0, NULL, 0 };
	int ret = -ENOMEM;

	if (need < 0)
		return need;
	b.cap = (size_t)need + 1;
	b.p = malloc(b.cap);
	/* Each message has one span (none for an empty one, which is harmless). */
	b.spans = malloc((n ? n : 1) * sizeof(*b.spans));
	if (b.p && b.spans && !(ret = render(t, msgs, n, 1, next, &b))) {
		int add_bos = !next && tokenizer_add_bos(t);
		size_t n_plain = flags & TOK_CHAT_SPECIAL ? 0 : b.n_spans;

		/* The template's markers are control tokens; the messages' text is plain unless asked. */
		ret = tok_encode_masked(t, b.p, b.n, add_bos, 1, b.spans, n_plain, out, cap);
	}
	free(b.p);
	free(b.spans);
	return ret;
}
