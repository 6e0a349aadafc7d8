/* SPDX-License-Identifier: Apache-2.0 */
#include "limits.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int tessera_fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return -1;
}

/* A decimal with no sign, no leading zero and at most 10 digits, at most max. */
static int number(const char *s, size_t n, uint64_t max, uint64_t *out)
{
	uint64_t v = 0;
	if (n == 0 || n > 10 || (n > 1 && s[0] == '0'))
		return -1;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -1;
		v = v * 10 + (uint64_t)(s[i] - '0');
	}
	if (v > max)
		return -1;
	*out = v;
	return 0;
}

static int uuid_ok(const char *s, size_t n)
{
	if (n == 0 || n > TESSERA_MAX_UUID)
		return 0;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-'))
			return 0;
	}
	return 1;
}

struct field {
	const char *p;
	size_t n;
};

/* Splits a line on single spaces; empty fields (double, leading or trailing spaces)
 * are an error, as in the Go reader. Returns the field count or -1. */
static int split(const char *line, size_t n, struct field *f, int max)
{
	int k = 0;
	size_t start = 0;
	for (size_t i = 0; i <= n; i++) {
		if (i == n || line[i] == ' ') {
			if (i == start)
				return -1;
			if (k == max)
				return max + 1; /* too many: the caller reports a malformed record */
			f[k].p = line + start;
			f[k].n = i - start;
			k++;
			start = i + 1;
		}
	}
	return k;
}

static int is(const struct field *f, const char *word)
{
	return f->n == strlen(word) && memcmp(f->p, word, f->n) == 0;
}

int tessera_limits_parse(const char *buf, size_t len, struct tessera_limits *out, char *err, size_t errlen)
{
	enum { WANT_VERSION, WANT_CGROUP, WANT_CONTEXT, WANT_GPU, DONE } state = WANT_VERSION;
	memset(out, 0, sizeof(*out));
	if (len == 0)
		return tessera_fail(err, errlen, "limits: empty file");
	if (len > TESSERA_MAX_LIMITS_BYTES)
		return tessera_fail(err, errlen, "limits: file is %zu bytes, more than %d", len, TESSERA_MAX_LIMITS_BYTES);
	if (buf[len - 1] != '\n')
		return tessera_fail(err, errlen, "limits: last line does not end in a newline");
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)buf[i];
		if (c != '\n' && (c < 0x20 || c > 0x7e))
			return tessera_fail(err, errlen, "limits: byte %zu (0x%02x) is not printable ASCII", i, c);
	}
	int ln = 0;
	for (size_t pos = 0; pos < len;) {
		const char *line = buf + pos;
		const char *nl = memchr(line, '\n', len - pos);
		size_t n = (size_t)(nl - line);
		pos += n + 1;
		ln++;
		if (n == 0 || line[0] == '#')
			continue;
		struct field f[6];
		int nf = split(line, n, f, 5);
		if (nf < 0)
			return tessera_fail(err, errlen, "limits: line %d: fields must be separated by exactly one space", ln);
		uint64_t v;
		switch (state) {
		case WANT_VERSION:
			if (nf != 2 || !is(&f[0], "version"))
				return tessera_fail(err, errlen, "limits: line %d: want \"version %d\" first", ln, TESSERA_LIMITS_VERSION);
			if (number(f[1].p, f[1].n, 1 << 20, &v) < 0)
				return tessera_fail(err, errlen, "limits: line %d: version is not a number", ln);
			if (v != TESSERA_LIMITS_VERSION)
				return tessera_fail(err, errlen, "limits: line %d: version %llu is not supported (want %d)", ln,
					    (unsigned long long)v, TESSERA_LIMITS_VERSION);
			state = WANT_CGROUP;
			break;
		case WANT_CGROUP:
			if (nf != 2 || !is(&f[0], "cgroup"))
				return tessera_fail(err, errlen, "limits: line %d: want \"cgroup <path>\"", ln);
			if (f[1].p[0] != '/')
				return tessera_fail(err, errlen, "limits: line %d: cgroup must be an absolute path", ln);
			if (f[1].n > TESSERA_MAX_CGROUP)
				return tessera_fail(err, errlen, "limits: line %d: cgroup path is %zu bytes, more than %d", ln, f[1].n,
					    TESSERA_MAX_CGROUP);
			memcpy(out->cgroup, f[1].p, f[1].n);
			out->cgroup[f[1].n] = '\0';
			state = WANT_CONTEXT;
			break;
		case WANT_CONTEXT:
			if (nf != 2 || !is(&f[0], "context-mib"))
				return tessera_fail(err, errlen, "limits: line %d: want \"context-mib <n>\"", ln);
			if (number(f[1].p, f[1].n, TESSERA_MAX_CONTEXT_MIB, &out->context_mib) < 0)
				return tessera_fail(err, errlen, "limits: line %d: context-mib is not a number 0..%d", ln, TESSERA_MAX_CONTEXT_MIB);
			state = WANT_GPU;
			break;
		case DONE:
			return tessera_fail(err, errlen, "limits: line %d: nothing may follow the mps or work-conserving line", ln);
		case WANT_GPU: {
			if (is(&f[0], "work-conserving") && out->ngpus > 0) {
				if (nf != 1)
					return tessera_fail(err, errlen, "limits: line %d: want \"work-conserving\" alone", ln);
				out->work_conserving = 1;
				state = DONE;
				break;
			}
			if (is(&f[0], "mps") && out->ngpus > 0) {
				if (nf != 3)
					return tessera_fail(err, errlen, "limits: line %d: want \"mps <percent> <pipe-directory>\"", ln);
				if (number(f[1].p, f[1].n, 100, &v) < 0 || v == 0)
					return tessera_fail(err, errlen, "limits: line %d: mps percent is not a number 1..100", ln);
				if (f[2].p[0] != '/' || f[2].n > TESSERA_MAX_MPS_PIPE)
					return tessera_fail(err, errlen, "limits: line %d: mps pipe directory must be an absolute path of at most %d bytes",
							    ln, TESSERA_MAX_MPS_PIPE);
				for (int i = 0; i < out->ngpus; i++)
					if (out->gpus[i].cores != 0)
						return tessera_fail(err, errlen, "limits: line %d: mps line with cores on gpu %d (MPS divides the SMs)", ln, i);
				out->mps_percent = (int)v;
				memcpy(out->mps_pipe, f[2].p, f[2].n);
				out->mps_pipe[f[2].n] = '\0';
				state = DONE;
				break;
			}
			if (is(&f[0], "region") && out->ngpus == 0) {
				if (nf != 2)
					return tessera_fail(err, errlen, "limits: line %d: want \"region <directory>\"", ln);
				if (out->region_dir[0] != '\0')
					return tessera_fail(err, errlen, "limits: line %d: a second region line", ln);
				if (out->charge_kernel)
					return tessera_fail(err, errlen, "limits: line %d: the region line must come before the charge line", ln);
				if (f[1].p[0] != '/' || f[1].n > TESSERA_MAX_REGION_DIR)
					return tessera_fail(err, errlen,
							    "limits: line %d: region directory must be an absolute path of at most %d bytes", ln,
							    TESSERA_MAX_REGION_DIR);
				memcpy(out->region_dir, f[1].p, f[1].n);
				out->region_dir[f[1].n] = '\0';
				break;
			}
			if (is(&f[0], "charge") && out->ngpus == 0) {
				if (nf != 2 || !is(&f[1], "kernel"))
					return tessera_fail(err, errlen, "limits: line %d: want \"charge kernel\"", ln);
				if (out->charge_kernel)
					return tessera_fail(err, errlen, "limits: line %d: a second charge line", ln);
				out->charge_kernel = 1;
				break;
			}
			if (nf != 5 || !is(&f[0], "gpu"))
				return tessera_fail(err, errlen,
						    "limits: line %d: want \"gpu <uuid> <memory-mib> <cores> <phase>\" or, last, \"mps <percent> <pipe-directory>\" "
						    "or \"work-conserving\"",
						    ln);
			if (out->ngpus == TESSERA_MAX_GPUS)
				return tessera_fail(err, errlen, "limits: line %d: more than %d gpus", ln, TESSERA_MAX_GPUS);
			struct tessera_gpu_limit *g = &out->gpus[out->ngpus];
			uint64_t cores, phase;
			if (!uuid_ok(f[1].p, f[1].n))
				return tessera_fail(err, errlen, "limits: line %d: uuid must be 1..%d of [A-Za-z0-9-]", ln, TESSERA_MAX_UUID);
			if (number(f[2].p, f[2].n, TESSERA_MAX_MEMORY_MIB, &g->memory_mib) < 0 || g->memory_mib == 0)
				return tessera_fail(err, errlen, "limits: line %d: memory-mib is not a number 1..%llu", ln,
					    (unsigned long long)TESSERA_MAX_MEMORY_MIB);
			if (number(f[3].p, f[3].n, 100, &cores) < 0)
				return tessera_fail(err, errlen, "limits: line %d: cores is not a number 0..100", ln);
			if (number(f[4].p, f[4].n, 99, &phase) < 0)
				return tessera_fail(err, errlen, "limits: line %d: phase is not a number 0..99", ln);
			if (cores == 0 && phase != 0)
				return tessera_fail(err, errlen, "limits: line %d: phase set without cores", ln);
			if (cores + phase > 100)
				return tessera_fail(err, errlen, "limits: line %d: cores + phase exceed the period (100)", ln);
			memcpy(g->uuid, f[1].p, f[1].n);
			g->uuid[f[1].n] = '\0';
			for (int i = 0; i < out->ngpus; i++)
				if (strcmp(out->gpus[i].uuid, g->uuid) == 0)
					return tessera_fail(err, errlen, "limits: line %d: uuid %s appears twice", ln, g->uuid);
			g->cores = (int)cores;
			g->phase = (int)phase;
			out->ngpus++;
			break;
		}
		}
	}
	if (state < WANT_GPU || out->ngpus == 0)
		return tessera_fail(err, errlen, "limits: incomplete: want version, cgroup, context-mib and at least one gpu line");
	return 0;
}

int tessera_limits_load(const char *path, struct tessera_limits *out, char *err, size_t errlen)
{
	/* One byte more than allowed, so that an oversized file is reported as such. */
	const size_t cap = TESSERA_MAX_LIMITS_BYTES + 1;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return tessera_fail(err, errlen, "cannot open %s: %s", path, strerror(errno));
	char *buf = malloc(cap);
	if (buf == NULL) {
		close(fd);
		return tessera_fail(err, errlen, "cannot read %s: out of memory", path);
	}
	size_t n = 0;
	while (n < cap) {
		ssize_t r = read(fd, buf + n, cap - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			int e = errno;
			close(fd);
			free(buf);
			return tessera_fail(err, errlen, "cannot read %s: %s", path, strerror(e));
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	close(fd);
	int rc = tessera_limits_parse(buf, n, out, err, errlen);
	free(buf);
	if (rc < 0) {
		/* Prefix the path so the message says which file is wrong. */
		char tmp[256];
		snprintf(tmp, sizeof(tmp), "%s", err);
		snprintf(err, errlen, "%s: %s", path, tmp);
	}
	return rc;
}

int tessera_limits_format(const struct tessera_limits *l, char *buf, size_t len)
{
	size_t off = 0;
	int r = snprintf(buf, len,
			 "# Tessera container limits: written by the node agent, read by the CUDA hook.\n"
			 "version %d\ncgroup %s\ncontext-mib %llu\n",
			 TESSERA_LIMITS_VERSION, l->cgroup, (unsigned long long)l->context_mib);
	if (r < 0 || (size_t)r >= len)
		return -1;
	off = (size_t)r;
	if (l->region_dir[0] != '\0') {
		r = snprintf(buf + off, len - off, "region %s\n", l->region_dir);
		if (r < 0 || (size_t)r >= len - off)
			return -1;
		off += (size_t)r;
	}
	if (l->charge_kernel) {
		r = snprintf(buf + off, len - off, "charge kernel\n");
		if (r < 0 || (size_t)r >= len - off)
			return -1;
		off += (size_t)r;
	}
	for (int i = 0; i < l->ngpus; i++) {
		const struct tessera_gpu_limit *g = &l->gpus[i];
		r = snprintf(buf + off, len - off, "gpu %s %llu %d %d\n", g->uuid, (unsigned long long)g->memory_mib,
			     g->cores, g->phase);
		if (r < 0 || (size_t)r >= len - off)
			return -1;
		off += (size_t)r;
	}
	if (l->mps_percent > 0) {
		r = snprintf(buf + off, len - off, "mps %d %s\n", l->mps_percent, l->mps_pipe);
		if (r < 0 || (size_t)r >= len - off)
			return -1;
		off += (size_t)r;
	}
	if (l->work_conserving) {
		r = snprintf(buf + off, len - off, "work-conserving\n");
		if (r < 0 || (size_t)r >= len - off)
			return -1;
		off += (size_t)r;
	}
	return (int)off;
}
