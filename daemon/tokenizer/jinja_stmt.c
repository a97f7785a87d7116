/* jinja_stmt.c — the Jinja parser's statements: if, for, set, macro, break/continue, generation; the template as a whole. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/tokenizer/jinja_int.h"

static int expect_end(struct jparse *p)
{
	if (jp_cur(p)->type != T_BLOCK_END)
		return jp_err(p, -EINVAL, jp_cur(p)->line, "expected the end of the tag, found '%.*s'",
			    (int)(jp_cur(p)->n > 40 ? 40 : jp_cur(p)->n), jp_cur(p)->p);
	p->pos++;
	return 0;
}

static struct jstmt *stmt(struct jparse *p, int kind)
{
	struct jstmt *s = jp_alloc(p, sizeof(*s));

	if (s) {
		s->kind = (uint8_t)kind;
		s->line = jp_cur(p)->line;
	}
	return s;
}

static int parse_body(struct jparse *p, struct jstmt **out, const char *const *ends, int *which);

static int expect_name(struct jparse *p, struct jstr *out)
{
	if (jp_cur(p)->type != T_NAME)
		return jp_err(p, -EINVAL, jp_cur(p)->line, "expected a name");
	*out = jp_tok_str(jp_cur(p));
	p->pos++;
	return 0;
}

static int parse_if(struct jparse *p, struct jstmt *s)
{
	static const char *const ends[] = { "elif", "else", "endif", NULL };
	int which;

	if (!(s->e = jp_expr(p)) || expect_end(p) || parse_body(p, &s->body, ends, &which))
		return p->rc;
	if (which == 0) {	/* elif: an if in the else branch */
		struct jstmt *e = stmt(p, JS_IF);

		if (!e)
			return p->rc;
		s->orelse = e;
		return parse_if(p, e);
	}
	if (which == 1 && (expect_end(p) || parse_body(p, &s->orelse, ends + 2, &which)))
		return p->rc;
	return expect_end(p);
}

static int parse_for(struct jparse *p, struct jstmt *s)
{
	static const char *const ends[] = { "else", "endfor", NULL };
	int which;

	if (expect_name(p, &s->target[0]))
		return p->rc;
	s->n_target = 1;
	if (jp_is_op(jp_cur(p), ",")) {
		p->pos++;
		if (expect_name(p, &s->target[1]))
			return p->rc;
		s->n_target = 2;
	}
	if (!jp_is_name(jp_cur(p), "in"))
		return jp_err(p, -EINVAL, jp_cur(p)->line, "expected 'in'");
	p->pos++;
	if (!(s->e = jp_or(p)))
		return p->rc;
	if (jp_too_deep(s->e, 0))
		return jp_err(p, -E2BIG, s->line, "expression nested deeper than %d", 4 * JINJA_MAX_DEPTH);
	if (jp_is_name(jp_cur(p), "if")) {
		p->pos++;
		if (!(s->cond = jp_expr(p)))
			return p->rc;
	}
	if (jp_is_name(jp_cur(p), "recursive"))
		return jp_err(p, -ENOTSUP, jp_cur(p)->line, "unsupported construct 'for ... recursive'");
	if (expect_end(p) || parse_body(p, &s->body, ends, &which))
		return p->rc;
	if (which == 0 && (expect_end(p) || parse_body(p, &s->orelse, ends + 1, &which)))
		return p->rc;
	return expect_end(p);
}

static int parse_set(struct jparse *p, struct jstmt *s)
{
	static const char *const ends[] = { "endset", NULL };
	int which;

	if (expect_name(p, &s->target[0]))
		return p->rc;
	s->n_target = 1;
	if (jp_is_op(jp_cur(p), ".")) {
		p->pos++;
		if (expect_name(p, &s->attr))
			return p->rc;
	}
	if (jp_is_op(jp_cur(p), ","))
		return jp_err(p, -ENOTSUP, jp_cur(p)->line, "unsupported construct 'set a, b = ...'");
	if (jp_cur(p)->type == T_BLOCK_END && !s->attr.n) {
		s->kind = JS_SET_BLOCK;
		return expect_end(p) || parse_body(p, &s->body, ends, &which) ? p->rc : expect_end(p);
	}
	if (jp_expect_op(p, "=") || !(s->e = jp_expr(p)))
		return p->rc;
	return expect_end(p);
}

static int parse_macro(struct jparse *p, struct jstmt *s)
{
	static const char *const ends[] = { "endmacro", NULL };
	struct jstr params[JINJA_MAX_ARGS];
	struct jexpr *defs[JINJA_MAX_ARGS];
	uint32_t n = 0;
	int which;

	if (expect_name(p, &s->target[0]) || jp_expect_op(p, "("))
		return p->rc;
	while (!jp_is_op(jp_cur(p), ")")) {
		if (n == JINJA_MAX_ARGS)
			return jp_err(p, -E2BIG, jp_cur(p)->line, "more than %d parameters", JINJA_MAX_ARGS);
		defs[n] = NULL;
		if (expect_name(p, &params[n]))
			return p->rc;
		if (jp_is_op(jp_cur(p), "=")) {
			p->pos++;
			if (!(defs[n] = jp_expr(p)))
				return p->rc;
		}
		n++;
		if (!jp_is_op(jp_cur(p), ","))
			break;
		p->pos++;
	}
	if (jp_expect_op(p, ")") || expect_end(p))
		return p->rc;
	s->params = jp_alloc(p, (n ? n : 1) * sizeof(*s->params));
	s->defaults = jp_alloc(p, (n ? n : 1) * sizeof(*s->defaults));
	if (!s->params || !s->defaults)
		return p->rc;
	memcpy(s->params, params, n * sizeof(*params));
	memcpy(s->defaults, defs, n * sizeof(*defs));
	s->n_params = n;
	if (jp_grow((void **)&p->macros, &p->cap_macros, p->n_macros, sizeof(*p->macros)))
		return jp_err(p, -ENOMEM, s->line, "out of memory");
	p->macros[p->n_macros++] = s->target[0];
	if (parse_body(p, &s->body, ends, &which))
		return p->rc;
	return expect_end(p);
}

/* One {% %} statement whose keyword is the current token. */
static struct jstmt *parse_stmt(struct jparse *p)
{
	struct jtok *k = jp_cur(p);
	struct jstmt *s;
	int rc;

	if (k->type != T_NAME) {
		jp_err(p, -EINVAL, k->line, "expected a statement");
		return NULL;
	}
	p->pos++;
	if (jp_is_name(k, "if") && (s = stmt(p, JS_IF)))
		rc = parse_if(p, s);
	else if (jp_is_name(k, "for") && (s = stmt(p, JS_FOR)))
		rc = parse_for(p, s);
	else if (jp_is_name(k, "set") && (s = stmt(p, JS_SET)))
		rc = parse_set(p, s);
	else if (jp_is_name(k, "macro") && (s = stmt(p, JS_MACRO)))
		rc = parse_macro(p, s);
	else if ((jp_is_name(k, "break") || jp_is_name(k, "continue")) &&
		 (s = stmt(p, k->p[0] == 'b' ? JS_BREAK : JS_CONTINUE)))
		rc = expect_end(p);
	else if (jp_is_name(k, "generation") && (s = stmt(p, JS_BLOCK))) {
		static const char *const ends[] = { "endgeneration", NULL };
		int which;

		rc = expect_end(p) || parse_body(p, &s->body, ends, &which) || expect_end(p);
	} else {
		int stray = (k->n > 3 && !memcmp(k->p, "end", 3)) || jp_is_name(k, "else") ||
			    jp_is_name(k, "elif");

		if (!p->rc)
			jp_err(p, stray ? -EINVAL : -ENOTSUP, k->line, "%s '%.*s'",
			     stray ? "unexpected" : "unsupported construct",
			     (int)(k->n > 40 ? 40 : k->n), k->p);
		return NULL;
	}
	return rc || p->rc ? NULL : s;
}

/*
 * Statements up to one of ends (a NULL-terminated list; NULL: the end of
 * the template): *which is its index, the tag's keyword consumed.
 */
static int parse_body(struct jparse *p, struct jstmt **out, const char *const *ends, int *which)
{
	struct jstmt **tail = out;

	if (++p->depth > JINJA_MAX_DEPTH)
		return jp_err(p, -E2BIG, jp_cur(p)->line, "blocks nested deeper than %d", JINJA_MAX_DEPTH);
	for (;;) {
		struct jtok *t = jp_cur(p);
		struct jstmt *s = NULL;

		if (t->type == T_EOF) {
			if (ends)
				return jp_err(p, -EINVAL, t->line, "missing '{%% %s %%}'", ends[0]);
			break;
		}
		p->pos++;
		if (t->type == T_TEXT) {
			if ((s = stmt(p, JS_TEXT)))
				s->text = jp_tok_str(t);
		} else if (t->type == T_VAR_BEGIN) {
			if ((s = stmt(p, JS_OUT)) && (s->e = jp_expr(p)) && jp_cur(p)->type != T_VAR_END)
				jp_err(p, -EINVAL, jp_cur(p)->line, "expected '}}', found '%.*s'",
				     (int)(jp_cur(p)->n > 40 ? 40 : jp_cur(p)->n), jp_cur(p)->p);
			p->pos++;
		} else if (t->type == T_BLOCK_BEGIN) {
			for (int i = 0; ends && ends[i]; i++)
				if (jp_is_name(jp_cur(p), ends[i])) {
					p->pos++;
					*which = i;
					p->depth--;
					return p->rc;
				}
			s = parse_stmt(p);
		} else {
			jp_err(p, -EINVAL, t->line, "unexpected '%.*s'", (int)(t->n > 40 ? 40 : t->n), t->p);
		}
		if (p->rc)
			return p->rc;
		if (!s)
			return jp_err(p, -ENOMEM, t->line, "out of memory");
		*tail = s;
		tail = &s->next;
	}
	p->depth--;
	return p->rc;
}

/* CRLF and CR become LF; one trailing newline goes (keep_trailing_newline off). */
static char *normalise(const char *src, size_t len, size_t *out_len)
{
	char *s = malloc(len + 1);
	size_t w = 0;

	if (!s)
		return NULL;
	for (size_t i = 0; i < len; i++) {
		if (src[i] == '\r') {
			s[w++] = '\n';
			if (i + 1 < len && src[i + 1] == '\n')
				i++;
		} else {
			s[w++] = src[i];
		}
	}
	if (w && s[w - 1] == '\n')
		w--;
	s[w] = 0;
	*out_len = w;
	return s;
}

static int check_calls(struct jparse *p)
{
	for (size_t i = 0; i < p->n_calls; i++) {
		size_t m = 0;

		while (m < p->n_macros && !(p->macros[m].n == p->calls[i].n &&
					    !memcmp(p->macros[m].p, p->calls[i].p, p->calls[i].n)))
			m++;
		if (m == p->n_macros)
			return jp_err(p, -ENOTSUP, p->calls[i].line, "unsupported function '%.*s()'",
				    (int)p->calls[i].n, p->calls[i].p);
	}
	return 0;
}

int jinja_parse(struct jinja_tmpl **out, const char *src, size_t len, char *err, size_t errlen)
{
	struct jparse p = { .err = err, .errlen = errlen };
	size_t n;

	if (errlen)
		err[0] = 0;
	*out = NULL;
	if (len > JINJA_MAX_ARENA / 8)
		return jp_err(&p, -E2BIG, 0, "template of %zu bytes is too large", len);
	p.t = calloc(1, sizeof(*p.t));
	if (!p.t || !(p.t->src = normalise(src, len, &n))) {
		free(p.t);
		return jp_err(&p, -ENOMEM, 0, "out of memory");
	}
	if (!jp_lex(&p, p.t->src, n) && !parse_body(&p, &p.t->body, NULL, NULL))
		check_calls(&p);
	free(p.tok);
	free(p.calls);
	free(p.macros);
	if (p.rc) {
		jinja_free(p.t);
		return p.rc;
	}
	*out = p.t;
	return 0;
}

void jinja_free(struct jinja_tmpl *t)
{
	if (!t)
		return;
	ja_free(&t->arena);
	free(t->src);
	free(t);
}
