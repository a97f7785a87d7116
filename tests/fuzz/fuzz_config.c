/* fuzz_config.c — kvd.conf text through the config parser, then --print-config over what it accepted. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include "daemon/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct kvd_options o;
	char err[512];
	config_defaults(&o);
	/* Parsed in place, not NUL-terminated: the parser must honour size. */
	int rc = config_parse_text(&o, "fuzz.conf", (const char *)data, size, err, sizeof(err));
	if (rc == 0) {
		/* Whatever was accepted must print (socket paths, sizes, enums). */
		char *out = NULL;
		size_t len = 0;
		FILE *f = open_memstream(&out, &len);
		if (f) {
			config_print(&o, f);
			fclose(f);
		}
		free(out);
	} else if (!err[0]) {
		abort();	/* every rejection says why */
	}
	config_free(&o);
	return 0;
}
