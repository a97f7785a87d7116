/* unicode.c — code point class lookup and UTF-8 decoding. */
#include "daemon/tokenizer/unicode.h"

uint32_t unicode_flags(uint32_t cp)
{
	if (cp < 256)
		return unicode_latin1[cp];
	uint32_t lo = 0, hi = unicode_n_ranges;
	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		if (cp < unicode_ranges[mid].lo)
			hi = mid;
		else if (cp > unicode_ranges[mid].hi)
			lo = mid + 1;
		else
			return unicode_ranges[mid].flags;
	}
	return 0;
}

uint32_t unicode_utf8_next(const uint8_t *s, size_t len, size_t *adv)
{
	uint8_t b = s[0];
	size_t n = unicode_utf8_len(b);
	uint32_t cp;

	if (n == 1) {
		*adv = 1;
		return b;
	}
	if (n == 0 || n > len)
		goto bad;
	cp = b & (0x7F >> n);
	for (size_t i = 1; i < n; i++) {
		if ((s[i] & 0xC0) != 0x80)
			goto bad;
		cp = (cp << 6) | (s[i] & 0x3F);
	}
	*adv = n;
	return cp;
bad:
	*adv = 1;
	return 0xFFFD;
}

size_t unicode_utf8_put(uint32_t cp, uint8_t *out)
{
	if (cp < 0x80) {
		out[0] = (uint8_t)cp;
		return 1;
	}
	if (cp < 0x800) {
		out[0] = (uint8_t)(0xC0 | (cp >> 6));
		out[1] = (uint8_t)(0x80 | (cp & 0x3F));
		return 2;
	}
	if (cp < 0x10000) {
		out[0] = (uint8_t)(0xE0 | (cp >> 12));
		out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
		out[2] = (uint8_t)(0x80 | (cp & 0x3F));
		return 3;
	}
	out[0] = (uint8_t)(0xF0 | (cp >> 18));
	out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
	out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
	out[3] = (uint8_t)(0x80 | (cp & 0x3F));
	return 4;
}
