/*
 * replay.c — main() for the plain build of a fuzz target: feeds every file
 * named on the command line (a directory: each regular file in it) to
 * LLVMFuzzerTestOneInput once, so CI runs the committed corpora without
 * clang's fuzzing runtime. Exit status 0 when every input ran; a crash is
 * the target's own abort, caught by the caller.
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
		return -1;
	}
	uint8_t *buf = NULL;
	size_t len = 0, cap = 0;
	for (;;) {
		if (len == cap) {
			cap = cap ? 2 * cap : 4096;
			uint8_t *nb = realloc(buf, cap);
			if (!nb) {
				free(buf);
				fclose(f);
				return -1;
			}
			buf = nb;
		}
		size_t got = fread(buf + len, 1, cap - len, f);
		if (!got)
			break;
		len += got;
	}
	int bad = ferror(f);
	fclose(f);
	if (bad) {
		fprintf(stderr, "replay: %s: read error\n", path);
		free(buf);
		return -1;
	}
	/* An exact-size copy, so ASan sees a read one past the input. */
	uint8_t *in = malloc(len ? len : 1);
	if (!in) {
		free(buf);
		return -1;
	}
	memcpy(in, buf, len);
	free(buf);
	LLVMFuzzerTestOneInput(in, len);
	free(in);
	return 0;
}

static int by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every regular file of dir, in name order so runs are reproducible. */
static int run_dir(const char *dir, unsigned *n)
{
	DIR *d = opendir(dir);
	if (!d) {
		fprintf(stderr, "replay: %s: %s\n", dir, strerror(errno));
		return -1;
	}
	char **names = NULL;
	size_t cnt = 0, cap = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		if (cnt == cap) {
			cap = cap ? 2 * cap : 64;
			char **nn = realloc(names, cap * sizeof(*names));
			if (!nn)
				break;
			names = nn;
		}
		if (!(names[cnt] = malloc(strlen(dir) + strlen(e->d_name) + 2)))
			break;
		sprintf(names[cnt++], "%s/%s", dir, e->d_name);
	}
	closedir(d);
	qsort(names, cnt, sizeof(*names), by_name);
	int rc = 0;
	for (size_t i = 0; i < cnt; i++) {
		struct stat st;
		if (!rc && !stat(names[i], &st) && S_ISREG(st.st_mode)) {
			rc = run_file(names[i]);
			(*n)++;
		}
		free(names[i]);
	}
	free(names);
	return rc;
}

int main(int argc, char **argv)
{
	unsigned n = 0;
	if (argc < 2) {
		fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
		return 2;
	}
	for (int i = 1; i < argc; i++) {
		struct stat st;
		if (stat(argv[i], &st)) {
			fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
			return 1;
		}
		if (S_ISDIR(st.st_mode) ? run_dir(argv[i], &n) : (n++, run_file(argv[i])))
			return 1;
	}
	printf("%s: %u inputs replayed\n", argv[0], n);
	return 0;
}
