/* jinja.c — the Jinja parser's expressions: literals, names, calls, filters, tests, operators by precedence, and what it refuses by name. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/tokenizer/jinja_int.h"

struct jtok *jp_cur(struct jparse *p)
{
	return &p->tok[p->pos];
}

int jp_is_op(const struct jtok *t, const char *op)
{
	return t->type == T_OP && t->n == strlen(op) && !memcmp(t->p, op, t->n);
}

int jp_is_name(const struct jtok *t, const char *name)
{
	return t->type == T_NAME && t->n == strlen(name) && !memcmp(t->p, name, t->n);
}

int jp_expect_op(struct jparse *p, const char *op)
{
	if (!jp_is_op(jp_cur(p), op))
		return jp_err(p, -EINVAL, jp_cur(p)->line, "expected '%s', found '%.*s'", op,
			    (int)(jp_cur(p)->n > 40 ? 40 : jp_cur(p)->n), jp_cur(p)->p);
	p->pos++;
	return 0;
}

struct jstr jp_tok_str(const struct jtok *t)
{
	return (struct jstr){ t->p, t->n, NULL, 0 };
}

void *jp_alloc(struct jparse *p, size_t n)
{
	void *v = ja_alloc(&p->t->arena, n);

	if (!v)
		jp_err(p, -ENOMEM, jp_cur(p)->line, "out of memory");
	return v;
}

static struct jexpr *node(struct jparse *p, int kind)
{
	struct jexpr *e = jp_alloc(p, sizeof(*e));

	if (e) {
		e->kind = (uint8_t)kind;
		e->line = jp_cur(p)->line;
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

static struct jexpr *parse_unary(struct jparse *p, int with_filter);
static struct jexpr *parse_primary(struct jparse *p);

/* Call arguments after '(' up to ')': positional first, then name=value. */
static int parse_args(struct jparse *p, struct jexpr *e)
{
	struct jexpr *args[JINJA_MAX_ARGS];
	struct jstr kw[JINJA_MAX_ARGS];
	uint32_t n = 0;

	if (jp_expect_op(p, "("))
		return p->rc;
	while (!jp_is_op(jp_cur(p), ")")) {
		if (n == JINJA_MAX_ARGS)
			return jp_err(p, -E2BIG, jp_cur(p)->line, "more than %d arguments", JINJA_MAX_ARGS);
		kw[n] = (struct jstr){ 0 };
		if (jp_cur(p)->type == T_NAME && jp_is_op(&p->tok[p->pos + 1], "=")) {
			kw[n] = jp_tok_str(jp_cur(p));
			p->pos += 2;
		}
		if (!(args[n++] = jp_expr(p)))
			return p->rc;
		if (!jp_is_op(jp_cur(p), ",") && !jp_is_op(jp_cur(p), ")"))
			return jp_expect_op(p, ")");
		if (jp_is_op(jp_cur(p), ","))
			p->pos++;
	}
	p->pos++;
	e->args = jp_alloc(p, (n ? n : 1) * sizeof(*e->args));
	e->kw = jp_alloc(p, (n ? n : 1) * sizeof(*e->kw));
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

	while (!jp_is_op(jp_cur(p), close)) {
		if (n + 2 > sizeof(items) / sizeof(items[0])) {
			jp_err(p, -E2BIG, jp_cur(p)->line, "literal of more than 128 items");
			return NULL;
		}
		if (!(items[n++] = jp_expr(p)))
			return NULL;
		if (pairs && (jp_expect_op(p, ":") || !(items[n++] = jp_expr(p))))
			return NULL;
		if (!jp_is_op(jp_cur(p), ","))
			break;
		p->pos++;
	}
	if (jp_expect_op(p, close))
		return NULL;
	e->args = jp_alloc(p, (n ? n : 1) * sizeof(*e->args));
	if (!e->args)
		return NULL;
	memcpy(e->args, items, n * sizeof(*items));
	e->n_args = n;
	return e;
}

static struct jexpr *parse_literal(struct jparse *p)
{
	struct jtok *t = jp_cur(p);
	struct jexpr *e = node(p, JE_LIT);

	if (!e)
		return NULL;
	if (t->type == T_STR) {
		size_t total = 0;
		char *o;

		/* Adjacent literals are one string, as in Python. */
		for (size_t k = p->pos; p->tok[k].type == T_STR; k++)
			total += p->tok[k].n;
		if (!(o = jp_alloc(p, total + 1)))
			return NULL;
		e->lit.type = JV_STR;
		e->lit.s.p = o;
		for (; jp_cur(p)->type == T_STR; p->pos++)
			e->lit.s.n += unescape(jp_cur(p)->p, jp_cur(p)->n, o + e->lit.s.n);
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
	struct jtok *t = jp_cur(p);
	struct jexpr *e = node(p, JE_LIT);

	if (!e)
		return NULL;
	p->pos++;
	if (jp_is_name(t, "true") || jp_is_name(t, "True") || jp_is_name(t, "false") || jp_is_name(t, "False")) {
		e->lit.type = JV_BOOL;
		e->lit.b = t->p[0] == 't' || t->p[0] == 'T';
	} else if (jp_is_name(t, "none") || jp_is_name(t, "None")) {
		e->lit.type = JV_NONE;
	} else {
		e->kind = JE_NAME;
		e->name = jp_tok_str(t);
	}
	return e;
}

static struct jexpr *parse_primary(struct jparse *p)
{
	struct jtok *t = jp_cur(p);
	struct jexpr *e;

	if (t->type == T_NAME)
		return parse_name(p);
	if (t->type == T_STR || t->type == T_INT || t->type == T_FLOAT)
		return parse_literal(p);
	if (jp_is_op(t, "(")) {
		p->pos++;
		if (jp_is_op(jp_cur(p), ")")) {
			p->pos++;
			if ((e = node(p, JE_LIST)))
				e->op = 1;
			return e;
		}
		if (!(e = jp_expr(p)))
			return NULL;
		if (jp_is_op(jp_cur(p), ",")) {	/* a tuple: a list here */
			struct jexpr *l = node(p, JE_LIST), *first = e;

			p->pos++;
			if (!l || !parse_seq(p, l, ")", 0))
				return NULL;
			struct jexpr **a = jp_alloc(p, (l->n_args + 1) * sizeof(*a));
			if (!a)
				return NULL;
			a[0] = first;
			memcpy(a + 1, l->args, l->n_args * sizeof(*a));
			l->args = a;
			l->n_args++;
			l->op = 1;
			return l;
		}
		return jp_expect_op(p, ")") ? NULL : e;
	}
	if (jp_is_op(t, "[") || jp_is_op(t, "{")) {
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
		if (!jp_is_op(jp_cur(p), ":") && !jp_is_op(jp_cur(p), "]") && !(part[k] = jp_expr(p)))
			return NULL;
		if (!jp_is_op(jp_cur(p), ":") || k == 2)
			break;
		e->kind = JE_SLICE;
		p->pos++;
		k++;
	}
	if (jp_expect_op(p, "]"))
		return NULL;
	if (e->kind == JE_ITEM && !part[0]) {
		jp_err(p, -EINVAL, e->line, "empty subscript");
		return NULL;
	}
	e->a = obj;
	e->b = part[0];
	e->c = part[1];
	if (e->kind == JE_SLICE && !(e->args = jp_alloc(p, sizeof(*e->args))))
		return NULL;
	if (e->kind == JE_SLICE)
		e->args[0] = part[2];
	return e;
}

static struct jexpr *parse_postfix(struct jparse *p, struct jexpr *e)
{
	while (e) {
		if (jp_is_op(jp_cur(p), ".")) {
			struct jexpr *a = node(p, JE_ATTR);

			p->pos++;
			if (!a)
				return NULL;
			if (jp_cur(p)->type == T_INT) {	/* x.0 is x[0] */
				a->kind = JE_ITEM;
				if (!(a->b = parse_literal(p)))
					return NULL;
			} else if (jp_cur(p)->type == T_NAME) {
				a->name = jp_tok_str(jp_cur(p));
				p->pos++;
			} else {
				jp_err(p, -EINVAL, jp_cur(p)->line, "expected a name after '.'");
				return NULL;
			}
			a->a = e;
			e = a;
		} else if (jp_is_op(jp_cur(p), "[")) {
			e = parse_subscript(p, e);
		} else if (jp_is_op(jp_cur(p), "(")) {
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
		return !jp_is_name(t, "else") && !jp_is_name(t, "or") && !jp_is_name(t, "and") &&
		       !jp_is_name(t, "if") && !jp_is_name(t, "in") && !jp_is_name(t, "is") && !jp_is_name(t, "not");
	return t->type == T_STR || t->type == T_INT || t->type == T_FLOAT || jp_is_op(t, "[") ||
	       jp_is_op(t, "{");
}

/* `| name(args)` and `is [not] name arg` after a primary. */
static struct jexpr *parse_filters(struct jparse *p, struct jexpr *e)
{
	while (e && (jp_is_op(jp_cur(p), "|") || jp_is_name(jp_cur(p), "is"))) {
		int filter = jp_is_op(jp_cur(p), "|");
		struct jexpr *f = node(p, filter ? JE_FILTER : JE_TEST);

		if (!f)
			return NULL;
		p->pos++;
		if (!filter && jp_is_name(jp_cur(p), "not"))
			f->op = 1, p->pos++;
		if (jp_cur(p)->type != T_NAME) {
			jp_err(p, -EINVAL, jp_cur(p)->line, "expected a %s name", filter ? "filter" : "test");
			return NULL;
		}
		f->name = jp_tok_str(jp_cur(p));
		p->pos++;
		int id = filter ? jx_filter_id(f->name) : jx_test_id(f->name);
		if (id < 0) {
			jp_err(p, -ENOTSUP, f->line, "unsupported %s '%.*s'", filter ? "filter" : "test",
			     (int)f->name.n, f->name.p);
			return NULL;
		}
		f->id = (uint8_t)id;
		f->a = e;
		if (jp_is_op(jp_cur(p), "(")) {
			if (parse_args(p, f))
				return NULL;
		} else if (!filter && can_start_arg(jp_cur(p))) {
			struct jexpr *arg = parse_primary(p);

			if (!arg || !(f->args = jp_alloc(p, sizeof(*f->args))) ||
			    !(f->kw = jp_alloc(p, sizeof(*f->kw))))
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
		jp_err(p, -E2BIG, jp_cur(p)->line, "expression nested deeper than %d", JINJA_MAX_DEPTH);
		return NULL;
	}
	if (jp_is_op(jp_cur(p), "-") || jp_is_op(jp_cur(p), "+")) {
		int neg = jp_cur(p)->p[0] == '-';

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

	while (e && jp_is_op(jp_cur(p), "**")) {
		p->pos++;
		e = binop(p, JE_BIN, JO_POW, e, parse_unary(p, 1));
	}
	return e;
}

static struct jexpr *parse_mul(struct jparse *p)
{
	struct jexpr *e = parse_pow(p);

	for (;;) {
		int op = jp_is_op(jp_cur(p), "*") ? JO_MUL : jp_is_op(jp_cur(p), "/") ? JO_DIV :
			 jp_is_op(jp_cur(p), "//") ? JO_FLOORDIV : jp_is_op(jp_cur(p), "%") ? JO_MOD : -1;
		if (!e || op < 0)
			return e;
		p->pos++;
		e = binop(p, JE_BIN, op, e, parse_pow(p));
	}
}

static struct jexpr *parse_concat(struct jparse *p)
{
	struct jexpr *e = parse_mul(p);

	while (e && jp_is_op(jp_cur(p), "~")) {
		p->pos++;
		e = binop(p, JE_BIN, JO_CONCAT, e, parse_mul(p));
	}
	return e;
}

static struct jexpr *parse_add(struct jparse *p)
{
	struct jexpr *e = parse_concat(p);

	while (e && (jp_is_op(jp_cur(p), "+") || jp_is_op(jp_cur(p), "-"))) {
		int op = jp_cur(p)->p[0] == '+' ? JO_ADD : JO_SUB;

		p->pos++;
		e = binop(p, JE_BIN, op, e, parse_concat(p));
	}
	return e;
}

static int compare_op(struct jparse *p)
{
	static const char *const ops[] = { "==", "!=", "<", "<=", ">", ">=" };
	struct jtok *t = jp_cur(p);

	for (int i = 0; i < 6; i++)
		if (jp_is_op(t, ops[i]))
			return p->pos++, JO_EQ + i;
	if (jp_is_name(t, "in"))
		return p->pos++, JO_IN;
	if (jp_is_name(t, "not") && jp_is_name(&p->tok[p->pos + 1], "in"))
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
	if (jp_is_name(jp_cur(p), "not")) {
		struct jexpr *e = node(p, JE_NOT);

		p->pos++;
		if (++p->depth > JINJA_MAX_DEPTH) {
			jp_err(p, -E2BIG, jp_cur(p)->line, "expression nested deeper than %d", JINJA_MAX_DEPTH);
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

	while (e && jp_is_name(jp_cur(p), "and")) {
		p->pos++;
		e = binop(p, JE_AND, 0, e, parse_not(p));
	}
	return e;
}

struct jexpr *jp_or(struct jparse *p)
{
	struct jexpr *e = parse_and(p);

	while (e && jp_is_name(jp_cur(p), "or")) {
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
int jp_too_deep(const struct jexpr *e, int d)
{
	if (!e)
		return 0;
	if (d > 4 * JINJA_MAX_DEPTH)
		return 1;
	if (jp_too_deep(e->a, d + 1) || jp_too_deep(e->b, d + 1) || jp_too_deep(e->c, d + 1))
		return 1;
	for (uint32_t i = 0; i < e->n_args; i++)
		if (jp_too_deep(e->args[i], d + 1))
			return 1;
	return 0;
}

static struct jexpr *parse_cond(struct jparse *p);

/* An expression; a whole one (not inside another) is checked for depth. */
struct jexpr *jp_expr(struct jparse *p)
{
	p->expr_nest++;
	struct jexpr *e = parse_cond(p);

	if (--p->expr_nest == 0 && e && jp_too_deep(e, 0)) {
		jp_err(p, -E2BIG, e->line, "expression nested deeper than %d", 4 * JINJA_MAX_DEPTH);
		return NULL;
	}
	return e;
}

/* a if cond else b; without else the value is undefined when cond is false. */
static struct jexpr *parse_cond(struct jparse *p)
{
	struct jexpr *e = jp_or(p);

	if (++p->depth > JINJA_MAX_DEPTH) {
		jp_err(p, -E2BIG, jp_cur(p)->line, "expression nested deeper than %d", JINJA_MAX_DEPTH);
		return NULL;
	}
	while (e && jp_is_name(jp_cur(p), "if")) {
		struct jexpr *c = node(p, JE_COND);

		p->pos++;
		if (!c || !(c->b = jp_or(p)))
			return NULL;
		c->a = e;
		if (jp_is_name(jp_cur(p), "else")) {
			p->pos++;
			if (!(c->c = parse_cond(p)))
				return NULL;
		}
		e = c;
	}
	p->depth--;
	return e;
}
