/* jinja_int.h — the parsed template (statements, expressions), the arena and the parser state; shared by the jinja*.c files only. */
#ifndef KVD_JINJA_INT_H
#define KVD_JINJA_INT_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/tokenizer/jinja.h"

#define JINJA_MAX_DEPTH		64	/* nesting of expressions and blocks */
#define JINJA_MAX_CALLS		16	/* macro calls in progress */
#define JINJA_MAX_ITERS		200000	/* loop iterations in one render */
#define JINJA_MAX_WORK		100000000 /* expression nodes, items and bytes walked in one render */
#define JINJA_MAX_ARENA		(64u << 20)	/* bytes one render or parse may hold */
#define JINJA_MAX_ARGS		16

/* Bump allocator; everything it gives is freed at once. */
struct jarena {
	struct jblock *head;
	size_t total;
};

void *ja_alloc(struct jarena *a, size_t n);	/* zeroed; NULL past JINJA_MAX_ARENA or on ENOMEM */
void ja_free(struct jarena *a);

/* A byte range of a string that is a message's own text. */
struct jtaint {
	size_t off, len;
};

struct jstr {
	const char *p;
	size_t n;
	const struct jtaint *t;	/* (nt,) sorted, disjoint */
	uint32_t nt;
};

enum jv_type {
	JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT,
	JV_NS,		/* namespace(): a dict whose attributes set can change */
	JV_FUNC,	/* a global function: enum jfunc */
	JV_MACRO,
};

struct jlist;
struct jdict;
struct jmacro;

struct jv {
	uint8_t type;
	union {
		int b;
		int64_t i;
		double f;
		struct jstr s;
		struct jlist *l;
		struct jdict *d;
		int fn;
		const struct jmacro *m;
	};
};

struct jlist {
	size_t n;
	struct jv *v;
	int tuple;	/* written (a, b) */
};

struct jdict {
	size_t n, cap;
	struct jstr *k;
	struct jv *v;
};

enum jfunc { JF_RANGE, JF_NAMESPACE, JF_RAISE, JF_STRFTIME, JF_DICT, JF_LAST };

/* Expressions. */
enum je_kind {
	JE_LIT, JE_NAME, JE_ATTR, JE_ITEM, JE_SLICE, JE_CALL, JE_FILTER, JE_TEST,
	JE_BIN, JE_NEG, JE_NOT, JE_AND, JE_OR, JE_COND, JE_LIST, JE_DICT,
};

enum jop {
	JO_ADD, JO_SUB, JO_MUL, JO_DIV, JO_FLOORDIV, JO_MOD, JO_POW, JO_CONCAT,
	JO_EQ, JO_NE, JO_LT, JO_LE, JO_GT, JO_GE, JO_IN, JO_NOTIN,
};

struct jexpr {
	uint8_t kind;
	uint8_t op;		/* JE_BIN: enum jop; JE_TEST: negated; JE_LIST: a tuple */
	uint8_t id;		/* JE_FILTER, JE_TEST: its number in jinja_eval.c's table */
	int line;
	struct jv lit;		/* JE_LIT */
	struct jstr name;	/* JE_NAME, JE_ATTR, JE_CALL of a method, JE_FILTER, JE_TEST */
	struct jexpr *a, *b, *c; /* operands; JE_SLICE: a[b:c:d] with d in args[0] */
	struct jexpr **args;	/* (n_args,) JE_CALL/FILTER/TEST arguments, JE_LIST items, JE_DICT k,v,k,v */
	struct jstr *kw;	/* (n_args,) keyword of each argument, n == 0 for a positional one */
	uint32_t n_args;
};

/* Statements. */
enum js_kind {
	JS_TEXT, JS_OUT, JS_IF, JS_FOR, JS_SET, JS_SET_BLOCK, JS_MACRO, JS_BREAK, JS_CONTINUE,
	JS_BLOCK,	/* a body run in place ({% generation %}) */
};

struct jstmt {
	uint8_t kind;
	int line;
	struct jstmt *next;
	struct jstr text;		/* JS_TEXT */
	struct jexpr *e;		/* JS_OUT, JS_IF cond, JS_FOR iterable, JS_SET value */
	struct jexpr *cond;		/* JS_FOR: the `if` filter */
	struct jstr target[2];		/* JS_FOR loop variables (n_target), JS_SET name, JS_MACRO name */
	uint32_t n_target;
	struct jstr attr;		/* JS_SET ns.attr: attr.n != 0 */
	struct jstmt *body, *orelse;	/* JS_IF then/else, JS_FOR body/else, JS_MACRO body */
	struct jstr *params;		/* JS_MACRO (n_params,) */
	struct jexpr **defaults;	/* JS_MACRO (n_params,) NULL without a default */
	uint32_t n_params;
};

struct jmacro {
	const struct jstmt *def;
	struct jframe *scope;
};

struct jinja_tmpl {
	struct jarena arena;
	struct jstmt *body;
	char *src;			/* normalised text, which tokens point into */
};

int jstr_eq(struct jstr a, const char *s);

/* ---- shared by jinja.c (the parser) and jinja_lex.c only ---- */

enum jt { T_TEXT, T_VAR_BEGIN, T_BLOCK_BEGIN, T_VAR_END, T_BLOCK_END, T_NAME, T_STR, T_INT,
	  T_FLOAT, T_OP, T_EOF };

struct jtok {
	uint8_t type;
	const char *p;		/* T_STR: the text between the quotes, escapes not undone */
	size_t n;
	int line;
};

/* The parser's state; jinja_lex.c fills its tokens. */
struct jparse {
	struct jinja_tmpl *t;
	struct jtok *tok;
	size_t n_tok, cap_tok, pos;
	int depth;
	int expr_nest;		/* parse_expr() calls in progress */
	char *err;
	size_t errlen;
	int rc;
	/* names called as functions, checked once every macro is known */
	struct jtok *calls;
	size_t n_calls, cap_calls;
	struct jstr *macros;
	size_t n_macros, cap_macros;
};

int jp_err(struct jparse *p, int rc, int line, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
int jp_grow(void **v, size_t *cap, size_t n, size_t size);
/* Tokens of the normalised source s into p->tok, ending with T_EOF; 0 or p->rc. */
int jp_lex(struct jparse *p, const char *s, size_t n);

/* jinja.c: the token at hand and its tests; expressions (NULL on error, p->rc says why). */
struct jtok *jp_cur(struct jparse *p);
int jp_is_op(const struct jtok *t, const char *op);
int jp_is_name(const struct jtok *t, const char *name);
int jp_expect_op(struct jparse *p, const char *op);
struct jstr jp_tok_str(const struct jtok *t);
void *jp_alloc(struct jparse *p, size_t n);
struct jexpr *jp_expr(struct jparse *p);		/* a whole expression, a if c else b */
struct jexpr *jp_or(struct jparse *p);		/* one without the conditional (for's iterable) */
int jp_too_deep(const struct jexpr *e, int d);	/* its tree deeper than the bound */


/* jinja_eval.c's tables: a name's number, or -1 when kvd does not implement it. */
int jx_filter_id(struct jstr name);
int jx_test_id(struct jstr name);
int jx_func_id(struct jstr name);
int jx_method_known(struct jstr name);

#endif
