/* jinja_eval.c — running a parsed template: expressions, statements, scopes, macros and the limits on all of them. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/tokenizer/jinja_val.h"

static int eval(struct jrun *r, struct jframe *f, const struct jexpr *e, struct jv *out);
static int exec_body(struct jrun *r, struct jframe *f, const struct jstmt *s);

static struct jv *lookup(struct jframe *f, struct jstr name)
{
	for (; f; f = f->parent)
		for (struct jvar *v = f->vars; v; v = v->next)
			if (v->name.n == name.n && !memcmp(v->name.p, name.p, name.n))
				return &v->v;
	return NULL;
}

static int bind(struct jrun *r, struct jframe *f, struct jstr name, struct jv v)
{
	for (struct jvar *x = f->vars; x; x = x->next)
		if (x->name.n == name.n && !memcmp(x->name.p, name.p, name.n)) {
			x->v = v;
			return 0;
		}
	struct jvar *x = jr_alloc(r, sizeof(*x));

	if (!x)
		return r->rc;
	*x = (struct jvar){ name, v, f->vars };
	f->vars = x;
	return 0;
}

int jx_dict_set(struct jrun *r, struct jdict *d, struct jstr k, struct jv v);

int jx_dict_set(struct jrun *r, struct jdict *d, struct jstr k, struct jv v)
{
	for (size_t i = 0; i < d->n; i++)
		if (d->k[i].n == k.n && !memcmp(d->k[i].p, k.p, k.n)) {
			d->v[i] = v;
			return 0;
		}
	if (d->n == d->cap) {
		size_t cap = d->cap ? d->cap * 2 : 8;
		struct jstr *nk = jr_alloc(r, cap * sizeof(*nk));
		struct jv *nv = jr_alloc(r, cap * sizeof(*nv));

		if (!nk || !nv)
			return r->rc;
		if (d->n) {
			memcpy(nk, d->k, d->n * sizeof(*nk));
			memcpy(nv, d->v, d->n * sizeof(*nv));
		}
		d->k = nk;
		d->v = nv;
		d->cap = cap;
	}
	d->k[d->n] = k;
	d->v[d->n++] = v;
	return 0;
}

static int concat(struct jrun *r, struct jstr a, struct jstr b, struct jv *out)
{
	struct jbuf buf = { 0 };

	if (jb_puts(r, &buf, a) || jb_puts(r, &buf, b))
		return r->rc;
	*out = jv_str(jb_str(&buf));
	return 0;
}

static int list_concat(struct jrun *r, struct jlist *a, struct jlist *b, struct jv *out)
{
	struct jlist *l = jr_alloc(r, sizeof(*l));

	if (!l || !(l->v = jr_alloc(r, (a->n + b->n + 1) * sizeof(*l->v))))
		return r->rc;
	memcpy(l->v, a->v, a->n * sizeof(*l->v));
	memcpy(l->v + a->n, b->v, b->n * sizeof(*l->v));
	l->n = a->n + b->n;
	out->type = JV_LIST;
	out->l = l;
	return 0;
}

static int arith(struct jrun *r, int op, struct jv a, struct jv b, struct jv *out, int line)
{
	int fl = a.type == JV_FLOAT || b.type == JV_FLOAT || op == JO_DIV || op == JO_POW;
	int64_t x = inum(a), y = inum(b), z = 0;
	double fx = num(a), fy = num(b);

	if ((op == JO_DIV || op == JO_FLOORDIV || op == JO_MOD) && (fl ? fy == 0 : y == 0))
		return jr_err(r, -EINVAL, line, "division by zero");
	if (fl) {
		out->type = JV_FLOAT;
		out->f = op == JO_ADD ? fx + fy : op == JO_SUB ? fx - fy : op == JO_MUL ? fx * fy :
			 op == JO_DIV ? fx / fy : op == JO_POW ? pow(fx, fy) :
			 op == JO_FLOORDIV ? floor(fx / fy) : fx - fy * floor(fx / fy);
		if (op == JO_POW && a.type != JV_FLOAT && b.type != JV_FLOAT && y >= 0 &&
		    fabs(out->f) < 9e15) {
			*out = jv_int((int64_t)out->f);	/* int ** int stays an int */
		}
		return 0;
	}
	int bad = op == JO_ADD ? __builtin_add_overflow(x, y, &z) :
		  op == JO_SUB ? __builtin_sub_overflow(x, y, &z) :
		  op == JO_MUL ? __builtin_mul_overflow(x, y, &z) : 0;
	if (op == JO_FLOORDIV || op == JO_MOD) {
		if (x == INT64_MIN && y == -1)
			bad = 1;
		else {
			int64_t q = x / y, m = x % y;

			if (m && ((m < 0) != (y < 0)))
				q--, m += y;
			z = op == JO_FLOORDIV ? q : m;
		}
	}
	if (bad)
		return jr_err(r, -ENOTSUP, line, "integer overflow");
	*out = jv_int(z);
	return 0;
}

static int repeat(struct jrun *r, struct jstr s, int64_t k, struct jv *out)
{
	struct jbuf b = { 0 };

	/* Past max_out the buffer refuses; an empty string would never get there. */
	for (int64_t i = 0; s.n && i < k && !r->rc; i++)
		jb_puts(r, &b, s);
	*out = jv_str(jb_str(&b));
	return r->rc;
}

static int contains(struct jrun *r, struct jv needle, struct jv hay, int *out, int line)
{
	*out = 0;
	if (hay.type == JV_STR) {
		if (needle.type != JV_STR)
			return jr_err(r, -EINVAL, line, "'in <string>' requires a string, not '%s'",
				      jv_type_name(needle));
		if (jr_work(r, hay.s.n))
			return r->rc;
		*out = !needle.s.n || memmem(hay.s.p, hay.s.n, needle.s.p, needle.s.n);
		return 0;
	}
	if (hay.type == JV_DICT || hay.type == JV_NS) {
		*out = needle.type == JV_STR && jv_get(hay, needle.s).type != JV_UNDEF;
		return 0;
	}
	if (hay.type == JV_LIST) {
		if (jr_work(r, hay.l->n))
			return r->rc;
		for (size_t i = 0; i < hay.l->n && !*out; i++)
			*out = jv_eq(needle, hay.l->v[i]);
		return 0;
	}
	if (hay.type == JV_UNDEF)
		return 0;
	return jr_err(r, -EINVAL, line, "argument of type '%s' is not iterable", jv_type_name(hay));
}

static int cmp_order(struct jrun *r, struct jv a, struct jv b, int *out, int line)
{
	if (is_num(a) && is_num(b)) {
		double x = num(a), y = num(b);

		*out = x < y ? -1 : x > y;
		if (a.type != JV_FLOAT && b.type != JV_FLOAT)
			*out = inum(a) < inum(b) ? -1 : inum(a) > inum(b);
		return 0;
	}
	if (a.type == JV_STR && b.type == JV_STR) {
		size_t n = a.s.n < b.s.n ? a.s.n : b.s.n;
		int c = memcmp(a.s.p, b.s.p, n);

		*out = c ? (c < 0 ? -1 : 1) : a.s.n < b.s.n ? -1 : a.s.n > b.s.n;
		return 0;
	}
	return jr_err(r, -EINVAL, line, "'<' not supported between '%s' and '%s'", jv_type_name(a),
		      jv_type_name(b));
}

static int binary(struct jrun *r, int op, struct jv a, struct jv b, struct jv *out, int line)
{
	int c = 0;

	switch (op) {
	case JO_CONCAT: {
		struct jstr x, y;

		if (jv_to_str(r, a, &x, line) || jv_to_str(r, b, &y, line))
			return r->rc;
		return concat(r, x, y, out);
	}
	case JO_EQ: case JO_NE:
		if (jr_work(r, a.type == JV_LIST ? a.l->n : a.type == JV_DICT ? a.d->n : 0))
			return r->rc;
		*out = jv_bool(jv_eq(a, b) == (op == JO_EQ));
		return 0;
	case JO_LT: case JO_LE: case JO_GT: case JO_GE:
		if (cmp_order(r, a, b, &c, line))
			return r->rc;
		*out = jv_bool(op == JO_LT ? c < 0 : op == JO_LE ? c <= 0 : op == JO_GT ? c > 0 : c >= 0);
		return 0;
	case JO_IN: case JO_NOTIN:
		if (contains(r, a, b, &c, line))
			return r->rc;
		*out = jv_bool(c == (op == JO_IN));
		return 0;
	}
	if (a.type == JV_UNDEF || b.type == JV_UNDEF)
		return jr_err(r, -EINVAL, line, "an undefined value in arithmetic");
	if (is_num(a) && is_num(b))
		return arith(r, op, a, b, out, line);
	if (op == JO_ADD && a.type == JV_STR && b.type == JV_STR)
		return concat(r, a.s, b.s, out);
	if (op == JO_ADD && a.type == JV_LIST && b.type == JV_LIST)
		return list_concat(r, a.l, b.l, out);
	if (op == JO_MUL && a.type == JV_STR && (b.type == JV_INT || b.type == JV_BOOL))
		return repeat(r, a.s, inum(b), out);
	if (op == JO_MUL && b.type == JV_STR && (a.type == JV_INT || a.type == JV_BOOL))
		return repeat(r, b.s, inum(a), out);
	return jr_err(r, -EINVAL, line, "unsupported operand types: '%s' and '%s'", jv_type_name(a),
		      jv_type_name(b));
}

/* Python's slice.indices(): the start, the count and the step over n items. */
static int slice_range(struct jrun *r, const struct jexpr *e, struct jframe *f, int64_t n,
		       int64_t *start, int64_t *count, int64_t *step)
{
	struct jv v[3] = { { .type = JV_NONE }, { .type = JV_NONE }, { .type = JV_NONE } };
	const struct jexpr *part[3] = { e->b, e->c, e->args[0] };

	for (int i = 0; i < 3; i++) {
		if (part[i] && eval(r, f, part[i], &v[i]))
			return r->rc;
		if (v[i].type != JV_NONE && v[i].type != JV_INT && v[i].type != JV_BOOL)
			return jr_err(r, -EINVAL, e->line, "slice indices must be integers");
	}
	int64_t st = v[2].type == JV_NONE ? 1 : inum(v[2]), lo = 0, hi = 0;

	if (!st)
		return jr_err(r, -EINVAL, e->line, "slice step cannot be zero");
	for (int i = 0; i < 2; i++) {
		int64_t x = i ? (st > 0 ? n : -1) : (st > 0 ? 0 : n - 1);

		if (v[i].type != JV_NONE) {
			x = inum(v[i]);
			if (x < 0)
				x += n;
			if (x < 0)
				x = st > 0 ? 0 : -1;
			if (x >= n)
				x = st > 0 ? n : n - 1;
		}
		if (i)
			hi = x;
		else
			lo = x;
	}
	*start = lo;
	*step = st;
	*count = st > 0 ? (hi > lo ? (hi - lo + st - 1) / st : 0) : (lo > hi ? (lo - hi - st - 1) / -st : 0);
	return 0;
}

/* Byte offsets of each code point of s, and one past the end. */
static size_t *cp_offsets(struct jrun *r, struct jstr s, size_t *n)
{
	size_t *o = jr_alloc(r, (s.n + 2) * sizeof(*o)), k = 0;

	if (!o || jr_work(r, s.n))
		return NULL;
	for (size_t i = 0; i < s.n; i++)
		if (((unsigned char)s.p[i] & 0xc0) != 0x80)
			o[k++] = i;
	o[k] = s.n;
	*n = k;
	return o;
}

static int eval_slice(struct jrun *r, struct jframe *f, const struct jexpr *e, struct jv *out)
{
	struct jv obj;
	int64_t start, count, step;

	if (eval(r, f, e->a, &obj))
		return r->rc;
	if (obj.type == JV_LIST) {
		struct jlist *l = jr_alloc(r, sizeof(*l));

		if (!l || slice_range(r, e, f, (int64_t)obj.l->n, &start, &count, &step) ||
		    !(l->v = jr_alloc(r, ((size_t)count + 1) * sizeof(*l->v))))
			return r->rc;
		for (int64_t i = 0; i < count; i++)
			l->v[l->n++] = obj.l->v[start + i * step];
		out->type = JV_LIST;
		out->l = l;
		return 0;
	}
	if (obj.type != JV_STR)
		return jr_err(r, -EINVAL, e->line, "'%s' object cannot be sliced", jv_type_name(obj));
	size_t n, *o = cp_offsets(r, obj.s, &n);

	if (!o || slice_range(r, e, f, (int64_t)n, &start, &count, &step))
		return r->rc;
	if (step == 1) {
		size_t a = o[start], b = o[start + count];

		*out = jv_str(jstr_sub(r, obj.s, a, b - a));
		return r->rc;
	}
	struct jbuf b = { 0 };

	for (int64_t i = 0; i < count && !r->rc; i++) {
		size_t at = o[start + i * step];

		jb_puts(r, &b, jstr_sub(r, obj.s, at, o[start + i * step + 1] - at));
	}
	*out = jv_str(jb_str(&b));
	return r->rc;
}

static int eval_item(struct jrun *r, struct jframe *f, const struct jexpr *e, struct jv *out)
{
	struct jv obj, key;

	if (eval(r, f, e->a, &obj) || eval(r, f, e->b, &key))
		return r->rc;
	*out = (struct jv){ .type = JV_UNDEF };
	if (obj.type == JV_UNDEF)
		return jr_err(r, -EINVAL, e->line, "an undefined value has no items");
	if ((obj.type == JV_DICT || obj.type == JV_NS) && key.type == JV_STR) {
		*out = jv_get(obj, key.s);
	} else if (obj.type == JV_LIST && (key.type == JV_INT || key.type == JV_BOOL)) {
		int64_t i = inum(key), n = (int64_t)obj.l->n;

		if (i < 0)
			i += n;
		if (i >= 0 && i < n)
			*out = obj.l->v[i];
	} else if (obj.type == JV_STR && (key.type == JV_INT || key.type == JV_BOOL)) {
		size_t n, *o = cp_offsets(r, obj.s, &n);
		int64_t i = inum(key);

		if (!o)
			return r->rc;
		if (i < 0)
			i += (int64_t)n;
		if (i >= 0 && i < (int64_t)n)
			*out = jv_str(jstr_sub(r, obj.s, o[i], o[i + 1] - o[i]));
	}
	return r->rc;
}

static int eval_args(struct jrun *r, struct jframe *f, const struct jexpr *e, struct jargs *a)
{
	a->n = e->n_args;
	for (uint32_t i = 0; i < e->n_args; i++) {
		a->kw[i] = e->kw[i];
		if (eval(r, f, e->args[i], &a->v[i]))
			return r->rc;
	}
	return 0;
}

static int call_macro(struct jrun *r, const struct jmacro *m, const struct jargs *a,
		      struct jv *out, int line)
{
	const struct jstmt *d = m->def;
	struct jframe *f = jr_alloc(r, sizeof(*f));
	struct jbuf *saved = r->out, buf = { 0 };
	uint32_t pos = 0;

	if (!f)
		return r->rc;
	if (r->calls >= JINJA_MAX_CALLS)
		return jr_err(r, -E2BIG, line, "macro calls nested deeper than %d", JINJA_MAX_CALLS);
	f->parent = m->scope;
	for (uint32_t i = 0; i < a->n; i++) {
		uint32_t k = a->kw[i].n ? 0 : pos++;

		while (a->kw[i].n && k < d->n_params && !(d->params[k].n == a->kw[i].n &&
			!memcmp(d->params[k].p, a->kw[i].p, a->kw[i].n)))
			k++;
		if (k >= d->n_params)
			return jr_err(r, -EINVAL, line, "macro '%.*s' called with an extra argument",
				      (int)d->target[0].n, d->target[0].p);
		if (bind(r, f, d->params[k], a->v[i]))
			return r->rc;
	}
	/* Parameters not passed take their defaults, evaluated at the call. */
	for (uint32_t k = 0; k < d->n_params; k++) {
		struct jv v = { .type = JV_UNDEF };
		int given = 0;

		for (struct jvar *x = f->vars; x && !given; x = x->next)
			given = x->name.p == d->params[k].p;
		if (given)
			continue;
		if ((d->defaults[k] && eval(r, f, d->defaults[k], &v)) || bind(r, f, d->params[k], v))
			return r->rc;
	}
	r->calls++;
	r->out = &buf;
	exec_body(r, f, d->body);
	r->out = saved;
	r->calls--;
	r->loopctl = 0;
	*out = jv_str(jb_str(&buf));
	return r->rc;
}

static int eval_call(struct jrun *r, struct jframe *f, const struct jexpr *e, struct jv *out)
{
	struct jargs a;
	struct jv fn;

	if (e->a->kind == JE_ATTR) {
		struct jv obj;

		if (eval(r, f, e->a->a, &obj) || eval_args(r, f, e, &a))
			return r->rc;
		return jx_method(r, obj, e->a->name, &a, out, e->line);
	}
	if (eval(r, f, e->a, &fn) || eval_args(r, f, e, &a))
		return r->rc;
	if (fn.type == JV_FUNC)
		return jx_func(r, fn.fn, &a, out, e->line);
	if (fn.type == JV_MACRO)
		return call_macro(r, fn.m, &a, out, e->line);
	return jr_err(r, -EINVAL, e->line, "'%s' object is not callable", jv_type_name(fn));
}

static int eval_filter(struct jrun *r, struct jframe *f, const struct jexpr *e, struct jv *out)
{
	struct jargs a;
	struct jv x;

	if (eval(r, f, e->a, &x) || eval_args(r, f, e, &a))
		return r->rc;
	if (e->kind == JE_FILTER)
		return jx_filter(r, e->id, x, &a, out, e->line);
	int t;

	if (jx_test(r, e->id, x, &a, &t, e->line))
		return r->rc;
	*out = jv_bool(t != e->op);
	return 0;
}

static int eval_seq(struct jrun *r, struct jframe *f, const struct jexpr *e, struct jv *out)
{
	if (e->kind == JE_LIST) {
		struct jlist *l = jr_alloc(r, sizeof(*l));

		if (!l || !(l->v = jr_alloc(r, (e->n_args + 1) * sizeof(*l->v))))
			return r->rc;
		for (uint32_t i = 0; i < e->n_args; i++)
			if (eval(r, f, e->args[i], &l->v[l->n++]))
				return r->rc;
		l->tuple = e->op;
		out->type = JV_LIST;
		out->l = l;
		return 0;
	}
	struct jdict *d = jr_alloc(r, sizeof(*d));

	if (!d)
		return r->rc;
	for (uint32_t i = 0; i + 1 < e->n_args; i += 2) {
		struct jv k, v;

		if (eval(r, f, e->args[i], &k) || eval(r, f, e->args[i + 1], &v))
			return r->rc;
		if (k.type != JV_STR)
			return jr_err(r, -ENOTSUP, e->line, "dict keys other than strings");
		if (jx_dict_set(r, d, k.s, v))
			return r->rc;
	}
	out->type = JV_DICT;
	out->d = d;
	return 0;
}

static int eval_name(struct jrun *r, struct jframe *f, const struct jexpr *e, struct jv *out)
{
	struct jv *v = lookup(f, e->name);
	int id;

	(void)r;
	if (v)
		*out = *v;
	else if ((id = jx_func_id(e->name)) >= 0)
		*out = (struct jv){ .type = JV_FUNC, .fn = id };
	else
		*out = (struct jv){ .type = JV_UNDEF };
	return 0;
}

static int eval(struct jrun *r, struct jframe *f, const struct jexpr *e, struct jv *out)
{
	struct jv a, b;

	if (r->rc || jr_work(r, 1))
		return r->rc;
	switch (e->kind) {
	case JE_LIT: *out = e->lit; return 0;
	case JE_NAME: return eval_name(r, f, e, out);
	case JE_ATTR:
		if (eval(r, f, e->a, &a))
			return r->rc;
		if (a.type == JV_UNDEF)
			return jr_err(r, -EINVAL, e->line, "an undefined value has no attribute '%.*s'",
				      (int)e->name.n, e->name.p);
		*out = jv_get(a, e->name);
		return 0;
	case JE_ITEM: return eval_item(r, f, e, out);
	case JE_SLICE: return eval_slice(r, f, e, out);
	case JE_CALL: return eval_call(r, f, e, out);
	case JE_FILTER: case JE_TEST: return eval_filter(r, f, e, out);
	case JE_BIN:
		if (eval(r, f, e->a, &a) || eval(r, f, e->b, &b))
			return r->rc;
		return binary(r, e->op, a, b, out, e->line);
	case JE_NEG:
		if (eval(r, f, e->a, &a))
			return r->rc;
		if (!is_num(a))
			return jr_err(r, -EINVAL, e->line, "bad operand type for unary -: '%s'",
				      jv_type_name(a));
		if (e->op)
			*out = a.type == JV_BOOL ? jv_int(a.b) : a;
		else if (a.type == JV_FLOAT)
			*out = (struct jv){ .type = JV_FLOAT, .f = -a.f };
		else if (inum(a) == INT64_MIN)
			return jr_err(r, -ENOTSUP, e->line, "integer overflow");
		else
			*out = jv_int(-inum(a));
		return 0;
	case JE_NOT:
		if (eval(r, f, e->a, &a))
			return r->rc;
		*out = jv_bool(!jv_truthy(a));
		return 0;
	case JE_AND: case JE_OR:
		if (eval(r, f, e->a, &a))
			return r->rc;
		if (jv_truthy(a) == (e->kind == JE_OR)) {
			*out = a;
			return 0;
		}
		return eval(r, f, e->b, out);
	case JE_COND:
		if (eval(r, f, e->b, &a))
			return r->rc;
		if (jv_truthy(a))
			return eval(r, f, e->a, out);
		if (e->c)
			return eval(r, f, e->c, out);
		*out = (struct jv){ .type = JV_UNDEF };
		return 0;
	case JE_LIST: case JE_DICT: return eval_seq(r, f, e, out);
	}
	return jr_err(r, -EINVAL, e->line, "bad expression");
}

static int output(struct jrun *r, struct jframe *f, const struct jexpr *e)
{
	struct jv v;
	struct jstr s;

	if (eval(r, f, e, &v) || jv_to_str(r, v, &s, e->line))
		return r->rc;
	return jb_puts(r, r->out, s);
}

static int exec_set(struct jrun *r, struct jframe *f, const struct jstmt *s)
{
	struct jv v;

	if (s->kind == JS_SET_BLOCK) {
		struct jbuf *saved = r->out, buf = { 0 };

		r->out = &buf;
		exec_body(r, f, s->body);
		r->out = saved;
		return r->rc ? r->rc : bind(r, f, s->target[0], jv_str(jb_str(&buf)));
	}
	if (eval(r, f, s->e, &v))
		return r->rc;
	if (!s->attr.n)
		return bind(r, f, s->target[0], v);
	struct jv *ns = lookup(f, s->target[0]);

	if (!ns || ns->type != JV_NS)
		return jr_err(r, -EINVAL, s->line, "'%.*s' is not a namespace(): cannot set '%.*s'",
			      (int)s->target[0].n, s->target[0].p, (int)s->attr.n, s->attr.p);
	return jx_dict_set(r, ns->d, s->attr, v);
}

/* The loop object of one iteration: index, index0, first, last, length, ... */
static int loop_obj(struct jrun *r, const struct jlist *items, size_t i, struct jv *out)
{
	static const char *const keys[] = { "index0", "index", "revindex0", "revindex", "first",
					    "last", "length", "previtem", "nextitem" };
	struct jdict *d = jr_alloc(r, sizeof(*d));
	int64_t n = (int64_t)items->n, k = (int64_t)i;
	struct jv v[9] = { jv_int(k), jv_int(k + 1), jv_int(n - k - 1), jv_int(n - k),
			   jv_bool(k == 0), jv_bool(k == n - 1), jv_int(n),
			   { .type = JV_UNDEF }, { .type = JV_UNDEF } };

	if (!d || !(d->k = jr_alloc(r, 9 * sizeof(*d->k))) || !(d->v = jr_alloc(r, 9 * sizeof(*d->v))))
		return r->rc;
	if (i > 0)
		v[7] = items->v[i - 1];
	if (k + 1 < n)
		v[8] = items->v[i + 1];
	for (int j = 0; j < 9; j++) {
		d->k[j] = (struct jstr){ keys[j], strlen(keys[j]), NULL, 0 };
		d->v[j] = v[j];
	}
	d->n = d->cap = 9;
	out->type = JV_DICT;
	out->d = d;
	return 0;
}

static int bind_target(struct jrun *r, struct jframe *f, const struct jstmt *s, struct jv item)
{
	if (s->n_target == 1)
		return bind(r, f, s->target[0], item);
	if (item.type != JV_LIST || item.l->n != 2)
		return jr_err(r, -EINVAL, s->line, "cannot unpack a '%s' into two loop variables",
			      jv_type_name(item));
	return bind(r, f, s->target[0], item.l->v[0]) || bind(r, f, s->target[1], item.l->v[1]);
}

/* The items the loop visits: its `if` filter applied first, so loop.length counts them. */
static int loop_items(struct jrun *r, struct jframe *f, const struct jstmt *s, struct jlist *items)
{
	struct jv it;
	struct jlist all;

	if (eval(r, f, s->e, &it) || jv_list(r, it, &all, s->line))
		return r->rc;
	if (!s->cond) {
		*items = all;
		return 0;
	}
	items->n = 0;
	if (!(items->v = jr_alloc(r, (all.n + 1) * sizeof(*items->v))))
		return r->rc;
	for (size_t i = 0; i < all.n; i++) {
		struct jframe tmp = { NULL, f };
		struct jv c;

		if (++r->iters > JINJA_MAX_ITERS)
			return jr_err(r, -E2BIG, s->line, "more than %d loop iterations", JINJA_MAX_ITERS);
		if (bind_target(r, &tmp, s, all.v[i]) || eval(r, &tmp, s->cond, &c))
			return r->rc;
		if (jv_truthy(c))
			items->v[items->n++] = all.v[i];
	}
	return 0;
}

static int exec_for(struct jrun *r, struct jframe *f, const struct jstmt *s)
{
	struct jlist items = { 0 };

	if (loop_items(r, f, s, &items))
		return r->rc;
	for (size_t i = 0; i < items.n; i++) {
		struct jframe *it = jr_alloc(r, sizeof(*it));
		struct jv loop;

		if (!it)
			return r->rc;
		if (++r->iters > JINJA_MAX_ITERS)
			return jr_err(r, -E2BIG, s->line, "more than %d loop iterations", JINJA_MAX_ITERS);
		it->parent = f;
		if (loop_obj(r, &items, i, &loop) || bind(r, it, (struct jstr){ "loop", 4, NULL, 0 }, loop) ||
		    bind_target(r, it, s, items.v[i]) || exec_body(r, it, s->body))
			return r->rc;
		if (r->loopctl == 1) {
			r->loopctl = 0;
			break;
		}
		r->loopctl = 0;
	}
	if (!items.n && s->orelse)
		return exec_body(r, f, s->orelse);
	return r->rc;
}

static int exec_stmt(struct jrun *r, struct jframe *f, const struct jstmt *s)
{
	struct jv c;

	switch (s->kind) {
	case JS_TEXT: return jb_puts(r, r->out, s->text);
	case JS_OUT: return output(r, f, s->e);
	case JS_IF:
		if (eval(r, f, s->e, &c))
			return r->rc;
		return exec_body(r, f, jv_truthy(c) ? s->body : s->orelse);
	case JS_FOR: return exec_for(r, f, s);
	case JS_SET: case JS_SET_BLOCK: return exec_set(r, f, s);
	case JS_MACRO: {
		struct jmacro *m = jr_alloc(r, sizeof(*m));

		if (!m)
			return r->rc;
		m->def = s;
		m->scope = f;
		return bind(r, f, s->target[0], (struct jv){ .type = JV_MACRO, .m = m });
	}
	case JS_BREAK: case JS_CONTINUE:
		r->loopctl = s->kind == JS_BREAK ? 1 : 2;
		return 0;
	case JS_BLOCK: return exec_body(r, f, s->body);
	}
	return jr_err(r, -EINVAL, s->line, "bad statement");
}

static int exec_body(struct jrun *r, struct jframe *f, const struct jstmt *s)
{
	for (; s && !r->rc && !r->loopctl; s = s->next)
		exec_stmt(r, f, s);
	return r->rc;
}

static int messages(struct jrun *r, const struct jinja_ctx *c, struct jv *out)
{
	struct jlist *l = jr_alloc(r, sizeof(*l));

	if (!l || !(l->v = jr_alloc(r, (c->n_msgs + 1) * sizeof(*l->v))))
		return r->rc;
	for (size_t i = 0; i < c->n_msgs; i++) {
		struct jdict *d = jr_alloc(r, sizeof(*d));
		struct jtaint *t = jr_alloc(r, sizeof(*t));
		struct jstr content = { c->msgs[i].content, strlen(c->msgs[i].content), t, 1 };

		if (!d || !t)
			return r->rc;
		*t = (struct jtaint){ 0, content.n };
		if (!content.n)
			content.nt = 0;
		if (jx_dict_set(r, d, (struct jstr){ "role", 4, NULL, 0 }, jv_cstr(c->msgs[i].role)) ||
		    jx_dict_set(r, d, (struct jstr){ "content", 7, NULL, 0 }, jv_str(content)))
			return r->rc;
		l->v[l->n++] = (struct jv){ .type = JV_DICT, .d = d };
	}
	out->type = JV_LIST;
	out->l = l;
	return 0;
}

static int globals(struct jrun *r, struct jframe *root, const struct jinja_ctx *c)
{
	struct jv msgs;

	if (messages(r, c, &msgs))
		return r->rc;
	return bind(r, root, (struct jstr){ "messages", 8, NULL, 0 }, msgs) ||
	       bind(r, root, (struct jstr){ "add_generation_prompt", 21, NULL, 0 },
		    jv_bool(c->add_generation_prompt)) ||
	       bind(r, root, (struct jstr){ "bos_token", 9, NULL, 0 },
		    jv_cstr(c->bos_token ? c->bos_token : "")) ||
	       bind(r, root, (struct jstr){ "eos_token", 9, NULL, 0 },
		    jv_cstr(c->eos_token ? c->eos_token : "")) ||
	       bind(r, root, (struct jstr){ "tools", 5, NULL, 0 }, (struct jv){ .type = JV_NONE });
}

static int copy_out(struct jrun *r, const struct jbuf *b, struct jinja_out *out)
{
	out->text = malloc(b->n + 1);
	out->spans = malloc((b->nt ? b->nt : 1) * sizeof(*out->spans));
	if (!out->text || !out->spans) {
		free(out->text);
		free(out->spans);
		*out = (struct jinja_out){ 0 };
		return jr_err(r, -ENOMEM, 0, "chat template: out of memory");
	}
	if (b->n)
		memcpy(out->text, b->p, b->n);
	out->text[b->n] = 0;
	out->len = b->n;
	for (size_t i = 0; i < b->nt; i++)
		out->spans[i] = (struct jinja_span){ b->t[i].off, b->t[i].len };
	out->n_spans = b->nt;
	return 0;
}

int jinja_render(const struct jinja_tmpl *t, const struct jinja_ctx *c, struct jinja_out *out,
		 char *err, size_t errlen)
{
	struct jrun r = { .c = c, .err = err, .errlen = errlen };
	struct jbuf buf = { 0 };
	struct jframe root = { 0 };

	*out = (struct jinja_out){ 0 };
	if (errlen)
		err[0] = 0;
	r.max_out = c->max_out ? c->max_out : JINJA_MAX_OUT;
	r.out = &buf;
	r.root = &root;
	for (size_t i = 0; i < c->n_msgs; i++)
		if (!c->msgs[i].role || !c->msgs[i].content)
			return jr_err(&r, -EINVAL, 0, "chat template: a message without role or content");
	if (!globals(&r, &root, c) && !exec_body(&r, &root, t->body))
		copy_out(&r, &buf, out);
	ja_free(&r.a);
	return r.rc;
}
