/* jinja.h — the subset of Jinja that chat templates are written in: parse once, render conversations. */
#ifndef KVD_JINJA_H
#define KVD_JINJA_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

struct jinja_tmpl;

/* Where a message's own text landed in the output (byte offsets). */
struct jinja_span {
	size_t off, len;
};

struct jinja_msg {
	const char *role;
	const char *content;
};

/*
 * What a template sees, as Hugging Face's apply_chat_template passes it:
 * messages (role, content), add_generation_prompt, bos_token, eos_token,
 * tools = none, and the functions raise_exception() and strftime_now().
 */
struct jinja_ctx {
	const struct jinja_msg *msgs;
	size_t n_msgs;
	const char *bos_token, *eos_token;	/* NULL: "" */
	int add_generation_prompt;
	int64_t now;		/* strftime_now's time, seconds since the epoch in UTC; -1: the clock, local time */
	size_t max_out;		/* bytes of output at most (0: JINJA_MAX_OUT) */
};

#define JINJA_MAX_OUT	(4u << 20)

/*
 * Parse a template read with Hugging Face's settings (trim_blocks,
 * lstrip_blocks, one trailing newline dropped, newlines normalised).
 * The template text is copied. Returns 0, or -ENOTSUP for a construct,
 * filter, test, method or function kvd does not implement (err names it
 * and its line), -EINVAL for a syntax error, -E2BIG past the nesting or
 * size limits, -ENOMEM. Free with jinja_free(); a parsed template is
 * immutable and may be rendered by several threads at once.
 */
int jinja_parse(struct jinja_tmpl **out, const char *src, size_t len, char *err, size_t errlen);
void jinja_free(struct jinja_tmpl *t);

/* The output of a render: text NUL-terminated; the caller frees text and spans. */
struct jinja_out {
	char *text;
	size_t len;
	struct jinja_span *spans;	/* (n_spans,) in order, merged when adjacent */
	size_t n_spans;
};

/*
 * Render t for c into *out. Returns 0, or JINJA_RAISED when the template
 * called raise_exception() (err: "template error: <its message>"),
 * -EINVAL for a type error or an undefined value used, -ENOTSUP for an operation it cannot do, -E2BIG past the
 * output, loop or recursion limits, -ENOMEM. On error *out is zeroed.
 */
int jinja_render(const struct jinja_tmpl *t, const struct jinja_ctx *c, struct jinja_out *out,
		 char *err, size_t errlen);

/* Distinguish the template's own raise_exception() from other failures. */
#define JINJA_RAISED	(-EPROTO)

#endif
