/* jinja_val.c — template values with Python's semantics: strings that remember which bytes are a message's text, equality, str() and repr(). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/tokenizer/jinja_val.h"

struct jblock {
	struct jblock *next;
	size_t used, cap;
	_Alignas(16) unsigned char mem[];
};

void *ja_alloc(struct jarena *a, size_t n)
{
	struct jblock *b = a->head;

	n = (n + 15) & ~(size_t)15;
	if (n > JINJA_MAX_ARENA)
		return NULL;
	if (!b || b->cap - b->used < n) {
		size_t cap = n > 65536 ? n : 65536;

		if (a->total + cap > JINJA_MAX_ARENA)
			return NULL;
		b = malloc(sizeof(*b) + cap);
		if (!b)
			return NULL;
		b->next = a->head;
		b->used = 0;
		b->cap = cap;
		a->head = b;
		a->total += cap;
	}
	void *p = b->mem + b->used;
	b->used += n;
	memset(p, 0, n);
	return p;
}

void ja_free(struct jarena *a)
{
	while (a->head) {
		struct jblock *b = a->head;

		a->head = b->next;
		free(b);
	}
	a->total = 0;
}

int jstr_eq(struct jstr a, const char *s)
{
	return a.n == strlen(s) && !memcmp(a.p, s, a.n);
}


int jr_err(struct jrun *r, int rc, int line, const char *fmt, ...)
{
	if (!r->rc) {
		int k = line ? snprintf(r->err, r->errlen, "chat template line %d: ", line) : 0;
		va_list ap;

		va_start(ap, fmt);
		if (k >= 0 && (size_t)k < r->errlen)
			vsnprintf(r->err + k, r->errlen - (size_t)k, fmt, ap);
		va_end(ap);
		r->rc = rc;
	}
	return r->rc;
}

int jr_work(struct jrun *r, size_t n)
{
	r->work += n;
	if (r->work > JINJA_MAX_WORK)
		return jr_err(r, -E2BIG, 0, "chat template: more than %d steps of work",
			      JINJA_MAX_WORK);
	return r->rc;
}

void *jr_alloc(struct jrun *r, size_t n)
{
	void *p = ja_alloc(&r->a, n);

	if (!p)
		jr_err(r, -E2BIG, 0, "chat template: rendering needs more than %u MiB",
		       JINJA_MAX_ARENA >> 20);
	return p;
}

static int jb_grow(struct jrun *r, struct jbuf *b, size_t need)
{
	if (need > r->max_out)
		return jr_err(r, -E2BIG, 0, "chat template: output longer than %zu bytes", r->max_out);
	if (need <= b->cap)
		return 0;
	size_t cap = b->cap ? b->cap : 256;

	while (cap < need)
		cap *= 2;
	char *p = jr_alloc(r, cap);
	if (!p)
		return r->rc;
	if (b->n)
		memcpy(p, b->p, b->n);
	b->p = p;
	b->cap = cap;
	return 0;
}

static int jb_taint(struct jrun *r, struct jbuf *b, size_t off, size_t len)
{
	if (!len)
		return 0;
	if (b->nt && b->t[b->nt - 1].off + b->t[b->nt - 1].len == off) {
		b->t[b->nt - 1].len += len;
		return 0;
	}
	if (b->nt == b->capt) {
		size_t cap = b->capt ? b->capt * 2 : 8;
		struct jtaint *t = jr_alloc(r, cap * sizeof(*t));

		if (!t)
			return r->rc;
		if (b->nt)
			memcpy(t, b->t, b->nt * sizeof(*t));
		b->t = t;
		b->capt = cap;
	}
	b->t[b->nt++] = (struct jtaint){ off, len };
	return 0;
}

int jb_put(struct jrun *r, struct jbuf *b, const char *s, size_t n, int tainted)
{
	if (jb_grow(r, b, b->n + n + 1))
		return r->rc;
	if (n)
		memcpy(b->p + b->n, s, n);
	if (tainted && jb_taint(r, b, b->n, n))
		return r->rc;
	b->n += n;
	return 0;
}

int jb_puts(struct jrun *r, struct jbuf *b, struct jstr s)
{
	size_t base = b->n;

	if (jb_put(r, b, s.p, s.n, 0))
		return r->rc;
	for (uint32_t i = 0; i < s.nt; i++)
		if (jb_taint(r, b, base + s.t[i].off, s.t[i].len))
			return r->rc;
	return 0;
}

struct jstr jb_str(const struct jbuf *b)
{
	return (struct jstr){ b->p ? b->p : "", b->n, b->t, (uint32_t)b->nt };
}

struct jv jv_str(struct jstr s)
{
	struct jv v = { .type = JV_STR };

	v.s = s;
	return v;
}

struct jv jv_cstr(const char *s)
{
	return jv_str((struct jstr){ s, strlen(s), NULL, 0 });
}

struct jv jv_int(int64_t i)
{
	struct jv v = { .type = JV_INT };

	v.i = i;
	return v;
}

struct jv jv_bool(int b)
{
	struct jv v = { .type = JV_BOOL };

	v.b = !!b;
	return v;
}

int jstr_tainted(struct jstr s)
{
	return s.nt != 0;
}

/* s[off, off + len) keeping the message-text ranges that fall in it. */
struct jstr jstr_sub(struct jrun *r, struct jstr s, size_t off, size_t len)
{
	struct jstr o = { s.p + off, len, NULL, 0 };
	struct jtaint *t = NULL;

	for (uint32_t i = 0; i < s.nt; i++) {
		size_t lo = s.t[i].off > off ? s.t[i].off : off;
		size_t hi = s.t[i].off + s.t[i].len < off + len ? s.t[i].off + s.t[i].len : off + len;

		if (lo >= hi)
			continue;
		if (!t && !(t = jr_alloc(r, s.nt * sizeof(*t))))
			return o;
		t[o.nt++] = (struct jtaint){ lo - off, hi - lo };
	}
	o.t = t;
	return o;
}

size_t utf8_len(const char *s, size_t n)
{
	size_t k = 0;

	for (size_t i = 0; i < n; i++)
		k += ((unsigned char)s[i] & 0xc0) != 0x80;
	return k;
}

static uint32_t cp_at(const char *s, size_t n, size_t i, size_t *len)
{
	const unsigned char *u = (const unsigned char *)s + i;
	size_t k = u[0] < 0x80 ? 1 : u[0] < 0xe0 ? 2 : u[0] < 0xf0 ? 3 : 4;
	uint32_t cp;

	if (i + k > n)
		k = 1;
	cp = k == 1 ? u[0] : k == 2 ? u[0] & 0x1f : k == 3 ? u[0] & 0x0f : u[0] & 0x07;
	for (size_t j = 1; j < k; j++)
		cp = cp << 6 | (u[j] & 0x3f);
	*len = k;
	return cp;
}

/* str.isspace() of Python, which strip() and split() use. */
static int py_space(uint32_t c)
{
	return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
	       c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
	       c == 0x202f || c == 0x205f || c == 0x3000;
}

int py_space_at(const char *s, size_t n, size_t i)
{
	size_t k;

	return py_space(cp_at(s, n, i, &k)) ? (int)k : 0;
}

int py_space_before(const char *s, size_t i)
{
	size_t j = i - 1, k;

	while (j > 0 && ((unsigned char)s[j] & 0xc0) == 0x80 && i - j < 4)
		j--;
	return py_space(cp_at(s, i, j, &k)) && j + k == i ? (int)(i - j) : 0;
}

const char *jv_type_name(struct jv v)
{
	static const char *const names[] = { "undefined", "NoneType", "bool", "int", "float", "str",
					     "list", "dict", "Namespace", "function", "macro" };
	return names[v.type];
}

int jv_truthy(struct jv v)
{
	switch (v.type) {
	case JV_UNDEF: case JV_NONE: return 0;
	case JV_BOOL: return v.b;
	case JV_INT: return v.i != 0;
	case JV_FLOAT: return v.f != 0;
	case JV_STR: return v.s.n != 0;
	case JV_LIST: return v.l->n != 0;
	case JV_DICT: return v.d->n != 0;
	default: return 1;
	}
}

static int jstr_same(struct jstr a, struct jstr b)
{
	return a.n == b.n && !memcmp(a.p, b.p, a.n);
}

struct jv jv_get(struct jv obj, struct jstr key)
{
	struct jv u = { .type = JV_UNDEF };

	if (obj.type != JV_DICT && obj.type != JV_NS)
		return u;
	for (size_t i = 0; i < obj.d->n; i++)
		if (jstr_same(obj.d->k[i], key))
			return obj.d->v[i];
	return u;
}

/* Values nested deeper than the bound (built in a loop) compare unequal rather than recurse on. */
static int eq_at(struct jv a, struct jv b, int depth)
{
	if (depth > JINJA_MAX_DEPTH)
		return 0;
	if (is_num(a) && is_num(b))
		return a.type == JV_FLOAT || b.type == JV_FLOAT ? num(a) == num(b) : inum(a) == inum(b);
	if (a.type != b.type)
		return 0;
	switch (a.type) {
	case JV_UNDEF: case JV_NONE: return 1;
	case JV_STR: return jstr_same(a.s, b.s);
	case JV_LIST:
		if (a.l->n != b.l->n)
			return 0;
		for (size_t i = 0; i < a.l->n; i++)
			if (!eq_at(a.l->v[i], b.l->v[i], depth + 1))
				return 0;
		return 1;
	case JV_DICT:
		if (a.d->n != b.d->n)
			return 0;
		for (size_t i = 0; i < a.d->n; i++) {
			struct jv o = jv_get(b, a.d->k[i]);

			if (o.type == JV_UNDEF || !eq_at(a.d->v[i], o, depth + 1))
				return 0;
		}
		return 1;
	case JV_NS: return a.d == b.d;
	case JV_FUNC: return a.fn == b.fn;
	case JV_MACRO: return a.m == b.m;
	default: return 0;
	}
}

int jv_eq(struct jv a, struct jv b)
{
	return eq_at(a, b, 0);
}

/* Python's repr() of a float: the shortest text that reads back the same. */
static void float_repr(double f, char *buf, size_t cap)
{
	if (isnan(f)) {
		snprintf(buf, cap, "nan");
		return;
	}
	if (isinf(f)) {
		snprintf(buf, cap, f < 0 ? "-inf" : "inf");
		return;
	}
	for (int prec = 1; prec <= 17; prec++) {
		snprintf(buf, cap, "%.*g", prec, f);
		if (strtod(buf, NULL) == f)
			break;
	}
	char *e = strchr(buf, 'e');
	int ex = e ? atoi(e + 1) : 0;

	/* Python writes plain digits for exponents -5 < x < 16, %g only up to the precision. */
	if (e && ex >= -4 && ex < 16) {
		char mant[32];
		int digits = 0;

		for (const char *c = buf; c < e; c++)
			digits += *c >= '0' && *c <= '9';
		snprintf(mant, sizeof(mant), "%.*f", ex >= digits - 1 ? 0 : digits - 1 - ex, f);
		snprintf(buf, cap, "%s", mant);
	}
	if (!strpbrk(buf, ".enia"))
		strncat(buf, ".0", cap - strlen(buf) - 1);
}

static int repr_str(struct jrun *r, struct jbuf *b, struct jstr s)
{
	char q = memchr(s.p, '\'', s.n) && !memchr(s.p, '"', s.n) ? '"' : '\'';

	if (jb_put(r, b, &q, 1, 0))
		return r->rc;
	for (size_t i = 0; i < s.n; i++) {
		unsigned char c = (unsigned char)s.p[i];
		char esc[8];
		size_t k = 0;

		if (c == '\\' || c == (unsigned char)q)
			esc[k++] = '\\', esc[k++] = (char)c;
		else if (c == '\n')
			esc[k++] = '\\', esc[k++] = 'n';
		else if (c == '\r')
			esc[k++] = '\\', esc[k++] = 'r';
		else if (c == '\t')
			esc[k++] = '\\', esc[k++] = 't';
		else if (c < 0x20 || c == 0x7f)
			k = (size_t)snprintf(esc, sizeof(esc), "\\x%02x", c);
		else
			esc[k++] = (char)c;
		if (jb_put(r, b, esc, k, jstr_tainted(s)))
			return r->rc;
	}
	return jb_put(r, b, &q, 1, 0);
}

static int scalar_str(struct jv v, char *buf, size_t cap)
{
	switch (v.type) {
	case JV_UNDEF: buf[0] = 0; return 1;
	case JV_NONE: snprintf(buf, cap, "None"); return 1;
	case JV_BOOL: snprintf(buf, cap, v.b ? "True" : "False"); return 1;
	case JV_INT: snprintf(buf, cap, "%" PRId64, v.i); return 1;
	case JV_FLOAT: float_repr(v.f, buf, cap); return 1;
	case JV_FUNC: case JV_MACRO: snprintf(buf, cap, "<function>"); return 1;
	default: return 0;
	}
}

static int repr_at(struct jrun *r, struct jbuf *b, struct jv v, int line, int depth)
{
	char buf[64];

	if (depth > JINJA_MAX_DEPTH)
		return jr_err(r, -E2BIG, line, "value nested too deeply");
	if (scalar_str(v, buf, sizeof(buf)))
		return jb_put(r, b, buf, strlen(buf), 0);
	if (v.type == JV_STR)
		return repr_str(r, b, v.s);
	if (v.type == JV_LIST) {
		jb_put(r, b, v.l->tuple ? "(" : "[", 1, 0);
		for (size_t i = 0; i < v.l->n && !r->rc; i++) {
			if (i)
				jb_put(r, b, ", ", 2, 0);
			repr_at(r, b, v.l->v[i], line, depth + 1);
		}
		if (v.l->tuple && v.l->n == 1)
			jb_put(r, b, ",", 1, 0);
		jb_put(r, b, v.l->tuple ? ")" : "]", 1, 0);
	} else {
		if (v.type == JV_NS)
			jb_put(r, b, "<Namespace ", 11, 0);
		jb_put(r, b, "{", 1, 0);
		for (size_t i = 0; i < v.d->n && !r->rc; i++) {
			if (i)
				jb_put(r, b, ", ", 2, 0);
			repr_str(r, b, v.d->k[i]);
			jb_put(r, b, ": ", 2, 0);
			repr_at(r, b, v.d->v[i], line, depth + 1);
		}
		jb_put(r, b, v.type == JV_NS ? "}>" : "}", v.type == JV_NS ? 2 : 1, 0);
	}
	return r->rc;
}

int jv_repr(struct jrun *r, struct jbuf *b, struct jv v, int line)
{
	return repr_at(r, b, v, line, 0);
}

int jv_to_str(struct jrun *r, struct jv v, struct jstr *out, int line)
{
	char buf[64];

	if (v.type == JV_STR) {
		*out = v.s;
		return 0;
	}
	if (scalar_str(v, buf, sizeof(buf))) {
		size_t n = strlen(buf);
		char *p = jr_alloc(r, n + 1);

		if (!p)
			return r->rc;
		memcpy(p, buf, n);
		*out = (struct jstr){ p, n, NULL, 0 };
		return 0;
	}
	struct jbuf b = { 0 };

	if (jv_repr(r, &b, v, line))
		return r->rc;
	*out = jb_str(&b);
	return 0;
}

/* The items a for loop or a filter walks: a list's, a dict's keys, a string's characters. */
int jv_list(struct jrun *r, struct jv v, struct jlist *out, int line)
{
	*out = (struct jlist){ 0 };
	if (jr_work(r, v.type == JV_LIST ? v.l->n : v.type == JV_DICT ? v.d->n :
		       v.type == JV_STR ? v.s.n : 0))
		return r->rc;
	switch (v.type) {
	case JV_UNDEF:
		return 0;
	case JV_LIST:
		*out = *v.l;
		return 0;
	case JV_DICT:
		if (!(out->v = jr_alloc(r, (v.d->n + 1) * sizeof(*out->v))))
			return r->rc;
		for (size_t i = 0; i < v.d->n; i++)
			out->v[i] = jv_str(v.d->k[i]);
		out->n = v.d->n;
		return 0;
	case JV_STR:
		if (!(out->v = jr_alloc(r, (v.s.n + 1) * sizeof(*out->v))))
			return r->rc;
		for (size_t i = 0, k; i < v.s.n; i += k) {
			cp_at(v.s.p, v.s.n, i, &k);
			out->v[out->n++] = jv_str(jstr_sub(r, v.s, i, k));
		}
		return r->rc;
	default:
		return jr_err(r, -EINVAL, line, "'%s' object is not iterable", jv_type_name(v));
	}
}

