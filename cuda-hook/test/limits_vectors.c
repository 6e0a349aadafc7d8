/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Runs the C limits reader over the vectors shared with the Go reader
 * (api/testdata/limits): each valid/<name>.limits must parse and print exactly
 * valid/<name>.canonical; each invalid/<name>.limits must be rejected.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "limits.h"

static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (f == NULL)
		return NULL;
	char *buf = malloc(1 << 20);
	*len = fread(buf, 1, (1 << 20) - 1, f);
	buf[*len] = '\0';
	fclose(f);
	return buf;
}

static int run(const char *dir, int valid)
{
	char path[4096];
	int n = 0, bad = 0;
	snprintf(path, sizeof(path), "%s/%s", dir, valid ? "valid" : "invalid");
	DIR *d = opendir(path);
	if (d == NULL) {
		fprintf(stderr, "FAIL cannot open %s\n", path);
		return -1;
	}
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		size_t l = strlen(e->d_name);
		if (l < 7 || strcmp(e->d_name + l - 7, ".limits") != 0)
			continue;
		n++;
		char file[4400], err[512];
		size_t len;
		snprintf(file, sizeof(file), "%s/%s", path, e->d_name);
		struct tessera_limits *lim = malloc(sizeof(*lim));
		char *in = slurp(file, &len);
		int rc = tessera_limits_parse(in, len, lim, err, sizeof(err));
		if (!valid) {
			if (rc == 0) {
				fprintf(stderr, "FAIL %s: accepted\n", file);
				bad++;
			}
		} else if (rc != 0) {
			fprintf(stderr, "FAIL %s: %s\n", file, err);
			bad++;
		} else {
			char canon[4400], *out = malloc(1 << 17);
			size_t clen;
			snprintf(canon, sizeof(canon), "%.*s.canonical", (int)(strlen(file) - 7), file);
			char *want = slurp(canon, &clen);
			int olen = tessera_limits_format(lim, out, 1 << 17);
			if (want == NULL || olen < 0 || (size_t)olen != clen || memcmp(out, want, clen) != 0) {
				fprintf(stderr, "FAIL %s: canonical form differs from %s\n", file, canon);
				bad++;
			}
			free(want);
			free(out);
		}
		free(in);
		free(lim);
	}
	closedir(d);
	if (n == 0) {
		fprintf(stderr, "FAIL no vectors in %s\n", path);
		return -1;
	}
	printf("%s limits vectors: %d, %d failed\n", valid ? "valid" : "invalid", n, bad);
	return bad ? -1 : 0;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: limits_vectors <api/testdata/limits>\n");
		return 2;
	}
	int rc = run(argv[1], 1) | run(argv[1], 0);
	return rc ? 1 : 0;
}
