/* jinja_lib.c — the filters, tests, string and dict methods and global functions chat templates call, each as Jinja and Hugging Face define it. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/tokenizer/jinja_val.h"

int jx_dict_set(struct jrun *r, struct jdict *d, struct jstr k, struct jv v);

enum { F_TRIM, F_LENGTH, F_COUNT, F_TOJSON, F_UPPER, F_LOWER, F_DEFAULT, F_D, F_STRING, F_LIST,
       F_FIRST, F_LAST, F_JOIN, F_REPLACE, F_CAPITALIZE, F_TITLE, F_INT, F_FLOAT, F_ABS,
       F_SELECTATTR, F_REJECTATTR, F_SELECT, F_REJECT, F_MAP, F_SAFE, F_REVERSE, F_ITEMS,
       F_ESCAPE, F_E, F_LAST_ };
static const char *const filters[] = { "trim", "length", "count", "tojson", "upper", "lower",
	"default", "d", "string", "list", "first", "last", "join", "replace", "capitalize", "title",
	"int", "float", "abs", "selectattr", "rejectattr", "select", "reject", "map", "safe",
	"reverse", "items", "escape", "e" };

enum { TS_DEFINED, TS_UNDEFINED, TS_NONE, TS_BOOLEAN, TS_FALSE, TS_TRUE, TS_INTEGER, TS_FLOAT, TS_NUMBER,
       TS_STRING, TS_MAPPING, TS_ITERABLE, TS_SEQUENCE, TS_CALLABLE, TS_ODD, TS_EVEN, TS_DIVISIBLEBY,
       TS_EQUALTO, TS_EQ, TS_EQ2, TS_NE, TS_NE2, TS_LT, TS_LT2, TS_LE, TS_LE2, TS_GT, TS_GT2, TS_GE, TS_GE2,
       TS_IN, TS_LOWER, TS_UPPER, TS_SAMEAS, TS_LAST_ };
static const char *const tests[] = { "defined", "undefined", "none", "boolean", "false", "true",
	"integer", "float", "number", "string", "mapping", "iterable", "sequence", "callable", "odd",
	"even", "divisibleby", "equalto", "eq", "==", "ne", "!=", "lt", "<", "le", "<=", "gt", ">",
	"ge", ">=", "in", "lower", "upper", "sameas" };

static const char *const methods[] = { "strip", "lstrip", "rstrip", "startswith", "endswith",
	"upper", "lower", "title", "capitalize", "replace", "split", "join", "find", "count",
	"items", "keys", "values", "get" };

static const char *const funcs[] = { "range", "namespace", "raise_exception", "strftime_now",
	"dict" };

static int find_name(const char *const *names, size_t n, struct jstr name)
{
	for (size_t i = 0; i < n; i++)
		if (jstr_eq(name, names[i]))
			return (int)i;
	return -1;
}

#define N(a) (sizeof(a) / sizeof((a)[0]))
int jx_filter_id(struct jstr name) { return find_name(filters, N(filters), name); }
int jx_test_id(struct jstr name) { return find_name(tests, N(tests), name); }
int jx_func_id(struct jstr name) { return find_name(funcs, N(funcs), name); }
int jx_method_known(struct jstr name) { return find_name(methods, N(methods), name); }

_Static_assert(N(filters) == F_LAST_, "filter table");
_Static_assert(N(tests) == TS_LAST_, "test table");
_Static_assert(N(funcs) == JF_LAST, "function table");

/* Argument pos, or the one passed as name=; NULL if neither. */
static const struct jv *arg(const struct jargs *a, uint32_t pos, const char *name)
{
	uint32_t k = 0;

	for (uint32_t i = 0; i < a->n; i++) {
		if (a->kw[i].n ? name && jstr_eq(a->kw[i], name) : k++ == pos)
			return &a->v[i];
	}
	return NULL;
}

static int want_str(struct jrun *r, const struct jv *v, const char *what, int line)
{
	if (!v || v->type != JV_STR)
		return jr_err(r, -EINVAL, line, "%s needs a string, not '%s'", what,
			      v ? jv_type_name(*v) : "nothing");
	return 0;
}

static struct jv mklist(struct jrun *r, size_t cap)
{
	struct jlist *l = jr_alloc(r, sizeof(*l));
	struct jv v = { .type = JV_UNDEF };

	if (!l || !(l->v = jr_alloc(r, (cap + 1) * sizeof(*l->v))))
		return v;
	v.type = JV_LIST;
	v.l = l;
	return v;
}

static struct jv mkdict(struct jrun *r, int type)
{
	struct jdict *d = jr_alloc(r, sizeof(*d));
	struct jv v = { .type = JV_UNDEF };

	if (d) {
		v.type = (uint8_t)type;
		v.d = d;
	}
	return v;
}

/* ---- strings ---- */

static int in_chars(const char *s, size_t n, size_t i, struct jstr chars, size_t *k)
{
	if (!chars.p)
		return (*k = (size_t)py_space_at(s, n, i)) != 0;
	size_t len = 1;

	while (i + len < n && ((unsigned char)s[i + len] & 0xc0) == 0x80)
		len++;
	for (size_t j = 0; j + len <= chars.n; j++)
		if (!memcmp(chars.p + j, s + i, len) && (j == 0 || ((unsigned char)chars.p[j] & 0xc0) != 0x80))
			return (*k = len), 1;
	return 0;
}

static int last_in_chars(const char *s, size_t n, struct jstr chars, size_t *k)
{
	if (!chars.p)
		return (*k = (size_t)py_space_before(s, n)) != 0;
	size_t j = n - 1;

	while (j > 0 && ((unsigned char)s[j] & 0xc0) == 0x80 && n - j < 4)
		j--;
	return in_chars(s, n, j, chars, k) && j + *k == n;
}

/* str.strip(chars) (chars.p NULL: whitespace); which: 1 left, 2 right, 3 both. */
static int strip(struct jrun *r, struct jstr s, struct jstr chars, int which, struct jv *out)
{
	size_t lo = 0, hi = s.n, k;

	if (jr_work(r, s.n))
		return r->rc;
	while ((which & 1) && lo < hi && in_chars(s.p, hi, lo, chars, &k))
		lo += k;
	while ((which & 2) && hi > lo && last_in_chars(s.p + lo, hi - lo, chars, &k))
		hi -= k;
	*out = jv_str(jstr_sub(r, s, lo, hi - lo));
	return r->rc;
}

/* ASCII case mapping; mode 0 lower, 1 upper, 2 capitalize, 3 str.title, 4 the title filter. */
static int recase(struct jrun *r, struct jstr s, int mode, struct jv *out)
{
	char *p = jr_alloc(r, s.n + 1);
	int start = 1;

	if (!p)
		return r->rc;
	for (size_t i = 0; i < s.n; i++) {
		char c = s.p[i];
		int alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
		int up = mode == 1 || ((mode >= 2) && start && alpha);

		if (up && c >= 'a' && c <= 'z')
			c = (char)(c - 32);
		else if (!up && mode != 1 && c >= 'A' && c <= 'Z')
			c = (char)(c + 32);
		p[i] = c;
		if (mode == 2)
			start = 0;
		else if (mode == 3)
			start = !alpha && !(((unsigned char)c) >= 0x80);
		else if (mode == 4)
			start = strchr("- \t\n\r\v\f([{<", c) != NULL;
	}
	*out = jv_str((struct jstr){ p, s.n, s.t, s.nt });
	return 0;
}

static int replace(struct jrun *r, struct jstr s, struct jstr old, struct jstr new_, int64_t count,
		   struct jv *out)
{
	struct jbuf b = { 0 };
	size_t i = 0;

	if (jr_work(r, s.n))
		return r->rc;
	if (!old.n) {
		*out = jv_str(s);	/* inserting between characters is not something templates do */
		return jr_err(r, -ENOTSUP, 0, "chat template: replace() of an empty string");
	}
	while (i <= s.n && count--) {
		const char *at = memmem(s.p + i, s.n - i, old.p, old.n);

		if (!at)
			break;
		size_t k = (size_t)(at - s.p);

		if (jb_puts(r, &b, jstr_sub(r, s, i, k - i)) || jb_puts(r, &b, new_))
			return r->rc;
		i = k + old.n;
	}
	jb_puts(r, &b, jstr_sub(r, s, i, s.n - i));
	*out = jv_str(jb_str(&b));
	return r->rc;
}

static int split(struct jrun *r, struct jstr s, const struct jv *sep, int64_t max, struct jv *out)
{
	struct jv l = mklist(r, s.n + 1);
	size_t i = 0, k;

	if (jr_work(r, s.n))
		return r->rc;
	if (l.type != JV_LIST)
		return r->rc;
	if (sep && sep->type == JV_STR) {
		if (!sep->s.n)
			return jr_err(r, -EINVAL, 0, "chat template: split() of an empty separator");
		for (;;) {
			const char *at = max-- ? memmem(s.p + i, s.n - i, sep->s.p, sep->s.n) : NULL;
			size_t e = at ? (size_t)(at - s.p) : s.n;

			l.l->v[l.l->n++] = jv_str(jstr_sub(r, s, i, e - i));
			if (!at)
				break;
			i = e + sep->s.n;
		}
	} else {
		while (i < s.n) {
			while (i < s.n && (k = (size_t)py_space_at(s.p, s.n, i)))
				i += k;
			if (i >= s.n)
				break;
			size_t e = i;

			if (!max--)
				e = s.n;
			while (e < s.n && !py_space_at(s.p, s.n, e))
				e++;
			if (e == s.n && max < 0) {
				size_t t = s.n;	/* the rest, right-stripped, as Python keeps it */

				while (t > i && (k = (size_t)py_space_before(s.p, t)))
					t -= k;
				e = t;
			}
			l.l->v[l.l->n++] = jv_str(jstr_sub(r, s, i, e - i));
			i = e;
		}
	}
	*out = l;
	return r->rc;
}

static int affix(struct jrun *r, struct jstr s, const struct jv *x, int end, int *out, int line)
{
	*out = 0;
	if (x && x->type == JV_LIST) {
		for (size_t i = 0; i < x->l->n && !*out; i++)
			if (affix(r, s, &x->l->v[i], end, out, line))
				return r->rc;
		return 0;
	}
	if (want_str(r, x, end ? "endswith()" : "startswith()", line))
		return r->rc;
	*out = x->s.n <= s.n && !memcmp(s.p + (end ? s.n - x->s.n : 0), x->s.p, x->s.n);
	return 0;
}

static int join(struct jrun *r, struct jv seq, struct jstr sep, const struct jv *attr,
		struct jv *out, int line)
{
	struct jlist items;
	struct jbuf b = { 0 };

	if (jv_list(r, seq, &items, line))
		return r->rc;
	for (size_t i = 0; i < items.n && !r->rc; i++) {
		struct jv v = items.v[i];
		struct jstr s;

		if (attr && attr->type == JV_STR)
			v = jv_get(v, attr->s);
		if ((i && jb_puts(r, &b, sep)) || jv_to_str(r, v, &s, line) || jb_puts(r, &b, s))
			return r->rc;
	}
	*out = jv_str(jb_str(&b));
	return r->rc;
}

static int str_method(struct jrun *r, struct jstr s, int m, const struct jargs *a, struct jv *out,
		      int line)
{
	const struct jv *x = arg(a, 0, NULL), *y = arg(a, 1, NULL);
	struct jstr chars = { NULL, 0, NULL, 0 };
	int b;

	switch (m) {
	case 0: case 1: case 2:
		if (x && x->type == JV_STR)
			chars = x->s;
		return strip(r, s, chars, m == 0 ? 3 : m == 1 ? 1 : 2, out);
	case 3: case 4:
		if (affix(r, s, x, m == 4, &b, line))
			return r->rc;
		*out = jv_bool(b);
		return 0;
	case 5: return recase(r, s, 1, out);
	case 6: return recase(r, s, 0, out);
	case 7: return recase(r, s, 3, out);
	case 8: return recase(r, s, 2, out);
	case 9:
		if (want_str(r, x, "replace()", line) || want_str(r, y, "replace()", line))
			return r->rc;
		const struct jv *c = arg(a, 2, NULL);
		return replace(r, s, x->s, y->s, c && c->type == JV_INT ? c->i : -1, out);
	case 10: {
		const struct jv *mx = arg(a, 1, "maxsplit");

		return split(r, s, arg(a, 0, "sep"), mx && mx->type == JV_INT ? mx->i : -1, out);
	}
	case 11:
		return x ? join(r, *x, s, NULL, out, line) : jr_err(r, -EINVAL, line, "join() needs a list");
	case 12: case 13: {
		if (want_str(r, x, m == 12 ? "find()" : "count()", line) || jr_work(r, s.n))
			return r->rc;
		const char *at = memmem(s.p, s.n, x->s.p, x->s.n);
		int64_t n = 0;

		if (m == 12) {
			*out = jv_int(at ? (int64_t)utf8_len(s.p, (size_t)(at - s.p)) : -1);
			return 0;
		}
		for (size_t i = 0; x->s.n && (at = memmem(s.p + i, s.n - i, x->s.p, x->s.n)); n++)
			i = (size_t)(at - s.p) + x->s.n;
		*out = jv_int(x->s.n ? n : (int64_t)utf8_len(s.p, s.n) + 1);
		return 0;
	}
	}
	return jr_err(r, -EINVAL, line, "'str' object has no attribute '%s'", methods[m]);
}

static int dict_method(struct jrun *r, struct jv d, int m, const struct jargs *a, struct jv *out,
		       int line)
{
	const struct jv *x = arg(a, 0, NULL), *y = arg(a, 1, NULL);

	if (m == 17) {
		*out = x && x->type == JV_STR ? jv_get(d, x->s) : (struct jv){ .type = JV_UNDEF };
		if (out->type == JV_UNDEF)
			*out = y ? *y : (struct jv){ .type = JV_NONE };
		return 0;
	}
	if (m < 14)
		return jr_err(r, -EINVAL, line, "'dict' object has no attribute '%s'", methods[m]);
	struct jv l = mklist(r, d.d->n);

	if (l.type != JV_LIST)
		return r->rc;
	for (size_t i = 0; i < d.d->n; i++) {
		struct jv item = jv_str(d.d->k[i]);

		if (m == 16)
			item = d.d->v[i];
		else if (m == 14) {
			item = mklist(r, 2);
			if (item.type != JV_LIST)
				return r->rc;
			item.l->v[0] = jv_str(d.d->k[i]);
			item.l->v[1] = d.d->v[i];
			item.l->n = 2;
			item.l->tuple = 1;
		}
		l.l->v[l.l->n++] = item;
	}
	*out = l;
	return 0;
}

int jx_method(struct jrun *r, struct jv obj, struct jstr name, const struct jargs *a,
	      struct jv *out, int line)
{
	int m = jx_method_known(name);

	if (obj.type == JV_STR)
		return str_method(r, obj.s, m, a, out, line);
	if (obj.type == JV_DICT)
		return dict_method(r, obj, m, a, out, line);
	if (obj.type == JV_UNDEF)
		return jr_err(r, -EINVAL, line, "an undefined value has no method '%.*s'",
			      (int)name.n, name.p);
	return jr_err(r, -EINVAL, line, "'%s' object has no method '%.*s'", jv_type_name(obj),
		      (int)name.n, name.p);
}

/* ---- tojson, as Hugging Face's: json.dumps(x, ensure_ascii=False, indent=indent) ---- */

static int json_str(struct jrun *r, struct jbuf *b, struct jstr s)
{
	int t = jstr_tainted(s);

	if (jb_put(r, b, "\"", 1, 0))
		return r->rc;
	for (size_t i = 0; i < s.n && !r->rc; i++) {
		unsigned char c = (unsigned char)s.p[i];
		char esc[8];
		const char *m = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" :
				c == '\r' ? "\\r" : c == '\t' ? "\\t" : c == '\b' ? "\\b" :
				c == '\f' ? "\\f" : NULL;

		if (m)
			jb_put(r, b, m, strlen(m), t);
		else if (c < 0x20)
			snprintf(esc, sizeof(esc), "\\u%04x", c), jb_put(r, b, esc, 6, t);
		else
			jb_put(r, b, (const char *)&c, 1, t);
	}
	return jb_put(r, b, "\"", 1, 0);
}

static int json_nl(struct jrun *r, struct jbuf *b, int indent, int depth)
{
	if (indent < 0)
		return 0;
	if (jb_put(r, b, "\n", 1, 0))
		return r->rc;
	for (int i = 0; i < indent * depth && !r->rc; i++)
		jb_put(r, b, " ", 1, 0);
	return r->rc;
}

int jx_tojson(struct jrun *r, struct jbuf *b, struct jv v, int indent, int depth, int line)
{
	const char *sep = indent < 0 ? ", " : ",";
	char buf[64];

	if (depth > JINJA_MAX_DEPTH)
		return jr_err(r, -E2BIG, line, "tojson: value nested too deeply");
	switch (v.type) {
	case JV_NONE: return jb_put(r, b, "null", 4, 0);
	case JV_BOOL: return jb_put(r, b, v.b ? "true" : "false", v.b ? 4 : 5, 0);
	case JV_INT:
		snprintf(buf, sizeof(buf), "%" PRId64, v.i);
		return jb_put(r, b, buf, strlen(buf), 0);
	case JV_FLOAT: {
		struct jstr s;

		if (jv_to_str(r, v, &s, line))
			return r->rc;
		if (jstr_eq(s, "nan") || jstr_eq(s, "inf") || jstr_eq(s, "-inf"))
			s = (struct jstr){ s.p[0] == 'n' ? "NaN" : s.p[0] == 'i' ? "Infinity" : "-Infinity",
					   s.p[0] == 'n' ? 3 : s.p[0] == 'i' ? 8 : 9, NULL, 0 };
		return jb_puts(r, b, s);
	}
	case JV_STR: return json_str(r, b, v.s);
	case JV_LIST:
		jb_put(r, b, "[", 1, 0);
		for (size_t i = 0; i < v.l->n && !r->rc; i++) {
			if (i)
				jb_put(r, b, sep, strlen(sep), 0);
			json_nl(r, b, indent, depth + 1);
			jx_tojson(r, b, v.l->v[i], indent, depth + 1, line);
		}
		if (v.l->n)
			json_nl(r, b, indent, depth);
		return jb_put(r, b, "]", 1, 0);
	case JV_DICT:
		jb_put(r, b, "{", 1, 0);
		for (size_t i = 0; i < v.d->n && !r->rc; i++) {
			if (i)
				jb_put(r, b, sep, strlen(sep), 0);
			json_nl(r, b, indent, depth + 1);
			json_str(r, b, v.d->k[i]);
			jb_put(r, b, ": ", 2, 0);
			jx_tojson(r, b, v.d->v[i], indent, depth + 1, line);
		}
		if (v.d->n)
			json_nl(r, b, indent, depth);
		return jb_put(r, b, "}", 1, 0);
	default:
		return jr_err(r, -EINVAL, line, "tojson: '%s' is not JSON serializable", jv_type_name(v));
	}
}

/* ---- tests ---- */

int jx_test(struct jrun *r, int id, struct jv x, const struct jargs *a, int *out, int line)
{
	const struct jv *y = arg(a, 0, NULL);
	static const int cmp_ops[] = { JO_EQ, JO_EQ, JO_EQ, JO_NE, JO_NE, JO_LT, JO_LT, JO_LE, JO_LE,
				       JO_GT, JO_GT, JO_GE, JO_GE };
	int t = x.type;

	switch (id) {
	case TS_DEFINED: *out = t != JV_UNDEF; return 0;
	case TS_UNDEFINED: *out = t == JV_UNDEF; return 0;
	case TS_NONE: *out = t == JV_NONE; return 0;
	case TS_BOOLEAN: *out = t == JV_BOOL; return 0;
	case TS_FALSE: *out = t == JV_BOOL && !x.b; return 0;
	case TS_TRUE: *out = t == JV_BOOL && x.b; return 0;
	case TS_INTEGER: *out = t == JV_INT; return 0;
	case TS_FLOAT: *out = t == JV_FLOAT; return 0;
	case TS_NUMBER: *out = t == JV_INT || t == JV_FLOAT || t == JV_BOOL; return 0;
	case TS_STRING: *out = t == JV_STR; return 0;
	case TS_MAPPING: *out = t == JV_DICT; return 0;
	case TS_ITERABLE: case TS_SEQUENCE:
		*out = t == JV_STR || t == JV_LIST || t == JV_DICT || (id == TS_ITERABLE && t == JV_UNDEF);
		return 0;
	case TS_CALLABLE: *out = t == JV_FUNC || t == JV_MACRO; return 0;
	case TS_LOWER: case TS_UPPER: {
		int cased = 0, ok = t == JV_STR;

		for (size_t i = 0; ok && i < x.s.n; i++) {
			char c = x.s.p[i];

			cased |= (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
			ok = id == TS_LOWER ? !(c >= 'A' && c <= 'Z') : !(c >= 'a' && c <= 'z');
		}
		*out = ok && cased;
		return 0;
	}
	case TS_SAMEAS: *out = y && jv_eq(x, *y) && x.type == y->type; return 0;
	case TS_ODD: case TS_EVEN: case TS_DIVISIBLEBY: {
		int64_t d = id == TS_DIVISIBLEBY ? (y && y->type == JV_INT ? y->i : 0) : 2;

		if ((t != JV_INT && t != JV_BOOL) || !d)
			return jr_err(r, -EINVAL, line, "%s test of a '%s'", tests[id], jv_type_name(x));
		int64_t m = (t == JV_INT ? x.i : x.b) % d;

		*out = id == TS_ODD ? m != 0 : m == 0;
		return 0;
	}
	case TS_IN: {
		if (!y)
			return jr_err(r, -EINVAL, line, "the in test needs an argument");
		struct jv hay = *y;

		if (hay.type == JV_STR && x.type == JV_STR) {
			*out = !x.s.n || memmem(hay.s.p, hay.s.n, x.s.p, x.s.n);
			return 0;
		}
		struct jlist l;

		if (jv_list(r, hay, &l, line))
			return r->rc;
		*out = 0;
		for (size_t i = 0; i < l.n && !*out; i++)
			*out = jv_eq(x, l.v[i]);
		return 0;
	}
	}
	if (id >= TS_EQUALTO && id <= TS_GE2) {
		if (!y)
			return jr_err(r, -EINVAL, line, "the %s test needs an argument", tests[id]);
		int op = cmp_ops[id - TS_EQUALTO];

		if (op == JO_EQ || op == JO_NE) {
			*out = jv_eq(x, *y) == (op == JO_EQ);
			return 0;
		}
		if (!((t == JV_INT || t == JV_FLOAT) && (y->type == JV_INT || y->type == JV_FLOAT)) &&
		    !(t == JV_STR && y->type == JV_STR))
			return jr_err(r, -EINVAL, line, "cannot order '%s' and '%s'", jv_type_name(x),
				      jv_type_name(*y));
		double c;

		if (t == JV_STR) {
			size_t n = x.s.n < y->s.n ? x.s.n : y->s.n;
			int k = memcmp(x.s.p, y->s.p, n);

			c = k ? k : (double)x.s.n - (double)y->s.n;
		} else {
			c = (t == JV_INT ? (double)x.i : x.f) - (y->type == JV_INT ? (double)y->i : y->f);
		}
		*out = op == JO_LT ? c < 0 : op == JO_LE ? c <= 0 : op == JO_GT ? c > 0 : c >= 0;
		return 0;
	}
	return jr_err(r, -ENOTSUP, line, "unsupported test");
}

/* ---- filters ---- */

/* select/reject(test, args...) and selectattr/rejectattr(attr, test, args...). */
static int select_items(struct jrun *r, int id, struct jv x, const struct jargs *a, struct jv *out,
			int line)
{
	int attr = id == F_SELECTATTR || id == F_REJECTATTR;
	int keep = id == F_SELECTATTR || id == F_SELECT;
	const struct jv *an = attr ? arg(a, 0, NULL) : NULL, *tn = arg(a, attr, NULL);
	struct jargs rest = { .n = 0 };
	struct jlist items;
	int test = -1;

	if ((attr && want_str(r, an, tests[0] ? "selectattr()" : "", line)) || jv_list(r, x, &items, line))
		return r->rc;
	if (tn && (want_str(r, tn, "the test name", line) || (test = jx_test_id(tn->s)) < 0))
		return r->rc ? r->rc : jr_err(r, -ENOTSUP, line, "unsupported test '%.*s'",
					      (int)tn->s.n, tn->s.p);
	for (uint32_t i = (uint32_t)attr + 1; i < a->n; i++) {
		rest.v[rest.n] = a->v[i];
		rest.kw[rest.n++] = a->kw[i];
	}
	*out = mklist(r, items.n);
	if (out->type != JV_LIST)
		return r->rc;
	for (size_t i = 0; i < items.n; i++) {
		struct jv v = attr ? jv_get(items.v[i], an->s) : items.v[i];
		int t;

		if (test < 0)
			t = jv_truthy(v);
		else if (jx_test(r, test, v, &rest, &t, line))
			return r->rc;
		if (t == keep)
			out->l->v[out->l->n++] = items.v[i];
	}
	return 0;
}

static int map_items(struct jrun *r, struct jv x, const struct jargs *a, struct jv *out, int line)
{
	const struct jv *attr = arg(a, 99, "attribute"), *fn = arg(a, 0, NULL);
	const struct jv *dflt = arg(a, 99, "default");
	struct jargs rest = { .n = 0 };
	struct jlist items;
	int f = -1;

	if (jv_list(r, x, &items, line))
		return r->rc;
	if (!attr && (want_str(r, fn, "map()", line) || (f = jx_filter_id(fn->s)) < 0))
		return r->rc ? r->rc : jr_err(r, -ENOTSUP, line, "unsupported filter '%.*s'",
					      (int)fn->s.n, fn->s.p);
	for (uint32_t i = 1; !attr && i < a->n; i++) {
		rest.v[rest.n] = a->v[i];
		rest.kw[rest.n++] = a->kw[i];
	}
	*out = mklist(r, items.n);
	if (out->type != JV_LIST)
		return r->rc;
	for (size_t i = 0; i < items.n; i++) {
		struct jv v;

		if (attr) {
			if (want_str(r, attr, "map(attribute=)", line))
				return r->rc;
			v = jv_get(items.v[i], attr->s);
			if (v.type == JV_UNDEF && dflt)
				v = *dflt;
		} else if (jx_filter(r, f, items.v[i], &rest, &v, line)) {
			return r->rc;
		}
		out->l->v[out->l->n++] = v;
	}
	return 0;
}

static int to_number(struct jrun *r, struct jv x, const struct jargs *a, int fl, struct jv *out)
{
	const struct jv *d = arg(a, 0, "default");
	char buf[64], *end;

	*out = d ? *d : fl ? (struct jv){ .type = JV_FLOAT, .f = 0 } : jv_int(0);
	if (x.type == JV_INT || x.type == JV_BOOL)
		*out = fl ? (struct jv){ .type = JV_FLOAT, .f = x.type == JV_INT ? (double)x.i : x.b } :
			    jv_int(x.type == JV_INT ? x.i : x.b);
	else if (x.type == JV_FLOAT)
		*out = fl ? x : jv_int((int64_t)x.f);
	else if (x.type == JV_STR && x.s.n && x.s.n < sizeof(buf)) {
		memcpy(buf, x.s.p, x.s.n);
		buf[x.s.n] = 0;
		errno = 0;
		if (fl) {
			double f = strtod(buf, &end);

			if (!*end && !errno)
				*out = (struct jv){ .type = JV_FLOAT, .f = f };
		} else {
			long long i = strtoll(buf, &end, 10);

			if (!*end && !errno)
				*out = jv_int(i);
		}
	}
	return r->rc;
}

static int escape_html(struct jrun *r, struct jv x, struct jv *out, int line)
{
	struct jstr s;
	struct jbuf b = { 0 };

	if (jv_to_str(r, x, &s, line))
		return r->rc;
	for (size_t i = 0; i < s.n && !r->rc; i++) {
		const char *m = s.p[i] == '&' ? "&amp;" : s.p[i] == '<' ? "&lt;" : s.p[i] == '>' ? "&gt;" :
				s.p[i] == '"' ? "&#34;" : s.p[i] == '\'' ? "&#39;" : NULL;

		jb_put(r, &b, m ? m : s.p + i, m ? strlen(m) : 1, jstr_tainted(s));
	}
	*out = jv_str(jb_str(&b));
	return r->rc;
}

static int reverse(struct jrun *r, struct jv x, struct jv *out, int line)
{
	struct jlist items;
	struct jbuf b = { 0 };

	if (jv_list(r, x, &items, line))
		return r->rc;
	if (x.type == JV_STR) {
		for (size_t i = items.n; i-- > 0 && !r->rc;)
			jb_puts(r, &b, items.v[i].s);
		*out = jv_str(jb_str(&b));
		return r->rc;
	}
	*out = mklist(r, items.n);
	for (size_t i = items.n; out->type == JV_LIST && i-- > 0;)
		out->l->v[out->l->n++] = items.v[i];
	return r->rc;
}

static int length(struct jrun *r, struct jv x, struct jv *out, int line)
{
	switch (x.type) {
	case JV_STR:
		*out = jv_int((int64_t)utf8_len(x.s.p, x.s.n));
		return jr_work(r, x.s.n);
	case JV_LIST: *out = jv_int((int64_t)x.l->n); return 0;
	case JV_DICT: *out = jv_int((int64_t)x.d->n); return 0;
	case JV_UNDEF: *out = jv_int(0); return 0;
	default: return jr_err(r, -EINVAL, line, "object of type '%s' has no len()", jv_type_name(x));
	}
}

static int first_last(struct jrun *r, struct jv x, int last, struct jv *out, int line)
{
	struct jlist items;

	if (jv_list(r, x, &items, line))
		return r->rc;
	*out = items.n ? items.v[last ? items.n - 1 : 0] : (struct jv){ .type = JV_UNDEF };
	return 0;
}

static int filter_str(struct jrun *r, int id, struct jv x, const struct jargs *a, struct jv *out,
		      int line)
{
	const struct jv *y = arg(a, 0, NULL), *z = arg(a, 1, NULL);
	struct jstr s, chars = { NULL, 0, NULL, 0 };

	if (jv_to_str(r, x, &s, line))
		return r->rc;
	switch (id) {
	case F_TRIM:
		if (y && y->type == JV_STR)
			chars = y->s;
		return strip(r, s, chars, 3, out);
	case F_UPPER: return recase(r, s, 1, out);
	case F_LOWER: return recase(r, s, 0, out);
	case F_CAPITALIZE: return recase(r, s, 2, out);
	case F_TITLE: return recase(r, s, 4, out);
	case F_STRING: *out = jv_str(s); return 0;
	case F_REPLACE: {
		const struct jv *c = arg(a, 2, "count");

		if (want_str(r, y, "replace", line) || want_str(r, z, "replace", line))
			return r->rc;
		return replace(r, s, y->s, z->s, c && c->type == JV_INT ? c->i : -1, out);
	}
	}
	return jr_err(r, -ENOTSUP, line, "unsupported filter");
}

int jx_filter(struct jrun *r, int id, struct jv x, const struct jargs *a, struct jv *out, int line)
{
	const struct jv *y = arg(a, 0, NULL);

	switch (id) {
	case F_LENGTH: case F_COUNT: return length(r, x, out, line);
	case F_TOJSON: {
		const struct jv *ind = arg(a, 0, "indent");
		struct jbuf b = { 0 };

		for (uint32_t i = 0; i < a->n; i++)
			if (a->kw[i].n && !jstr_eq(a->kw[i], "indent") && !jstr_eq(a->kw[i], "ensure_ascii"))
				return jr_err(r, -ENOTSUP, line, "tojson(%.*s=)", (int)a->kw[i].n, a->kw[i].p);
		if (jx_tojson(r, &b, x, ind && ind->type == JV_INT ? (int)(ind->i > 64 ? 64 : ind->i) : -1,
			      0, line))
			return r->rc;
		*out = jv_str(jb_str(&b));
		return 0;
	}
	case F_DEFAULT: case F_D: {
		const struct jv *boolean = arg(a, 1, "boolean");
		int use = boolean && jv_truthy(*boolean) ? !jv_truthy(x) : x.type == JV_UNDEF;

		*out = use ? (y ? *y : jv_cstr("")) : x;
		return 0;
	}
	case F_LIST: {
		struct jlist items;

		if (jv_list(r, x, &items, line))
			return r->rc;
		*out = mklist(r, items.n);
		if (out->type == JV_LIST && items.n)
			memcpy(out->l->v, items.v, items.n * sizeof(*items.v)), out->l->n = items.n;
		return r->rc;
	}
	case F_FIRST: case F_LAST: return first_last(r, x, id == F_LAST, out, line);
	case F_JOIN: {
		struct jstr sep = { "", 0, NULL, 0 };

		y = arg(a, 0, "d");
		if (y && y->type == JV_STR)
			sep = y->s;
		return join(r, x, sep, arg(a, 1, "attribute"), out, line);
	}
	case F_INT: case F_FLOAT: return to_number(r, x, a, id == F_FLOAT, out);
	case F_ABS:
		if (x.type == JV_INT && x.i != INT64_MIN)
			*out = jv_int(x.i < 0 ? -x.i : x.i);
		else if (x.type == JV_FLOAT)
			*out = (struct jv){ .type = JV_FLOAT, .f = x.f < 0 ? -x.f : x.f };
		else
			return jr_err(r, -EINVAL, line, "bad operand type for abs(): '%s'", jv_type_name(x));
		return 0;
	case F_SELECTATTR: case F_REJECTATTR: case F_SELECT: case F_REJECT:
		return select_items(r, id, x, a, out, line);
	case F_MAP: return map_items(r, x, a, out, line);
	case F_SAFE: *out = x; return 0;
	case F_REVERSE: return reverse(r, x, out, line);
	case F_ITEMS:
		if (x.type == JV_UNDEF) {
			*out = mklist(r, 0);
			return r->rc;
		}
		if (x.type != JV_DICT)
			return jr_err(r, -EINVAL, line, "items of a '%s'", jv_type_name(x));
		return dict_method(r, x, 14, a, out, line);
	case F_ESCAPE: case F_E: return escape_html(r, x, out, line);
	}
	return filter_str(r, id, x, a, out, line);
}

/* ---- global functions ---- */

static int range(struct jrun *r, const struct jargs *a, struct jv *out, int line)
{
	int64_t v[3] = { 0, 0, 1 };

	if (a->n < 1 || a->n > 3)
		return jr_err(r, -EINVAL, line, "range() takes 1 to 3 arguments");
	for (uint32_t i = 0; i < a->n; i++) {
		if (a->v[i].type != JV_INT)
			return jr_err(r, -EINVAL, line, "range() needs integers");
		v[a->n == 1 ? 1 : i] = a->v[i].i;
	}
	if (!v[2])
		return jr_err(r, -EINVAL, line, "range() step cannot be zero");
	double n = v[2] > 0 ? ((double)v[1] - (double)v[0]) / (double)v[2] :
			      ((double)v[0] - (double)v[1]) / (double)-v[2];
	if (n > JINJA_MAX_ITERS)
		return jr_err(r, -E2BIG, line, "range() of more than %d items", JINJA_MAX_ITERS);
	if (jr_work(r, n > 0 ? (size_t)n : 0))
		return r->rc;
	*out = mklist(r, n > 0 ? (size_t)n + 1 : 0);
	for (int64_t i = v[0]; out->type == JV_LIST && (v[2] > 0 ? i < v[1] : i > v[1]); i += v[2])
		out->l->v[out->l->n++] = jv_int(i);
	return r->rc;
}

static int strftime_now(struct jrun *r, const struct jargs *a, struct jv *out, int line)
{
	const struct jv *fmt = arg(a, 0, NULL);
	char buf[256], f[128];
	struct tm tm;
	time_t t = r->c->now >= 0 ? (time_t)r->c->now : time(NULL);

	if (want_str(r, fmt, "strftime_now()", line))
		return r->rc;
	if (fmt->s.n >= sizeof(f))
		return jr_err(r, -E2BIG, line, "strftime_now() format too long");
	memcpy(f, fmt->s.p, fmt->s.n);
	f[fmt->s.n] = 0;
	if (r->c->now >= 0 ? !gmtime_r(&t, &tm) : !localtime_r(&t, &tm))
		return jr_err(r, -EINVAL, line, "strftime_now(): no time");
	size_t n = strftime(buf, sizeof(buf), f, &tm);
	char *p = jr_alloc(r, n + 1);

	if (!p)
		return r->rc;
	memcpy(p, buf, n);
	*out = jv_str((struct jstr){ p, n, NULL, 0 });
	return 0;
}

int jx_func(struct jrun *r, int id, const struct jargs *a, struct jv *out, int line)
{
	const struct jv *x = arg(a, 0, NULL);
	struct jstr msg;

	switch (id) {
	case JF_RANGE: return range(r, a, out, line);
	case JF_NAMESPACE: case JF_DICT:
		*out = mkdict(r, id == JF_NAMESPACE ? JV_NS : JV_DICT);
		if (x && (x->type == JV_DICT || x->type == JV_NS))
			for (size_t i = 0; i < x->d->n && !r->rc; i++)
				jx_dict_set(r, out->d, x->d->k[i], x->d->v[i]);
		for (uint32_t i = 0; out->type != JV_UNDEF && i < a->n && !r->rc; i++)
			if (a->kw[i].n)
				jx_dict_set(r, out->d, a->kw[i], a->v[i]);
		return r->rc;
	case JF_RAISE:
		if (jv_to_str(r, x ? *x : jv_cstr(""), &msg, line))
			return r->rc;
		return jr_err(r, JINJA_RAISED, 0, "template error: %.*s",
			      (int)(msg.n > 200 ? 200 : msg.n), msg.p);
	case JF_STRFTIME: return strftime_now(r, a, out, line);
	}
	return jr_err(r, -ENOTSUP, line, "unsupported function");
}
