/* jinja_val.h — values and the render state, shared by jinja_val.c, jinja_eval.c and jinja_lib.c only. */
#ifndef KVD_JINJA_VAL_H
#define KVD_JINJA_VAL_H

#include "daemon/tokenizer/jinja_int.h"

struct jvar {
	struct jstr name;
	struct jv v;
	struct jvar *next;
};

struct jframe {
	struct jvar *vars;
	struct jframe *parent;
};

/* A growing string in the arena, with its message-text ranges. */
struct jbuf {
	char *p;
	size_t n, cap;
	struct jtaint *t;
	size_t nt, capt;
};

struct jrun {
	struct jarena a;
	const struct jinja_ctx *c;
	struct jbuf *out;
	struct jframe *root;
	size_t iters, work, max_out;
	int calls;
	int loopctl;		/* 1: break, 2: continue pending */
	char *err;
	size_t errlen;
	int rc;
};

int jr_err(struct jrun *r, int rc, int line, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
void *jr_alloc(struct jrun *r, size_t n);
/* Count n steps of work: a template that loops over big lists inside loops ends, -E2BIG. */
int jr_work(struct jrun *r, size_t n);

int jb_put(struct jrun *r, struct jbuf *b, const char *s, size_t n, int tainted);
int jb_puts(struct jrun *r, struct jbuf *b, struct jstr s);
struct jstr jb_str(const struct jbuf *b);

struct jv jv_str(struct jstr s);
struct jv jv_cstr(const char *s);
struct jv jv_int(int64_t i);
struct jv jv_bool(int b);
struct jstr jstr_sub(struct jrun *r, struct jstr s, size_t off, size_t len);
int jstr_tainted(struct jstr s);
/* Python's str(v) (and repr(v) with repr); 0 or an error. */
int jv_to_str(struct jrun *r, struct jv v, struct jstr *out, int line);
int jv_repr(struct jrun *r, struct jbuf *b, struct jv v, int line);
int jv_truthy(struct jv v);
int jv_eq(struct jv a, struct jv b);
struct jv jv_get(struct jv obj, struct jstr key);
int jv_list(struct jrun *r, struct jv v, struct jlist *out, int line);
const char *jv_type_name(struct jv v);
size_t utf8_len(const char *s, size_t n);
int py_space_at(const char *s, size_t n, size_t i);	/* bytes of the Python whitespace at s[i], or 0 */
int py_space_before(const char *s, size_t i);		/* bytes of the one ending at s[i] */

/* jinja_lib.c: the named operations, arguments evaluated. */
struct jargs {
	struct jv v[JINJA_MAX_ARGS];
	struct jstr kw[JINJA_MAX_ARGS];
	uint32_t n;
};
int jx_filter(struct jrun *r, int id, struct jv x, const struct jargs *a, struct jv *out, int line);
int jx_test(struct jrun *r, int id, struct jv x, const struct jargs *a, int *out, int line);
int jx_method(struct jrun *r, struct jv obj, struct jstr name, const struct jargs *a,
	      struct jv *out, int line);
int jx_func(struct jrun *r, int id, const struct jargs *a, struct jv *out, int line);
int jx_tojson(struct jrun *r, struct jbuf *b, struct jv v, int indent, int depth, int line);

/* Python's numeric view of a value: booleans count as 0 and 1. */
static inline int is_num(struct jv v)
{
	return v.type == JV_BOOL || v.type == JV_INT || v.type == JV_FLOAT;
}

static inline double num(struct jv v)
{
	return v.type == JV_FLOAT ? v.f : v.type == JV_INT ? (double)v.i : v.b;
}

static inline int64_t inum(struct jv v)
{
	return v.type == JV_INT ? v.i : v.b;
}

#endif
