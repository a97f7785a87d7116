/* jinja_lex.c — Jinja template text to tokens, with the whitespace control Hugging Face sets: trim_blocks, lstrip_blocks, {%- -%}. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/tokenizer/jinja_int.h"

int jp_err(struct jparse *p, int rc, int line, const char *fmt, ...)
{
	if (!p->rc) {
		int k = snprintf(p->err, p->errlen, "chat template line %d: ", line);
		va_list ap;

		va_start(ap, fmt);
		if (k >= 0 && (size_t)k < p->errlen)
			vsnprintf(p->err + k, p->errlen - (size_t)k, fmt, ap);
		va_end(ap);
		p->rc = rc;
	}
	return p->rc;
}

int jp_grow(void **v, size_t *cap, size_t n, size_t size)
{
	if (n < *cap)
		return 0;
	size_t nc = *cap ? *cap * 2 : 64;
	void *q = realloc(*v, nc * size);

	if (!q)
		return -ENOMEM;
	*v = q;
	*cap = nc;
	return 0;
}

static int push_tok(struct jparse *p, int type, const char *s, size_t n, int line)
{
	if (jp_grow((void **)&p->tok, &p->cap_tok, p->n_tok, sizeof(*p->tok)))
		return jp_err(p, -ENOMEM, line, "out of memory");
	p->tok[p->n_tok++] = (struct jtok){ (uint8_t)type, s, n, line };
	return 0;
}

static int is_ws(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static int count_lines(const char *s, const char *e)
{
	int n = 0;

	for (; s < e; s++)
		n += *s == '\n';
	return n;
}

/*
 * The text before a tag, with the tag's whitespace control applied: `{%-`
 * strips all whitespace before it; lstrip_blocks strips the spaces before a
 * block or comment tag alone at the start of its line (not `{%+`).
 */
static void text_before(const char *s, size_t start, size_t *end, int tag, char sign)
{
	size_t e = *end;

	if (sign == '-') {
		while (e > start && is_ws(s[e - 1]))
			e--;
	} else if (sign != '+' && tag != '{') {
		size_t l = e;

		while (l > start && s[l - 1] != '\n')
			l--;
		if (l > start || start == 0 || s[start - 1] == '\n') {
			size_t k = l;

			while (k < e && is_ws(s[k]))
				k++;
			if (k == e)
				e = l;
		}
	}
	*end = e;
}

static const char *const ops2[] = { "//", "**", "==", "!=", ">=", "<=" };

/* One token inside a tag at s[*i]; 0, 1 at the tag's end, or an error. */
static int lex_one(struct jparse *p, const char *s, size_t n, size_t *i, int *line, int block,
		   int *bal)
{
	size_t k = *i;
	char c = s[k];

	if (!*bal) {
		const char *end = block ? "%}" : "}}";
		size_t skip = 0;

		if ((c == '-' || (block && c == '+')) && k + 2 < n + 0 && !memcmp(s + k + 1, end, 2))
			skip = 3;
		else if (k + 1 < n && !memcmp(s + k, end, 2))
			skip = 2;
		if (skip) {
			size_t j = k + skip;

			if (c == '-')
				while (j < n && is_ws(s[j]))
					*line += s[j++] == '\n';
			else if (block && c != '+' && j < n && s[j] == '\n')
				j++, (*line)++;
			if (push_tok(p, block ? T_BLOCK_END : T_VAR_END, s + k, j - k, *line))
				return p->rc;
			*i = j;
			return 1;
		}
	}
	if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
		while (k < n && ((s[k] >= 'a' && s[k] <= 'z') || (s[k] >= 'A' && s[k] <= 'Z') ||
				 (s[k] >= '0' && s[k] <= '9') || s[k] == '_'))
			k++;
		return push_tok(p, T_NAME, s + *i, k - *i, *line) ? p->rc : (*i = k, 0);
	}
	if (c >= '0' && c <= '9') {
		int fl = 0;

		while (k < n && s[k] >= '0' && s[k] <= '9')
			k++;
		if (k + 1 < n && s[k] == '.' && s[k + 1] >= '0' && s[k + 1] <= '9') {
			fl = 1;
			for (k++; k < n && s[k] >= '0' && s[k] <= '9'; k++)
				;
		}
		if (k < n && (s[k] == 'e' || s[k] == 'E')) {
			size_t e = k + 1;

			if (e < n && (s[e] == '+' || s[e] == '-'))
				e++;
			if (e < n && s[e] >= '0' && s[e] <= '9') {
				for (fl = 1, k = e; k < n && s[k] >= '0' && s[k] <= '9'; k++)
					;
			}
		}
		return push_tok(p, fl ? T_FLOAT : T_INT, s + *i, k - *i, *line) ? p->rc : (*i = k, 0);
	}
	if (c == '\'' || c == '"') {
		int l0 = *line;

		for (k++; k < n && s[k] != c; k++) {
			if (s[k] == '\\' && k + 1 < n)
				k++;
			*line += s[k] == '\n';
		}
		if (k >= n)
			return jp_err(p, -EINVAL, l0, "unterminated string");
		if (push_tok(p, T_STR, s + *i + 1, k - *i - 1, l0))
			return p->rc;
		*i = k + 1;
		return 0;
	}
	for (size_t o = 0; o < sizeof(ops2) / sizeof(ops2[0]); o++)
		if (k + 1 < n && s[k] == ops2[o][0] && s[k + 1] == ops2[o][1])
			return push_tok(p, T_OP, s + k, 2, *line) ? p->rc : (*i = k + 2, 0);
	if (!strchr("+-/*%~[](){}|.,:=<>", c) || !c)
		return jp_err(p, -EINVAL, *line, "unexpected character '%c'", c);
	if (c == '(' || c == '[' || c == '{')
		++*bal;
	else if ((c == ')' || c == ']' || c == '}') && *bal)
		--*bal;
	return push_tok(p, T_OP, s + k, 1, *line) ? p->rc : (*i = k + 1, 0);
}

/* A {{ }} or {% %} tag from s[*i] (just after its opening and sign). */
static int lex_tag(struct jparse *p, const char *s, size_t n, size_t *i, int *line, int block)
{
	int bal = 0;

	for (;;) {
		while (*i < n && is_ws(s[*i]))
			*line += s[(*i)++] == '\n';
		if (*i >= n)
			return jp_err(p, -EINVAL, *line, "unterminated tag");
		int r = lex_one(p, s, n, i, line, block, &bal);

		if (r < 0)
			return r;
		if (r == 1)
			return 0;
	}
}

/* {# #}: where it ends, with trim_blocks' newline or `-#}`'s whitespace. */
static int lex_comment(struct jparse *p, const char *s, size_t n, size_t *i, int *line)
{
	const char *e = memmem(s + *i, n - *i, "#}", 2);

	if (!e)
		return jp_err(p, -EINVAL, *line, "unterminated comment");
	size_t j = (size_t)(e - s) + 2;
	char sign = e > s + *i ? e[-1] : 0;

	*line += count_lines(s + *i, e);
	if (sign == '-')
		while (j < n && is_ws(s[j]))
			*line += s[j++] == '\n';
	else if (sign != '+' && j < n && s[j] == '\n')
		j++, (*line)++;
	*i = j;
	return 0;
}

int jp_lex(struct jparse *p, const char *s, size_t n)
{
	size_t pos = 0;
	int line = 1;

	while (pos <= n) {
		size_t start = pos, at = pos;
		int tag = 0;

		while (at + 1 < n && !(s[at] == '{' && (s[at + 1] == '{' || s[at + 1] == '%' ||
						      s[at + 1] == '#')))
			at++;
		if (at + 1 < n)
			tag = s[at + 1];
		else
			at = n;
		size_t end = at;
		char sign = tag && at + 2 < n && (s[at + 2] == '-' || s[at + 2] == '+') ? s[at + 2] : 0;

		if (tag)
			text_before(s, start, &end, tag, sign);
		if (end > start && push_tok(p, T_TEXT, s + start, end - start, line))
			return p->rc;
		line += count_lines(s + pos, s + at);
		if (!tag)
			break;
		pos = at + 2 + (sign != 0);
		if (tag == '#') {
			if (lex_comment(p, s, n, &pos, &line))
				return p->rc;
			continue;
		}
		if (push_tok(p, tag == '{' ? T_VAR_BEGIN : T_BLOCK_BEGIN, s + at, 2, line) ||
		    lex_tag(p, s, n, &pos, &line, tag == '%'))
			return p->rc;
	}
	return push_tok(p, T_EOF, s + n, 0, line);
}

