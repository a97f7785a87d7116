/* chat.c — chat prompts: the model's Jinja chat template (or a built-in one) run on a conversation, and its encoding. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/model/gguf.h"
#include "daemon/tokenizer/jinja.h"
#include "daemon/tokenizer/tokenizer_int.h"

/* A special token's text for the template (bos_token, eos_token); "" if none. */
static void token_text(const struct tokenizer *t, uint32_t id, char *buf, size_t cap)
{
	int n = id == TOK_NONE ? 0 : tokenizer_token_bytes(t, id, 1, buf, cap - 1);

	buf[n > 0 && (size_t)n < cap ? n : 0] = 0;
}

struct chat_tokens {
	char bos[128], eos[128];
};

static void chat_tokens(const struct tokenizer *t, struct chat_tokens *k)
{
	token_text(t, t->bos, k->bos, sizeof(k->bos));
	token_text(t, t->eos, k->eos, sizeof(k->eos));
}

static int render_with(const struct tokenizer *t, const struct jinja_tmpl *tmpl,
		       const struct chat_msg *msgs, size_t n, int add_gen, struct jinja_out *o,
		       char *err, size_t errlen)
{
	struct chat_tokens k;
	struct jinja_msg *m = malloc((n ? n : 1) * sizeof(*m));
	int rc;

	if (!m)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		m[i] = (struct jinja_msg){ msgs[i].role, msgs[i].content };
	chat_tokens(t, &k);
	struct jinja_ctx c = { m, n, k.bos, k.eos, add_gen, -1, 0 };

	rc = jinja_render(tmpl, &c, o, err, errlen);
	free(m);
	return rc;
}

/* A template that cannot run these conversations is refused; one that raises on them is its rule. */
static int probe(const struct tokenizer *t, const struct jinja_tmpl *tmpl, char *err, size_t errlen)
{
	static const struct chat_msg one[] = { { "user", "Hi" } };
	static const struct chat_msg conv[] = { { "system", "S" }, { "user", "Hi" },
						{ "assistant", "Hello" }, { "user", "Bye" } };
	const struct { const struct chat_msg *m; size_t n; } c[] = { { one, 1 }, { conv, 4 } };

	for (size_t i = 0; i < 2; i++) {
		struct jinja_out o;
		int rc = render_with(t, tmpl, c[i].m, c[i].n, 1, &o, err, errlen);

		free(o.text);
		free(o.spans);
		if (rc && rc != JINJA_RAISED)
			return rc;
	}
	return 0;
}

int tok_chat_init(struct tokenizer *t, const struct gguf_file *f)
{
	struct gguf_str tmpl;
	char err[256];
	int rc;

	t->chat = NULL;
	t->chat_refused = NULL;
	if (gguf_get_str(f, "tokenizer.chat_template", &tmpl) != 0)
		return 0;
	rc = jinja_parse(&t->chat, tmpl.ptr, tmpl.len, err, sizeof(err));
	if (!rc)
		rc = probe(t, t->chat, err, sizeof(err));
	if (rc == -ENOMEM)
		return rc;
	if (rc) {
		jinja_free(t->chat);
		t->chat = NULL;
		if (!(t->chat_refused = strdup(err[0] ? err : "chat template error")))
			return -ENOMEM;
	}
	return 0;
}

void tok_chat_free(struct tokenizer *t)
{
	jinja_free(t->chat);
	free(t->chat_refused);
	t->chat = NULL;
	t->chat_refused = NULL;
}

static void builtin_names(char *buf, size_t cap)
{
	size_t w = 0;

	buf[0] = 0;
	for (const struct tok_chat_builtin *b = tok_chat_builtins; b->name && w < cap; b++) {
		int k = snprintf(buf + w, cap - w, "%s%s", w ? ", " : "", b->name);

		w += k > 0 ? (size_t)k : 0;
	}
}

int tokenizer_chat_select(struct tokenizer *t, const char *name, char *err, size_t errlen)
{
	char names[128];
	struct jinja_tmpl *tmpl;
	int rc;

	builtin_names(names, sizeof(names));
	if (!name || !name[0]) {
		if (!t->chat_refused)
			return 0;
		snprintf(err, errlen, "the model's chat template cannot be used: %s; choose a "
			 "built-in one with --chat-template NAME (%s)", t->chat_refused, names);
		return -ENOTSUP;
	}
	const struct tok_chat_builtin *b = tok_chat_builtins;

	while (b->name && strcmp(b->name, name))
		b++;
	if (!b->name) {
		snprintf(err, errlen, "unknown chat template '%.64s' (kvd has %s)", name, names);
		return -EINVAL;
	}
	rc = jinja_parse(&tmpl, b->text, strlen(b->text), err, errlen);
	if (rc)
		return rc;
	tok_chat_free(t);
	t->chat = tmpl;
	return 0;
}

/* Drop n bytes from the start of o, and the spans with them. */
static void out_cut(struct jinja_out *o, size_t n)
{
	size_t k = 0;

	memmove(o->text, o->text + n, o->len - n + 1);
	o->len -= n;
	for (size_t i = 0; i < o->n_spans; i++) {
		struct jinja_span s = o->spans[i];

		if (s.off + s.len <= n)
			continue;
		if (s.off < n)
			s.len -= n - s.off, s.off = n;
		s.off -= n;
		o->spans[k++] = s;
	}
	o->n_spans = k;
}

static void out_free(struct jinja_out *o)
{
	free(o->text);
	free(o->spans);
	*o = (struct jinja_out){ 0 };
}

/* Where the first end-of-generation token's text after pos ends in o; 0 if none. */
static size_t eog_end(const struct tokenizer *t, const struct jinja_out *o, size_t pos)
{
	size_t best = 0;

	for (uint32_t i = 0; i < t->n_eog; i++) {
		char s[128];

		token_text(t, t->eog[i], s, sizeof(s));
		const char *at = s[0] ? memmem(o->text + pos, o->len - pos, s, strlen(s)) : NULL;
		size_t end = at ? (size_t)(at - o->text) + strlen(s) : 0;

		if (at && (!best || end < best))
			best = end;
	}
	return best;
}

/*
 * The turns that follow a conversation whose last answer the model ended
 * with its end-of-turn token: the template run on a stand-in exchange
 * with and without msgs, less what the exchange alone renders up to that
 * token. A template whose earlier turns change with later ones has no
 * such text (-ENOTSUP).
 */
static int render_next(const struct tokenizer *t, const struct chat_msg *msgs, size_t n,
		       struct jinja_out *o)
{
	struct chat_msg *all = malloc((n + 2) * sizeof(*all));
	struct jinja_out a = { 0 };
	char err[256];
	int rc = -ENOMEM;

	if (!all)
		return rc;
	all[0] = (struct chat_msg){ "user", "Hi" };
	all[1] = (struct chat_msg){ "assistant", "Hello" };
	memcpy(all + 2, msgs, n * sizeof(*msgs));
	rc = render_with(t, t->chat, all, 2, 0, &a, err, sizeof(err));
	if (!rc)
		rc = render_with(t, t->chat, all, n + 2, 1, o, err, sizeof(err));
	free(all);
	if (!rc) {
		size_t from = a.n_spans ? a.spans[a.n_spans - 1].off + a.spans[a.n_spans - 1].len : 0;
		size_t cut = a.n_spans ? eog_end(t, &a, from) : 0;

		if (!cut || o->len < cut || memcmp(o->text, a.text, cut))
			rc = -ENOTSUP;
		else
			out_cut(o, cut);
	}
	out_free(&a);
	if (rc)
		out_free(o);
	return rc;
}

/*
 * msgs in the chat template: a whole conversation (the BOS the tokenizer
 * adds is not in the text), or with next the turns that continue one.
 * 0, -EINVAL (a NULL role or content, or messages the template rejects),
 * -ENOTSUP without a template, or the template's error.
 */
static int render(const struct tokenizer *t, const struct chat_msg *msgs, size_t n,
		  int add_assistant, int next, struct jinja_out *o)
{
	char err[256];
	int rc;

	*o = (struct jinja_out){ 0 };
	for (size_t i = 0; i < n; i++)
		if (!msgs[i].role || !msgs[i].content)
			return -EINVAL;
	if (!t->chat)
		return -ENOTSUP;
	rc = next ? render_next(t, msgs, n, o) :
		    render_with(t, t->chat, msgs, n, add_assistant, o, err, sizeof(err));
	if (rc)
		return rc == JINJA_RAISED ? -EINVAL : rc;
	if (!next && tokenizer_add_bos(t) && t->bos != TOK_NONE) {
		struct chat_tokens k;

		chat_tokens(t, &k);
		if (k.bos[0] && !strncmp(o->text, k.bos, strlen(k.bos)))
			out_cut(o, strlen(k.bos));
	}
	if (o->len > INT_MAX) {
		out_free(o);
		return -EOVERFLOW;
	}
	return 0;
}

static int render_out(const struct tokenizer *t, const struct chat_msg *msgs, size_t n,
		      int add_assistant, int next, char *out, size_t cap)
{
	struct jinja_out o;
	int rc = render(t, msgs, n, add_assistant, next, &o);

	if (rc)
		return rc;
	if (cap) {
		size_t k = o.len < cap - 1 ? o.len : cap - 1;

		memcpy(out, o.text, k);
		out[k] = 0;
	}
	rc = (int)o.len;
	out_free(&o);
	return rc;
}

int tokenizer_chat_format(const struct tokenizer *t, const struct chat_msg *msgs,
			  size_t n, int add_assistant, char *out, size_t cap)
{
	return render_out(t, msgs, n, add_assistant, 0, out, out ? cap : 0);
}

int tokenizer_chat_next_turn(const struct tokenizer *t, const char *content, char *out, size_t cap)
{
	if (!content)
		return -EINVAL;
	return render_out(t, &(struct chat_msg){ "user", content }, 1, 1, 1, out, out ? cap : 0);
}

int tokenizer_chat_encode(const struct tokenizer *t, const struct chat_msg *msgs, size_t n,
			  unsigned flags, uint32_t *out, size_t cap)
{
	int next = (flags & TOK_CHAT_NEXT_TURN) != 0, gen = !(flags & TOK_CHAT_NO_GEN_PROMPT);
	struct jinja_out o;
	struct tok_span *spans;
	int rc;

	if (next && !gen)
		return -EINVAL;	/* a next turn is always the assistant's opening too */
	rc = render(t, msgs, n, gen, next, &o);
	if (rc)
		return rc;
	spans = malloc((o.n_spans ? o.n_spans : 1) * sizeof(*spans));
	if (spans) {
		int add_bos = !next && tokenizer_add_bos(t);
		size_t n_plain = flags & TOK_CHAT_SPECIAL ? 0 : o.n_spans;

		for (size_t i = 0; i < o.n_spans; i++)
			spans[i] = (struct tok_span){ o.spans[i].off, o.spans[i].len };
		/* The template's markers are control tokens; the messages' text is plain unless asked. */
		rc = tok_encode_masked(t, o.text, o.len, add_bos, 1, spans, n_plain, out, cap);
	} else {
		rc = -ENOMEM;
	}
	free(spans);
	out_free(&o);
	return rc;
}
