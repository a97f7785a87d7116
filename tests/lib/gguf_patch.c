/* gguf_patch.c — copy a GGUF file and overwrite one integer metadata value (gguf_patch.h). */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "tests/lib/gguf_patch.h"

/* GGUF value types (daemon/model/gguf.h numbers them the same way, from the spec). */
enum { VT_U8 = 0, VT_I8 = 1, VT_U16 = 2, VT_I16 = 3, VT_U32 = 4, VT_I32 = 5, VT_U64 = 10, VT_I64 = 11 };

static int copy_fd(int in, int out, off_t len)
{
	off_t done = 0;
	while (done < len) {
		ssize_t n = copy_file_range(in, NULL, out, NULL, (size_t)(len - done), 0);
		if (n < 0 && (errno == EXDEV || errno == ENOSYS || errno == EINVAL)) {
			char buf[1 << 16];
			n = pread(in, buf, sizeof(buf), done);
			if (n > 0 && pwrite(out, buf, (size_t)n, done) != n)
				return -EIO;
		}
		if (n < 0)
			return -errno;
		if (n == 0)
			return -EIO;
		done += n;
	}
	return 0;
}

/* Width of an integer type and the largest value it holds; 0 for any other type. */
static size_t int_width(uint32_t type, uint64_t *max)
{
	switch (type) {
	case VT_U8: *max = UINT8_MAX; return 1;
	case VT_I8: *max = INT8_MAX; return 1;
	case VT_U16: *max = UINT16_MAX; return 2;
	case VT_I16: *max = INT16_MAX; return 2;
	case VT_U32: *max = UINT32_MAX; return 4;
	case VT_I32: *max = INT32_MAX; return 4;
	case VT_U64: *max = UINT64_MAX; return 8;
	case VT_I64: *max = INT64_MAX; return 8;
	default: return 0;
	}
}

int gguf_patch_int(const char *src, const char *dst, const char *key, uint64_t value)
{
	int rc = 0;
	int in = open(src, O_RDONLY | O_CLOEXEC);
	if (in < 0)
		return -errno;
	struct stat st;
	if (fstat(in, &st)) {
		rc = -errno;
		close(in);
		return rc;
	}
	int out = open(dst, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (out < 0) {
		rc = -errno;
		close(in);
		return rc;
	}
	rc = copy_fd(in, out, st.st_size);
	close(in);
	uint8_t *p = MAP_FAILED;
	if (!rc) {
		p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, out, 0);
		if (p == MAP_FAILED)
			rc = -errno;
	}
	if (!rc) {
		/* The key as the file spells it: a u64 length (little-endian), then its bytes. */
		uint8_t pat[8 + 256];
		uint64_t klen = strlen(key);
		if (klen > 256) {
			rc = -EINVAL;
			goto out;
		}
		for (int i = 0; i < 8; i++)
			pat[i] = (uint8_t)(klen >> (8 * i));
		memcpy(pat + 8, key, klen);
		uint8_t *k = memmem(p, (size_t)st.st_size, pat, 8 + klen);
		if (!k || k + 8 + klen + 4 + 8 > p + st.st_size) {
			rc = -ENOENT;
			goto out;
		}
		uint8_t *v = k + 8 + klen;
		uint32_t type = (uint32_t)v[0] | (uint32_t)v[1] << 8 | (uint32_t)v[2] << 16 |
				(uint32_t)v[3] << 24;
		uint64_t max;
		size_t w = int_width(type, &max);
		if (!w || value > max) {
			rc = -EINVAL;
			goto out;
		}
		for (size_t i = 0; i < w; i++)
			v[4 + i] = (uint8_t)(value >> (8 * i));
		if (msync(p, (size_t)st.st_size, MS_SYNC))
			rc = -errno;
	}
out:
	if (p != MAP_FAILED)
		munmap(p, (size_t)st.st_size);
	close(out);
	if (rc)
		unlink(dst);
	return rc;
}
