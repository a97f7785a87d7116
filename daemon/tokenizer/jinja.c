/* jinja.c — the Jinja parser: tokens to expressions and statements, and what it refuses by name. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/tokenizer/jinja_int.h"

/* ---- parser ---- */

static struct jtok *cur(struct jparse *p)
{
	return &p->tok[p->pos];
}

static int is_op(const struct jtok *t, const char *op)
{
	return t->type == T_OP && t->n == strlen(op) && !memcmp(t->p, op, t->n);
}

static int is_name(const struct jtok *t, const char *name)
{
	return t->type == T_NAME && t->n == strlen(name) && !memcmp(t->p, name, t->n);
}

static int expect_op(struct jparse *p, const char *op)
{
	if (!is_op(cur(p), op))
		return jp_err(p, -EINVAL, cur(p)->line, "expected '%s', found '%.*s'", op,
			    (int)(cur(p)->n > 40 ? 40 : cur(p)->n), cur(p)->p);
	p->pos++;
	return 0;
}

static struct jstr tok_str(const struct jtok *t)
{
	return (struct jstr){ t->p, t->n, NULL, 0 };
}

static void *palloc(struct jparse *p, size_t n)
{
	void *v = ja_alloc(&p->t->arena, n);

	if (!v)
		jp_err(p, -ENOMEM, cur(p)->line, "out of memory");
	return v;
}

static struct jexpr *node(struct jparse *p, int kind)
{
	struct jexpr *e = palloc(p, sizeof(*e));

	if (e) {
		e->kind = (uint8_t)kind;
		e->line = cur(p)->line;
	}
	return e;
}

static int put_utf8(char *o, uint32_t cp)
{
	if (cp < 0x80)
		return o[0] = (char)cp, 1;
	if (cp < 0x800)
		return o[0] = (char)(0xc0 | cp >> 6), o[1] = (char)(0x80 | (cp & 0x3f)), 2;
	if (cp < 0x10000) {
		o[0] = (char)(0xe0 | cp >> 12);
		o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
		o[2] = (char)(0x80 | (cp & 0x3f));
		return 3;
	}
	o[0] = (char)(0xf0 | cp >> 18);
	o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
	o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
	o[3] = (char)(0x80 | (cp & 0x3f));
	return 4;
}

static int hexval(char c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 :
	       c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Python's unicode-escape decoding, which Jinja applies to string literals. */
static size_t unescape(const char *s, size_t n, char *o)
{
	size_t w = 0;

	for (size_t i = 0; i < n; i++) {
		if (s[i] != '\\' || i + 1 >= n) {
			o[w++] = s[i];
			continue;
		}
		char c = s[++i];
		const char *simple = strchr("ntr\\'\"abfv", c);

		if (c && simple) {
			static const char to[] = "\n\t\r\\'\"\a\b\f\v";
			o[w++] = to[simple - "ntr\\'\"abfv"];
		} else if (c == '\n') {
			continue;
		} else if (c == 'x' || c == 'u' || c == 'U') {
			int len = c == 'x' ? 2 : c == 'u' ? 4 : 8, k = 0;
			uint32_t cp = 0;

			while (k < len && i + 1 + (size_t)k < n && hexval(s[i + 1 + k]) >= 0)
				cp = cp << 4 | (uint32_t)hexval(s[i + 1 + k]), k++;
			if (k < len || cp > 0x10ffff) {
				o[w++] = '\\';
				o[w++] = c;
				continue;
			}
			i += (size_t)len;
			w += (size_t)put_utf8(o + w, cp);
		} else if (c >= '0' && c <= '7') {
			uint32_t cp = (uint32_t)(c - '0');

			for (int k = 0; k < 2 && i + 1 < n && s[i + 1] >= '0' && s[i + 1] <= '7'; k++)
				cp = cp * 8 + (uint32_t)(s[++i] - '0');
			w += (size_t)put_utf8(o + w, cp);
		} else {
			o[w++] = '\\';
			o[w++] = c;
		}
	}
	return w;
}

static struct jexpr *parse_expr(struct jparse *p);
static struct jexpr *parse_or(struct jparse *p);
static struct jexpr *parse_unary(struct jparse *p, int with_filter);
static struct jexpr *parse_primary(struct jparse *p);

/* Call arguments after '(' up to ')': positional first, then name=value. */
static int parse_args(struct jparse *p, struct jexpr *e)
{
	struct jexpr *args[JINJA_MAX_ARGS];
	struct jstr kw[JINJA_MAX_ARGS];
	uint32_t n = 0;

	if (expect_op(p, "("))
		return p->rc;
	while (!is_op(cur(p), ")")) {
		if (n == JINJA_MAX_ARGS)
			return jp_err(p, -E2BIG, cur(p)->line, "more than %d arguments", JINJA_MAX_ARGS);
		kw[n] = (struct jstr){ 0 };
		if (cur(p)->type == T_NAME && is_op(&p->tok[p->pos + 1], "=")) {
			kw[n] = tok_str(cur(p));
			p->pos += 2;
		}
		if (!(args[n++] = parse_expr(p)))
			return p->rc;
		if (!is_op(cur(p), ",") && !is_op(cur(p), ")"))
			return expect_op(p, ")");
		if (is_op(cur(p), ","))
			p->pos++;
	}
	p->pos++;
	e->args = palloc(p, (n ? n : 1) * sizeof(*e->args));
	e->kw = palloc(p, (n ? n : 1) * sizeof(*e->kw));
	if (!e->args || !e->kw)
		return p->rc;
	memcpy(e->args, args, n * sizeof(*args));
	memcpy(e->kw, kw, n * sizeof(*kw));
	e->n_args = n;
	return 0;
}

/* A list of expressions up to the closing op: [a, b], (a, b), {k: v}. */
static struct jexpr *parse_seq(struct jparse *p, struct jexpr *e, const char *close, int pairs)
{
	struct jexpr *items[256];
	uint32_t n = 0;

	while (!is_op(cur(p), close)) {
		if (n + 2 > sizeof(items) / sizeof(items[0])) {
			jp_err(p, -E2BIG, cur(p)->line, "literal of more than 128 items");
			return NULL;
		}
		if (!(items[n++] = parse_expr(p)))
			return NULL;
		if (pairs && (expect_op(p, ":") || !(items[n++] = parse_expr(p))))
			return NULL;
		if (!is_op(cur(p), ","))
			break;
		p->pos++;
	}
	if (expect_op(p, close))
		return NULL;
	e->args = palloc(p, (n ? n : 1) * sizeof(*e->args));
	if (!e->args)
		return NULL;
	memcpy(e->args, items, n * sizeof(*items));
	e->n_args = n;
	return e;
}

static struct jexpr *parse_literal(struct jparse *p)
{
	struct jtok *t = cur(p);
	struct jexpr *e = node(p, JE_LIT);

	if (!e)
		return NULL;
	if (t->type == T_STR) {
		size_t total = 0;
		char *o;

		/* Adjacent literals are one string, as in Python. */
		for (size_t k = p->pos; p->tok[k].type == T_STR; k++)
			total += p->tok[k].n;
		if (!(o = palloc(p, total + 1)))
			return NULL;
		e->lit.type = JV_STR;
		e->lit.s.p = o;
		for (; cur(p)->type == T_STR; p->pos++)
			e->lit.s.n += unescape(cur(p)->p, cur(p)->n, o + e->lit.s.n);
		return e;
	}
	char buf[64];

	if (t->n >= sizeof(buf)) {
		jp_err(p, -EINVAL, t->line, "number too long");
		return NULL;
	}
	memcpy(buf, t->p, t->n);
	buf[t->n] = 0;
	errno = 0;
	if (t->type == T_INT) {
		e->lit.type = JV_INT;
		e->lit.i = strtoll(buf, NULL, 10);
	} else {
		e->lit.type = JV_FLOAT;
		e->lit.f = strtod(buf, NULL);
	}
	if (errno) {
		jp_err(p, -ENOTSUP, t->line, "number out of range: %s", buf);
		return NULL;
	}
	p->pos++;
	return e;
}

static struct jexpr *parse_name(struct jparse *p)
{
	struct jtok *t = cur(p);
	struct jexpr *e = node(p, JE_LIT);

	if (!e)
		return NULL;
	p->pos++;
	if (is_name(t, "true") || is_name(t, "True") || is_name(t, "false") || is_name(t, "False")) {
		e->lit.type = JV_BOOL;
		e->lit.b = t->p[0] == 't' || t->p[0] == 'T';
	} else if (is_name(t, "none") || is_name(t, "None")) {
		e->lit.type = JV_NONE;
	} else {
		e->kind = JE_NAME;
		e->name = tok_str(t);
	}
	return e;
}

static struct jexpr *parse_primary(struct jparse *p)
{
	struct jtok *t = cur(p);
	struct jexpr *e;

	if (t->type == T_NAME)
		return parse_name(p);
	if (t->type == T_STR || t->type == T_INT || t->type == T_FLOAT)
		return parse_literal(p);
	if (is_op(t, "(")) {
		p->pos++;
		if (is_op(cur(p), ")")) {
			p->pos++;
			if ((e = node(p, JE_LIST)))
				e->op = 1;
			return e;
		}
		if (!(e = parse_expr(p)))
			return NULL;
		if (is_op(cur(p), ",")) {	/* a tuple: a list here */
			struct jexpr *l = node(p, JE_LIST), *first = e;

			p->pos++;
			if (!l || !parse_seq(p, l, ")", 0))
				return NULL;
			struct jexpr **a = palloc(p, (l->n_args + 1) * sizeof(*a));
			if (!a)
				return NULL;
			a[0] = first;
			memcpy(a + 1, l->args, l->n_args * sizeof(*a));
			l->args = a;
			l->n_args++;
			l->op = 1;
			return l;
		}
		return expect_op(p, ")") ? NULL : e;
	}
	if (is_op(t, "[") || is_op(t, "{")) {
		int dict = t->p[0] == '{';

		p->pos++;
		e = node(p, dict ? JE_DICT : JE_LIST);
		return e ? parse_seq(p, e, dict ? "}" : "]", dict) : NULL;
	}
	jp_err(p, -EINVAL, t->line, "unexpected '%.*s'", (int)(t->n > 40 ? 40 : t->n), t->p);
	return NULL;
}

static void note_call(struct jparse *p, struct jexpr *fn)
{
	if (fn->kind != JE_NAME || jx_func_id(fn->name) >= 0)
		return;
	if (jp_grow((void **)&p->calls, &p->cap_calls, p->n_calls, sizeof(*p->calls))) {
		jp_err(p, -ENOMEM, fn->line, "out of memory");
		return;
	}
	p->calls[p->n_calls++] = (struct jtok){ T_NAME, fn->name.p, fn->name.n, fn->line };
}

static struct jexpr *parse_call(struct jparse *p, struct jexpr *fn)
{
	struct jexpr *e = node(p, JE_CALL);

	if (!e)
		return NULL;
	if (fn->kind == JE_ATTR && jx_method_known(fn->name) < 0) {
		jp_err(p, -ENOTSUP, fn->line, "unsupported method '%.*s()'", (int)fn->name.n, fn->name.p);
		return NULL;
	}
	note_call(p, fn);
	e->a = fn;
	return parse_args(p, e) ? NULL : e;
}

/* x[i] or x[a:b:c]; a missing bound is NULL. */
static struct jexpr *parse_subscript(struct jparse *p, struct jexpr *obj)
{
	struct jexpr *e = node(p, JE_ITEM), *part[3] = { NULL, NULL, NULL };
	int k = 0;

	if (!e)
		return NULL;
	p->pos++;
	for (;;) {
		if (!is_op(cur(p), ":") && !is_op(cur(p), "]") && !(part[k] = parse_expr(p)))
			return NULL;
		if (!is_op(cur(p), ":") || k == 2)
			break;
		e->kind = JE_SLICE;
		p->pos++;
		k++;
	}
	if (expect_op(p, "]"))
		return NULL;
	if (e->kind == JE_ITEM && !part[0]) {
		jp_err(p, -EINVAL, e->line, "empty subscript");
		return NULL;
	}
	e->a = obj;
	e->b = part[0];
	e->c = part[1];
	if (e->kind == JE_SLICE && !(e->args = palloc(p, sizeof(*e->args))))
		return NULL;
	if (e->kind == JE_SLICE)
		e->args[0] = part[2];
	return e;
}

static struct jexpr *parse_postfix(struct jparse *p, struct jexpr *e)
{
	while (e) {
		if (is_op(cur(p), ".")) {
			struct jexpr *a = node(p, JE_ATTR);

			p->pos++;
			if (!a)
				return NULL;
			if (cur(p)->type == T_INT) {	/* x.0 is x[0] */
				a->kind = JE_ITEM;
				if (!(a->b = parse_literal(p)))
					return NULL;
			} else if (cur(p)->type == T_NAME) {
				a->name = tok_str(cur(p));
				p->pos++;
			} else {
				jp_err(p, -EINVAL, cur(p)->line, "expected a name after '.'");
				return NULL;
			}
			a->a = e;
			e = a;
		} else if (is_op(cur(p), "[")) {
			e = parse_subscript(p, e);
		} else if (is_op(cur(p), "(")) {
			e = parse_call(p, e);
		} else {
			break;
		}
	}
	return e;
}

static int can_start_arg(const struct jtok *t)
{
	if (t->type == T_NAME)
		return !is_name(t, "else") && !is_name(t, "or") && !is_name(t, "and") &&
		       !is_name(t, "if") && !is_name(t, "in") && !is_name(t, "is") && !is_name(t, "not");
	return t->type == T_STR || t->type == T_INT || t->type == T_FLOAT || is_op(t, "[") ||
	       is_op(t, "{");
}

/* `| name(args)` and `is [not] name arg` after a primary. */
static struct jexpr *parse_filters(struct jparse *p, struct jexpr *e)
{
	while (e && (is_op(cur(p), "|") || is_name(cur(p), "is"))) {
		int filter = is_op(cur(p), "|");
		struct jexpr *f = node(p, filter ? JE_FILTER : JE_TEST);

		if (!f)
			return NULL;
		p->pos++;
		if (!filter && is_name(cur(p), "not"))
			f->op = 1, p->pos++;
		if (cur(p)->type != T_NAME) {
			jp_err(p, -EINVAL, cur(p)->line, "expected a %s name", filter ? "filter" : "test");
			return NULL;
		}
		f->name = tok_str(cur(p));
		p->pos++;
		int id = filter ? jx_filter_id(f->name) : jx_test_id(f->name);
		if (id < 0) {
			jp_err(p, -ENOTSUP, f->line, "unsupported %s '%.*s'", filter ? "filter" : "test",
			     (int)f->name.n, f->name.p);
			return NULL;
		}
		f->id = (uint8_t)id;
		f->a = e;
		if (is_op(cur(p), "(")) {
			if (parse_args(p, f))
				return NULL;
		} else if (!filter && can_start_arg(cur(p))) {
			struct jexpr *arg = parse_primary(p);

			if (!arg || !(f->args = palloc(p, sizeof(*f->args))) ||
			    !(f->kw = palloc(p, sizeof(*f->kw))))
				return NULL;
			arg = parse_postfix(p, arg);
			f->args[0] = arg;
			f->n_args = 1;
		}
		e = f;
	}
	return e;
}

static struct jexpr *parse_unary(struct jparse *p, int with_filter)
{
	struct jexpr *e;

	if (++p->depth > JINJA_MAX_DEPTH) {
		jp_err(p, -E2BIG, cur(p)->line, "expression nested deeper than %d", JINJA_MAX_DEPTH);
		return NULL;
	}
	if (is_op(cur(p), "-") || is_op(cur(p), "+")) {
		int neg = cur(p)->p[0] == '-';

		p->pos++;
		e = node(p, JE_NEG);
		if (e && !(e->a = parse_unary(p, 0)))
			e = NULL;
		if (e && !neg)
			e->op = 1;	/* unary plus: a number check only */
	} else {
		e = parse_postfix(p, parse_primary(p));
	}
	if (e && with_filter)
		e = parse_filters(p, e);
	p->depth--;
	return e;
}

static struct jexpr *binop(struct jparse *p, int kind, int op, struct jexpr *a, struct jexpr *b)
{
	struct jexpr *e = a && b ? node(p, kind) : NULL;

	if (e) {
		e->op = (uint8_t)op;
		e->a = a;
		e->b = b;
	}
	return e;
}

static struct jexpr *parse_pow(struct jparse *p)
{
	struct jexpr *e = parse_unary(p, 1);

	while (e && is_op(cur(p), "**")) {
		p->pos++;
		e = binop(p, JE_BIN, JO_POW, e, parse_unary(p, 1));
	}
	return e;
}

static struct jexpr *parse_mul(struct jparse *p)
{
	struct jexpr *e = parse_pow(p);

	for (;;) {
		int op = is_op(cur(p), "*") ? JO_MUL : is_op(cur(p), "/") ? JO_DIV :
			 is_op(cur(p), "//") ? JO_FLOORDIV : is_op(cur(p), "%") ? JO_MOD : -1;
		if (!e || op < 0)
			return e;
		p->pos++;
		e = binop(p, JE_BIN, op, e, parse_pow(p));
	}
}

static struct jexpr *parse_concat(struct jparse *p)
{
	struct jexpr *e = parse_mul(p);

	while (e && is_op(cur(p), "~")) {
		p->pos++;
		e = binop(p, JE_BIN, JO_CONCAT, e, parse_mul(p));
	}
	return e;
}

static struct jexpr *parse_add(struct jparse *p)
{
	struct jexpr *e = parse_concat(p);

	while (e && (is_op(cur(p), "+") || is_op(cur(p), "-"))) {
		int op = cur(p)->p[0] == '+' ? JO_ADD : JO_SUB;

		p->pos++;
		e = binop(p, JE_BIN, op, e, parse_concat(p));
	}
	return e;
}

static int compare_op(struct jparse *p)
{
	static const char *const ops[] = { "==", "!=", "<", "<=", ">", ">=" };
	struct jtok *t = cur(p);

	for (int i = 0; i < 6; i++)
		if (is_op(t, ops[i]))
			return p->pos++, JO_EQ + i;
	if (is_name(t, "in"))
		return p->pos++, JO_IN;
	if (is_name(t, "not") && is_name(&p->tok[p->pos + 1], "in"))
		return p->pos += 2, JO_NOTIN;
	return -1;
}

/* a < b < c means a < b and b < c, as in Python. */
static struct jexpr *parse_compare(struct jparse *p)
{
	struct jexpr *left = parse_add(p), *res = NULL;
	int op;

	while (left && (op = compare_op(p)) >= 0) {
		struct jexpr *right = parse_add(p);
		struct jexpr *c = binop(p, JE_BIN, op, left, right);

		res = res ? binop(p, JE_AND, 0, res, c) : c;
		if (!res)
			return NULL;
		left = right;
	}
	return res ? res : left;
}

static struct jexpr *parse_not(struct jparse *p)
{
	if (is_name(cur(p), "not")) {
		struct jexpr *e = node(p, JE_NOT);

		p->pos++;
		if (++p->depth > JINJA_MAX_DEPTH) {
			jp_err(p, -E2BIG, cur(p)->line, "expression nested deeper than %d", JINJA_MAX_DEPTH);
			return NULL;
		}
		if (e && !(e->a = parse_not(p)))
			e = NULL;
		p->depth--;
		return e;
	}
	return parse_compare(p);
}

static struct jexpr *parse_and(struct jparse *p)
{
	struct jexpr *e = parse_not(p);

	while (e && is_name(cur(p), "and")) {
		p->pos++;
		e = binop(p, JE_AND, 0, e, parse_not(p));
	}
	return e;
}

static struct jexpr *parse_or(struct jparse *p)
{
	struct jexpr *e = parse_and(p);

	while (e && is_name(cur(p), "or")) {
		p->pos++;
		e = binop(p, JE_OR, 0, e, parse_and(p));
	}
	return e;
}

/*
 * Chains (a.b.c..., a + b + c ..., x | f | g ...) nest the tree without
 * nesting the parser: evaluation recurses as deep as the tree, so the tree
 * is bounded too. The walk stops at the bound, so it is itself bounded.
 */
static int too_deep(const struct jexpr *e, int d)
{
	if (!e)
		return 0;
	if (d > 4 * JINJA_MAX_DEPTH)
		return 1;
	if (too_deep(e->a, d + 1) || too_deep(e->b, d + 1) || too_deep(e->c, d + 1))
		return 1;
	for (uint32_t i = 0; i < e->n_args; i++)
		if (too_deep(e->args[i], d + 1))
			return 1;
	return 0;
}

static struct jexpr *parse_cond(struct jparse *p);

/* An expression; a whole one (not inside another) is checked for depth. */
static struct jexpr *parse_expr(struct jparse *p)
{
	p->expr_nest++;
	struct jexpr *e = parse_cond(p);

	if (--p->expr_nest == 0 && e && too_deep(e, 0)) {
		jp_err(p, -E2BIG, e->line, "expression nested deeper than %d", 4 * JINJA_MAX_DEPTH);
		return NULL;
	}
	return e;
}

/* a if cond else b; without else the value is undefined when cond is false. */
static struct jexpr *parse_cond(struct jparse *p)
{
	struct jexpr *e = parse_or(p);

	if (++p->depth > JINJA_MAX_DEPTH) {
		jp_err(p, -E2BIG, cur(p)->line, "expression nested deeper than %d", JINJA_MAX_DEPTH);
		return NULL;
	}
	while (e && is_name(cur(p), "if")) {
		struct jexpr *c = node(p, JE_COND);

		p->pos++;
		if (!c || !(c->b = parse_or(p)))
			return NULL;
		c->a = e;
		if (is_name(cur(p), "else")) {
			p->pos++;
			if (!(c->c = parse_cond(p)))
				return NULL;
		}
		e = c;
	}
	p->depth--;
	return e;
}

/* ---- statements ---- */

static int expect_end(struct jparse *p)
{
	if (cur(p)->type != T_BLOCK_END)
		return jp_err(p, -EINVAL, cur(p)->line, "expected the end of the tag, found '%.*s'",
			    (int)(cur(p)->n > 40 ? 40 : cur(p)->n), cur(p)->p);
	p->pos++;
	return 0;
}

static struct jstmt *stmt(struct jparse *p, int kind)
{
	struct jstmt *s = palloc(p, sizeof(*s));

	if (s) {
		s->kind = (uint8_t)kind;
		s->line = cur(p)->line;
	}
	return s;
}

static int parse_body(struct jparse *p, struct jstmt **out, const char *const *ends, int *which);

static int expect_name(struct jparse *p, struct jstr *out)
{
	if (cur(p)->type != T_NAME)
		return jp_err(p, -EINVAL, cur(p)->line, "expected a name");
	*out = tok_str(cur(p));
	p->pos++;
	return 0;
}

static int parse_if(struct jparse *p, struct jstmt *s)
{
	static const char *const ends[] = { "elif", "else", "endif", NULL };
	int which;

	if (!(s->e = parse_expr(p)) || expect_end(p) || parse_body(p, &s->body, ends, &which))
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
	if (is_op(cur(p), ",")) {
		p->pos++;
		if (expect_name(p, &s->target[1]))
			return p->rc;
		s->n_target = 2;
	}
	if (!is_name(cur(p), "in"))
		return jp_err(p, -EINVAL, cur(p)->line, "expected 'in'");
	p->pos++;
	if (!(s->e = parse_or(p)))
		return p->rc;
	if (too_deep(s->e, 0))
		return jp_err(p, -E2BIG, s->line, "expression nested deeper than %d", 4 * JINJA_MAX_DEPTH);
	if (is_name(cur(p), "if")) {
		p->pos++;
		if (!(s->cond = parse_expr(p)))
			return p->rc;
	}
	if (is_name(cur(p), "recursive"))
		return jp_err(p, -ENOTSUP, cur(p)->line, "unsupported construct 'for ... recursive'");
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
	if (is_op(cur(p), ".")) {
		p->pos++;
		if (expect_name(p, &s->attr))
			return p->rc;
	}
	if (is_op(cur(p), ","))
		return jp_err(p, -ENOTSUP, cur(p)->line, "unsupported construct 'set a, b = ...'");
	if (cur(p)->type == T_BLOCK_END && !s->attr.n) {
		s->kind = JS_SET_BLOCK;
		return expect_end(p) || parse_body(p, &s->body, ends, &which) ? p->rc : expect_end(p);
	}
	if (expect_op(p, "=") || !(s->e = parse_expr(p)))
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

	if (expect_name(p, &s->target[0]) || expect_op(p, "("))
		return p->rc;
	while (!is_op(cur(p), ")")) {
		if (n == JINJA_MAX_ARGS)
			return jp_err(p, -E2BIG, cur(p)->line, "more than %d parameters", JINJA_MAX_ARGS);
		defs[n] = NULL;
		if (expect_name(p, &params[n]))
			return p->rc;
		if (is_op(cur(p), "=")) {
			p->pos++;
			if (!(defs[n] = parse_expr(p)))
				return p->rc;
		}
		n++;
		if (!is_op(cur(p), ","))
			break;
		p->pos++;
	}
	if (expect_op(p, ")") || expect_end(p))
		return p->rc;
	s->params = palloc(p, (n ? n : 1) * sizeof(*s->params));
	s->defaults = palloc(p, (n ? n : 1) * sizeof(*s->defaults));
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
	struct jtok *k = cur(p);
	struct jstmt *s;
	int rc;

	if (k->type != T_NAME) {
		jp_err(p, -EINVAL, k->line, "expected a statement");
		return NULL;
	}
	p->pos++;
	if (is_name(k, "if") && (s = stmt(p, JS_IF)))
		rc = parse_if(p, s);
	else if (is_name(k, "for") && (s = stmt(p, JS_FOR)))
		rc = parse_for(p, s);
	else if (is_name(k, "set") && (s = stmt(p, JS_SET)))
		rc = parse_set(p, s);
	else if (is_name(k, "macro") && (s = stmt(p, JS_MACRO)))
		rc = parse_macro(p, s);
	else if ((is_name(k, "break") || is_name(k, "continue")) &&
		 (s = stmt(p, k->p[0] == 'b' ? JS_BREAK : JS_CONTINUE)))
		rc = expect_end(p);
	else if (is_name(k, "generation") && (s = stmt(p, JS_BLOCK))) {
		static const char *const ends[] = { "endgeneration", NULL };
		int which;

		rc = expect_end(p) || parse_body(p, &s->body, ends, &which) || expect_end(p);
	} else {
		int stray = (k->n > 3 && !memcmp(k->p, "end", 3)) || is_name(k, "else") ||
			    is_name(k, "elif");

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
		return jp_err(p, -E2BIG, cur(p)->line, "blocks nested deeper than %d", JINJA_MAX_DEPTH);
	for (;;) {
		struct jtok *t = cur(p);
		struct jstmt *s = NULL;

		if (t->type == T_EOF) {
			if (ends)
				return jp_err(p, -EINVAL, t->line, "missing '{%% %s %%}'", ends[0]);
			break;
		}
		p->pos++;
		if (t->type == T_TEXT) {
			if ((s = stmt(p, JS_TEXT)))
				s->text = tok_str(t);
		} else if (t->type == T_VAR_BEGIN) {
			if ((s = stmt(p, JS_OUT)) && (s->e = parse_expr(p)) && cur(p)->type != T_VAR_END)
				jp_err(p, -EINVAL, cur(p)->line, "expected '}}', found '%.*s'",
				     (int)(cur(p)->n > 40 ? 40 : cur(p)->n), cur(p)->p);
			p->pos++;
		} else if (t->type == T_BLOCK_BEGIN) {
			for (int i = 0; ends && ends[i]; i++)
				if (is_name(cur(p), ends[i])) {
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
