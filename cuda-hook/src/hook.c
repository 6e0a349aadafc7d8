/*
 * Set-up, symbol resolution and device virtualization.
 *
 * The hook is loaded into every process of a Tessera container (the node agent
 * preloads it). It exports the driver and NVML functions listed in symbols.def under
 * their own names, answers dlsym() and cuGetProcAddress() for those names with its
 * hooks, and calls the real functions through a table filled from libcuda.so.1.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "hook.h"
#include "bind.h"

struct tessera_state tessera = {
	.dev_mu = PTHREAD_MUTEX_INITIALIZER,
	.nvml_mu = PTHREAD_MUTEX_INITIALIZER,
};

/* ---- logging ---------------------------------------------------------------- */

static int log_level = TESSERA_LOG_WARN;

void tessera_log(int level, const char *fmt, ...)
{
	static const char *names[] = {"error", "warn", "info", "debug"};
	char msg[1024];
	va_list ap;
	if (level > log_level)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	/* One write per message so that lines from several threads do not interleave. */
	char line[1200];
	int n = snprintf(line, sizeof(line), "tessera-cuda-hook: level=%s pid=%d %s\n", names[level], (int)getpid(), msg);
	if (n > 0) {
		ssize_t w = write(STDERR_FILENO, line, (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1);
		(void)w;
	}
}

int64_t tessera_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---- the symbol table ------------------------------------------------------- */

enum lib { LIB_CUDA, LIB_NVML };

struct symbol {
	const char *name;
	void *hook;   /* NULL: used by the hook, not hooked */
	size_t real;  /* offset of the real pointer in struct tessera_real */
	enum lib lib;
};

static const struct symbol symbols[] = {
#define TESSERA_CU_HOOK(name, proto, params) {#name, (void *)name, offsetof(struct tessera_real, name), LIB_CUDA},
#define TESSERA_CU_LEGACY(name, params) {#name, (void *)name, offsetof(struct tessera_real, name), LIB_CUDA},
#define TESSERA_CU_REAL(name, params) {#name, NULL, offsetof(struct tessera_real, name), LIB_CUDA},
#define TESSERA_NVML_HOOK(name, params) {#name, (void *)name, offsetof(struct tessera_real, name), LIB_NVML},
#define TESSERA_NVML_LEGACY(name, params) {#name, (void *)name, offsetof(struct tessera_real, name), LIB_NVML},
#define TESSERA_NVML_REAL(name, params) {#name, NULL, offsetof(struct tessera_real, name), LIB_NVML},
#include "symbols.def"
};
#define NSYMBOLS (sizeof(symbols) / sizeof(symbols[0]))

static void **real_slot(const struct symbol *s)
{
	return (void **)((char *)&tessera.real + s->real);
}

/*
 * dlsym is called very early: the sanitizer runtimes resolve their interceptors with
 * dlsym(RTLD_NEXT, ...) before their own set-up, so this path must not be
 * instrumented, must not allocate and must not need the hook's state.
 */
#define EARLY __attribute__((no_sanitize_address))

EARLY static int same_name(const char *a, const char *b)
{
	while (*a && *a == *b)
		a++, b++;
	return *a == *b;
}

EARLY static const struct symbol *hook_by_name(const char *name)
{
	for (size_t i = 0; i < NSYMBOLS; i++)
		if (symbols[i].hook != NULL && same_name(symbols[i].name, name))
			return &symbols[i];
	return NULL;
}

/* ---- the real dlsym and dlvsym ------------------------------------------------ */

/*
 * The hook exports both lookups, so it cannot ask the dynamic linker for the real
 * ones: a lookup of "dlvsym" from here would find the hook's own first. libc's dlvsym
 * (libdl's before glibc 2.34) is found by reading the symbol tables of the objects
 * loaded after the hook, which is where the linker itself would look next; libc's
 * dlsym then comes from it.
 */
typedef void *(*dlsym_fn)(void *, const char *);
typedef void *(*dlvsym_fn)(void *, const char *, const char *);
static dlsym_fn real_dlsym_fn;
static dlvsym_fn real_dlvsym_fn;
static pthread_once_t dlsym_once = PTHREAD_ONCE_INIT;

EARLY static uintptr_t dyn_ptr(const struct link_map *l, const ElfW(Dyn) *d)
{
	/* glibc relocates these entries in place on most targets, not on all. */
	uintptr_t p = (uintptr_t)d->d_un.d_ptr;
	return p < (uintptr_t)l->l_addr ? p + (uintptr_t)l->l_addr : p;
}

/* The default-version definition of a function named name in object l, or NULL. */
EARLY static void *elf_lookup(const struct link_map *l, const char *name)
{
	const ElfW(Sym) *symtab = NULL;
	const char *strtab = NULL;
	const uint32_t *gnu = NULL, *sysv = NULL;
	const ElfW(Half) *versym = NULL;
	if (l->l_ld == NULL)
		return NULL;
	for (const ElfW(Dyn) *d = l->l_ld; d->d_tag != DT_NULL; d++) {
		switch (d->d_tag) {
		case DT_SYMTAB: symtab = (const ElfW(Sym) *)dyn_ptr(l, d); break;
		case DT_STRTAB: strtab = (const char *)dyn_ptr(l, d); break;
		case DT_GNU_HASH: gnu = (const uint32_t *)dyn_ptr(l, d); break;
		case DT_HASH: sysv = (const uint32_t *)dyn_ptr(l, d); break;
		case DT_VERSYM: versym = (const ElfW(Half) *)dyn_ptr(l, d); break;
		}
	}
	if (symtab == NULL || strtab == NULL)
		return NULL;
#define USABLE(i)                                                                                     \
	(symtab[i].st_shndx != SHN_UNDEF && ELF64_ST_TYPE(symtab[i].st_info) == STT_FUNC &&           \
	 (versym == NULL || (versym[i] & 0x8000) == 0) && same_name(strtab + symtab[i].st_name, name))
	if (gnu != NULL) {
		uint32_t h = 5381;
		for (const unsigned char *c = (const unsigned char *)name; *c; c++)
			h = h * 33 + *c;
		uint32_t nbuckets = gnu[0], symoffset = gnu[1], bloom_size = gnu[2];
		const uint32_t *buckets = (const uint32_t *)((const ElfW(Addr) *)&gnu[4] + bloom_size);
		const uint32_t *chain = buckets + nbuckets;
		uint32_t i = nbuckets ? buckets[h % nbuckets] : 0;
		if (i < symoffset)
			return NULL;
		for (;; i++) {
			uint32_t c = chain[i - symoffset];
			if ((c | 1) == (h | 1) && USABLE(i))
				return (void *)(l->l_addr + symtab[i].st_value);
			if (c & 1)
				return NULL;
		}
	}
	if (sysv != NULL) {
		uint32_t h = 0, g;
		for (const unsigned char *c = (const unsigned char *)name; *c; c++) {
			h = (h << 4) + *c;
			g = h & 0xf0000000;
			if (g)
				h ^= g >> 24;
			h &= ~g;
		}
		uint32_t nbucket = sysv[0];
		const uint32_t *bucket = &sysv[2], *chain = &sysv[2 + nbucket];
		for (uint32_t i = nbucket ? bucket[h % nbucket] : 0; i != 0; i = chain[i])
			if (USABLE(i))
				return (void *)(l->l_addr + symtab[i].st_value);
	}
#undef USABLE
	return NULL;
}

EARLY static void find_real_dlsym(void)
{
	Dl_info info;
	struct link_map *self = NULL;
	if (dladdr1((void *)find_real_dlsym, &info, (void **)&self, RTLD_DL_LINKMAP) == 0 || self == NULL)
		return;
	for (struct link_map *l = self->l_next; l != NULL && real_dlvsym_fn == NULL; l = l->l_next)
		real_dlvsym_fn = (dlvsym_fn)elf_lookup(l, "dlvsym");
	if (real_dlvsym_fn == NULL)
		return;
	static const char *versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0"};
	for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]) && real_dlsym_fn == NULL; i++)
		real_dlsym_fn = (dlsym_fn)real_dlvsym_fn(RTLD_NEXT, "dlsym", versions[i]);
}

EARLY static void *real_dlsym(void *handle, const char *name)
{
	pthread_once(&dlsym_once, find_real_dlsym);
	return real_dlsym_fn ? real_dlsym_fn(handle, name) : NULL;
}

EARLY static void *real_dlvsym(void *handle, const char *name, const char *version)
{
	pthread_once(&dlsym_once, find_real_dlsym);
	return real_dlvsym_fn ? real_dlvsym_fn(handle, name, version) : NULL;
}

/* One lookup, with a version (dlvsym) or without (dlsym). */
EARLY static void *lookup(void *handle, const char *name, const char *version)
{
	return version != NULL ? real_dlvsym(handle, name, version) : real_dlsym(handle, name);
}

/*
 * RTLD_NEXT means "after the caller", and the caller of libc's dlsym is now the hook.
 * A caller loaded before the hook (the program, or a sanitizer runtime preloaded
 * first) gets libc's answer relative to the hook, which differs only by the objects
 * between the two, in practice none. A caller loaded after the hook (an interposer
 * wrapping a function it also defines) must not be handed its own definition back,
 * so for it the objects after it are searched one by one.
 */
EARLY static void *lookup_next(const void *caller, const char *name, const char *version)
{
	Dl_info info;
	struct link_map *lm = NULL, *self = NULL, *l;
	if (dladdr1(caller, &info, (void **)&lm, RTLD_DL_LINKMAP) == 0 || lm == NULL ||
	    dladdr1((void *)lookup_next, &info, (void **)&self, RTLD_DL_LINKMAP) == 0 || self == NULL)
		return lookup(RTLD_NEXT, name, version);
	for (l = self->l_next; l != NULL && l != lm; l = l->l_next)
		;
	if (l == NULL)
		return lookup(RTLD_NEXT, name, version); /* the caller comes before the hook */
	for (l = lm->l_next; l != NULL; l = l->l_next) {
		void *h = dlopen(l->l_name, RTLD_LAZY | RTLD_NOLOAD);
		if (h == NULL)
			continue;
		void *p = lookup(h, name, version);
		dlclose(h);
		struct link_map *owner = NULL;
		if (p != NULL && dladdr1(p, &info, (void **)&owner, RTLD_DL_LINKMAP) != 0 && owner == l)
			return p;
	}
	return NULL;
}

/* A program or runtime that looks up a hooked function in the driver (the CUDA runtime
 * does dlopen("libcuda.so.1") then dlsym) gets the hook, whichever lookup it uses. */
EARLY static void *hooked_answer(const char *name, void *p)
{
	if (p != NULL && ((name[0] == 'c' && name[1] == 'u') || (name[0] == 'n' && name[1] == 'v' && name[2] == 'm'))) {
		const struct symbol *s = hook_by_name(name);
		if (s != NULL)
			return s->hook;
	}
	return p;
}

TESSERA_EXPORT EARLY void *dlsym(void *handle, const char *name)
{
	void *p = handle == RTLD_NEXT ? lookup_next(__builtin_return_address(0), name, NULL) : real_dlsym(handle, name);
	return hooked_answer(name, p);
}

TESSERA_EXPORT EARLY void *dlvsym(void *handle, const char *name, const char *version)
{
	void *p = handle == RTLD_NEXT ? lookup_next(__builtin_return_address(0), name, version)
				      : real_dlvsym(handle, name, version);
	return hooked_answer(name, p);
}

/* ---- where the limits come from --------------------------------------------- */

/*
 * The rules, in order (docs/cuda-hook.md, "Where the limits come from"):
 *
 *   1. the limits file in the read-only limits directory, if it exists;
 *   2. else the node agent's socket beside it, if it exists;
 *   3. else, inside a Tessera container, nothing: CUDA is refused;
 *   4. else (standalone use) TESSERA_LIMITS_FILE, only where the administrator's
 *      config allows it;
 *   5. else nothing: CUDA is refused.
 *
 * A Tessera container is one where the limits directory exists (the node agent mounts
 * it read-only in every container it gives GPUs, with or without NRI) or where the
 * device plugin's marker variable is set. Neither can be removed by the tenant in a
 * way that helps it: the mount cannot be undone without CAP_SYS_ADMIN, and unsetting
 * the marker leaves the mount. Rule 3 is what holds while the node agent restarts on a
 * node without NRI: its socket is gone, and a process started then must not fall
 * through to limits the tenant chose, whatever config file its image ships.
 */

/* deviceplugin.EnvRequested: set by the device plugin's Allocate in every container
 * that asked for Tessera GPUs. */
#define TESSERA_ENV_REQUESTED "TESSERA_GPU_REQUESTED"

/* Whether a path exists; anything but "no such file" counts as existing, so that an
 * unreadable limits directory never makes the hook take a more permissive rule. */
static int present(const char *path)
{
	return access(path, F_OK) == 0 || errno != ENOENT;
}

/* Why this process is inside a Tessera container, or NULL if it is not. */
static const char *tessera_container_reason(void)
{
	if (present(TESSERA_LIMITS_DIR))
		return "the limits directory " TESSERA_LIMITS_DIR " exists";
	if (getenv(TESSERA_ENV_REQUESTED) != NULL)
		return "the device plugin's " TESSERA_ENV_REQUESTED " is set";
	return NULL;
}

/*
 * Standalone use (no node agent) is allowed only where the administrator's config
 * file, owned by root and writable by no one else, says "allow-env-limits yes". It is
 * consulted only outside Tessera containers (rule 4): a tenant image can ship such a
 * file, owned by root, in its own filesystem.
 */
static int env_limits_allowed(char *why, size_t len)
{
	struct stat st;
	int fd = open(TESSERA_CONFIG_PATH, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0) {
		(void)tessera_fail(why, len, "%s: %s", TESSERA_CONFIG_PATH, strerror(errno));
		return 0;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != (uid_t)TESSERA_CONFIG_OWNER ||
	    (st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
		(void)tessera_fail(why, len, "%s is not a regular file owned by uid %d and writable only by it", TESSERA_CONFIG_PATH,
			 TESSERA_CONFIG_OWNER);
		close(fd);
		return 0;
	}
	char buf[4096];
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n < 0) {
		(void)tessera_fail(why, len, "%s: %s", TESSERA_CONFIG_PATH, strerror(errno));
		return 0;
	}
	buf[n] = '\0';
	int allowed = 0;
	for (char *line = strtok(buf, "\n"); line != NULL; line = strtok(NULL, "\n")) {
		if (line[0] == '#')
			continue;
		if (strcmp(line, "allow-env-limits yes") == 0)
			allowed = 1;
		else if (strcmp(line, "allow-env-limits no") == 0)
			allowed = 0;
	}
	if (!allowed)
		(void)tessera_fail(why, len, "%s does not say \"allow-env-limits yes\"", TESSERA_CONFIG_PATH);
	return allowed;
}

static int load_limits(char *why, size_t len)
{
	char err[400];
	/* 1. The container's limits file. */
	if (present(TESSERA_LIMITS_PATH)) {
		if (tessera_limits_load(TESSERA_LIMITS_PATH, &tessera.limits, err, sizeof(err)) < 0)
			return tessera_fail(why, len, "%s", err);
		return 0;
	}
	/* 2. On a node without NRI the agent's socket is mounted in the same read-only
	 * directory, and the agent answers with this container's limits. Its refusal, or no
	 * answer, refuses CUDA: never unlimited. */
	if (present(TESSERA_BIND_SOCKET)) {
		if (tessera_bind_fetch(TESSERA_BIND_SOCKET, &tessera.limits, err, sizeof(err)) < 0)
			return tessera_fail(why, len, "%s", err);
		return 0;
	}
	/* 3. A Tessera container with neither: the agent is restarting, or it did not bind
	 * this container. Environment limits are never honoured here. */
	const char *inside = tessera_container_reason();
	if (inside != NULL)
		return tessera_fail(why, len,
				    "inside a Tessera container (%s) there is no limits file at %s and no node agent socket at %s; "
				    "limits from the environment are not honoured in a Tessera container",
				    inside, TESSERA_LIMITS_PATH, TESSERA_BIND_SOCKET);
	/* 4. Standalone use, where the administrator allows it. */
	char policy[300];
	if (!env_limits_allowed(policy, sizeof(policy)))
		return tessera_fail(why, len, "no limits file at %s, no node agent socket at %s, and standalone use is not enabled (%s)",
				    TESSERA_LIMITS_PATH, TESSERA_BIND_SOCKET, policy);
	const char *path = getenv("TESSERA_LIMITS_FILE");
	if (path == NULL || path[0] == '\0')
		return tessera_fail(why, len, "no limits file at %s and TESSERA_LIMITS_FILE is not set", TESSERA_LIMITS_PATH);
	if (tessera_limits_load(path, &tessera.limits, err, sizeof(err)) < 0)
		return tessera_fail(why, len, "%s", err);
	return 0;
}

/* ---- the driver's view: CUDA_VISIBLE_DEVICES --------------------------------- */

/* A UUID without its GPU-/MIG- prefix: CUDA gives MIG instances' as bytes, NVML as text. */
static const char *uuid_body(const char *u)
{
	return strncasecmp(u, "GPU-", 4) == 0 || strncasecmp(u, "MIG-", 4) == 0 ? u + 4 : u;
}


/* The index of the container GPU that the tenant's CUDA_VISIBLE_DEVICES entry tok
 * (len bytes) names, or -1: an ordinal of the container's view (the limits' order) or
 * a UUID, or a unique prefix of one, with or without its GPU-/MIG- prefix. */
static int visible_entry(const char *tok, size_t len)
{
	char t[TESSERA_MAX_UUID + 1];
	if (len == 0 || len > TESSERA_MAX_UUID)
		return -1;
	memcpy(t, tok, len);
	t[len] = '\0';
	char *end;
	long i = strtol(t, &end, 10);
	if (*end == '\0')
		return i >= 0 && i < tessera.limits.ngpus ? (int)i : -1;
	const char *p = uuid_body(t);
	size_t plen = strlen(p);
	int found = -1;
	for (int g = 0; g < tessera.limits.ngpus; g++) {
		const char *u = uuid_body(tessera.limits.gpus[g].uuid);
		if (plen > 0 && strncasecmp(u, p, plen) == 0) {
			if (found >= 0)
				return -1; /* ambiguous prefix */
			found = g;
		}
	}
	return found;
}

/*
 * Makes the driver itself show only the container's GPUs, in the limits' order, by
 * setting CUDA_VISIBLE_DEVICES to their UUIDs before the driver initialises. Hiding
 * them only in the hooked calls is not enough where the process can open more GPUs
 * than it was assigned (a node without NRI, standalone use): the CUDA 12/13 runtime
 * also counts devices through the driver's internal interfaces, finds a different
 * number and fails with "integrity checks failed" (cudaErrorIntegrityCheckFailed).
 * A value the tenant set narrows the container's view as CUDA would narrow a node's:
 * its entries are ordinals of the container's GPUs or their UUIDs, and the list ends
 * at the first entry that names none of them, or one named before.
 */
/* The container's GPUs this process sees, in the order it sees them (indexes into
 * limits.gpus): all of them in the limits' order, unless the tenant narrowed them. */
static int view[TESSERA_MAX_GPUS], nview;

static void narrow_visible_devices(void)
{
	static char out[TESSERA_MAX_GPUS * (TESSERA_MAX_UUID + 1) + 1];
	int *pick = view, n = 0;
	const char *want = getenv("CUDA_VISIBLE_DEVICES");
	if (want == NULL) {
		for (int g = 0; g < tessera.limits.ngpus; g++)
			pick[n++] = g;
	} else {
		for (const char *p = want; *p != '\0' && n < tessera.limits.ngpus;) {
			while (*p == ' ')
				p++;
			size_t len = strcspn(p, ",");
			size_t tl = len;
			while (tl > 0 && p[tl - 1] == ' ')
				tl--;
			int g = visible_entry(p, tl);
			int seen = 0;
			for (int i = 0; i < n; i++)
				seen |= pick[i] == g;
			if (g < 0 || seen)
				break;
			pick[n++] = g;
			p += len;
			if (*p == ',')
				p++;
		}
	}
	nview = n;
	size_t off = 0;
	out[0] = '\0';
	for (int i = 0; i < n; i++)
		off += (size_t)snprintf(out + off, sizeof(out) - off, "%s%s", i ? "," : "", tessera.limits.gpus[pick[i]].uuid);
	if (want == NULL || strcmp(want, out) != 0) {
		tessera_log(TESSERA_LOG_DEBUG, "CUDA_VISIBLE_DEVICES=%s (was %s)", out, want ? want : "unset");
		setenv("CUDA_VISIBLE_DEVICES", out, 1);
	}
}

/* ---- set-up ----------------------------------------------------------------- */

static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void fork_child(void)
{
	/* A child starts with no CUDA state of its own: the parent's allocations, context
	 * charges and accounting slot are the parent's. */
	atomic_store(&tessera.captures, 0);
	pthread_mutex_init(&tessera.dev_mu, NULL);
	pthread_mutex_init(&tessera.nvml_mu, NULL);
	tessera_region_after_fork();
	tessera_memory_after_fork();
	tessera_context_after_fork();
	tessera_graph_after_fork();
}

static void process_exit(void)
{
	if (tessera.region != NULL)
		tessera_region_forget_process(tessera.region);
}

static void init(void)
{
	const char *lv = getenv("TESSERA_HOOK_LOG"); /* verbosity only; it changes no limit */
	if (lv != NULL)
		log_level = strcmp(lv, "debug") == 0 ? TESSERA_LOG_DEBUG : strcmp(lv, "info") == 0 ? TESSERA_LOG_INFO : log_level;

	if (load_limits(tessera.why, sizeof(tessera.why)) < 0) {
		tessera.status = CUDA_ERROR_NOT_PERMITTED;
		tessera_log(TESSERA_LOG_ERROR, "refusing CUDA: %s", tessera.why);
		return;
	}
	narrow_visible_devices();
	tessera.libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
	if (tessera.libcuda == NULL) {
		snprintf(tessera.why, sizeof(tessera.why), "cannot load libcuda.so.1: %s", dlerror());
		tessera.status = CUDA_ERROR_NOT_INITIALIZED;
		tessera_log(TESSERA_LOG_ERROR, "%s", tessera.why);
		return;
	}
	for (size_t i = 0; i < NSYMBOLS; i++)
		if (symbols[i].lib == LIB_CUDA)
			*real_slot(&symbols[i]) = real_dlsym(tessera.libcuda, symbols[i].name);
	if (REAL(cuGetProcAddress_v2) == NULL && REAL(cuGetProcAddress) == NULL) {
		snprintf(tessera.why, sizeof(tessera.why), "libcuda.so.1 has no cuGetProcAddress; the driver is too old");
		tessera.status = CUDA_ERROR_NOT_SUPPORTED;
		tessera_log(TESSERA_LOG_ERROR, "%s", tessera.why);
		return;
	}
	char err[300];
	if (tessera_region_open(tessera.limits.cgroup, tessera.limits.ngpus, &tessera.region, err, sizeof(err)) < 0) {
		snprintf(tessera.why, sizeof(tessera.why), "%s", err);
		tessera.status = CUDA_ERROR_OPERATING_SYSTEM;
		tessera_log(TESSERA_LOG_ERROR, "%s", tessera.why);
		return;
	}
	for (int i = 0; i < TESSERA_MAX_GPUS; i++)
		tessera.real_dev[i] = -1;
	tessera_pacing_setup();
	pthread_atfork(NULL, NULL, fork_child);
	atexit(process_exit);
	tessera.status = CUDA_SUCCESS;
	tessera_log(TESSERA_LOG_INFO, "limits loaded cgroup=%s gpus=%d context-mib=%llu", tessera.limits.cgroup,
		    tessera.limits.ngpus, (unsigned long long)tessera.limits.context_mib);
}

_Atomic int tessera_ready;

CUresult tessera_init_slow(void)
{
	pthread_once(&init_once, init);
	atomic_store_explicit(&tessera_ready, 1, memory_order_release);
	return tessera.status;
}

uint64_t tessera_limit_bytes(int gpu)
{
	return tessera.limits.gpus[gpu].memory_mib * MIB;
}

/* ---- devices ---------------------------------------------------------------- */

void tessera_format_uuid(const CUuuid *u, char *out, size_t len)
{
	const unsigned char *b = (const unsigned char *)u->bytes;
	snprintf(out, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
		 b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

/* UUIDs compare without their "GPU-"/"MIG-" prefix and without regard to case, since
 * CUDA reports a MIG instance's UUID as bytes and NVML as text. */
int tessera_same_uuid(const char *a, const char *b)
{
	return strcasecmp(uuid_body(a), uuid_body(b)) == 0;
}

CUresult tessera_devices(void)
{
	if (atomic_load_explicit(&tessera.dev_ready, memory_order_acquire))
		return CUDA_SUCCESS;
	if (REAL(cuDeviceGetCount) == NULL || REAL(cuDeviceGet) == NULL || REAL(cuDeviceGetUuid_v2) == NULL)
		return CUDA_ERROR_NOT_FOUND;
	pthread_mutex_lock(&tessera.dev_mu);
	CUresult rc = CUDA_SUCCESS;
	if (!atomic_load(&tessera.dev_ready)) {
		int n = 0;
		rc = REAL(cuDeviceGetCount)(&n);
		for (int i = 0; rc == CUDA_SUCCESS && i < n; i++) {
			CUdevice d;
			CUuuid u;
			char s[64];
			if ((rc = REAL(cuDeviceGet)(&d, i)) != CUDA_SUCCESS || (rc = REAL(cuDeviceGetUuid_v2)(&u, d)) != CUDA_SUCCESS)
				break;
			tessera_format_uuid(&u, s, sizeof(s));
			for (int g = 0; g < tessera.limits.ngpus; g++)
				if (tessera.real_dev[g] < 0 && tessera_same_uuid(s, tessera.limits.gpus[g].uuid))
					tessera.real_dev[g] = d;
		}
		if (rc == CUDA_SUCCESS) {
			tessera.nvis = 0;
			for (int i = 0; i < nview; i++) {
				int g = view[i];
				if (tessera.real_dev[g] >= 0)
					tessera.vis[tessera.nvis++] = g;
				else
					tessera_log(TESSERA_LOG_WARN, "assigned GPU %s is not visible to the driver",
						    tessera.limits.gpus[g].uuid);
			}
			if (tessera.nvis == 0 && nview > 0)
				tessera_log(TESSERA_LOG_ERROR, "none of the container's %d GPUs is visible to the driver",
					    tessera.limits.ngpus);
			else if (nview == 0)
				tessera_log(TESSERA_LOG_INFO, "CUDA_VISIBLE_DEVICES names none of the container's %d GPUs",
					    tessera.limits.ngpus);
			atomic_store_explicit(&tessera.dev_ready, 1, memory_order_release);
		}
	}
	pthread_mutex_unlock(&tessera.dev_mu);
	return rc;
}

int tessera_gpu_of_device(CUdevice dev)
{
	for (int i = 0; i < tessera.nvis; i++)
		if (tessera.real_dev[tessera.vis[i]] == dev)
			return tessera.vis[i];
	return -1;
}

CUresult tessera_current_gpu(int *gpu)
{
	CUdevice dev;
	CUresult rc = tessera_devices();
	if (rc != CUDA_SUCCESS)
		return rc;
	HOOK_REAL(cuCtxGetDevice);
	if ((rc = REAL(cuCtxGetDevice)(&dev)) != CUDA_SUCCESS)
		return rc;
	*gpu = tessera_gpu_of_device(dev);
	return *gpu < 0 ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS;
}

CUresult cuInit(unsigned int flags)
{
	HOOK_ENTER();
	HOOK_REAL(cuInit);
	CUresult rc = REAL(cuInit)(flags);
	if (rc != CUDA_SUCCESS)
		return rc;
	if ((rc = tessera_devices()) != CUDA_SUCCESS)
		return rc;
	return tessera.nvis == 0 ? CUDA_ERROR_NO_DEVICE : CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count)
{
	HOOK_ENTER();
	CUresult rc = tessera_devices();
	if (rc != CUDA_SUCCESS)
		return rc;
	if (count == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	*count = tessera.nvis;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
	HOOK_ENTER();
	CUresult rc = tessera_devices();
	if (rc != CUDA_SUCCESS)
		return rc;
	if (device == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (ordinal < 0 || ordinal >= tessera.nvis)
		return CUDA_ERROR_INVALID_DEVICE;
	*device = tessera.real_dev[tessera.vis[ordinal]];
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetByPCIBusId(CUdevice *dev, const char *pciBusId)
{
	HOOK_ENTER();
	HOOK_REAL(cuDeviceGetByPCIBusId);
	CUresult rc = tessera_devices();
	if (rc != CUDA_SUCCESS)
		return rc;
	CUdevice d;
	if ((rc = REAL(cuDeviceGetByPCIBusId)(&d, pciBusId)) != CUDA_SUCCESS)
		return rc;
	if (tessera_gpu_of_device(d) < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	*dev = d;
	return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
	HOOK_ENTER();
	HOOK_REAL(cuDeviceTotalMem_v2);
	CUresult rc = tessera_devices();
	if (rc != CUDA_SUCCESS)
		return rc;
	int g = tessera_gpu_of_device(dev);
	if (g < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	size_t total;
	if ((rc = REAL(cuDeviceTotalMem_v2)(&total, dev)) != CUDA_SUCCESS)
		return rc;
	*bytes = total < tessera_limit_bytes(g) ? total : (size_t)tessera_limit_bytes(g);
	return CUDA_SUCCESS;
}

/* ---- cuGetProcAddress ------------------------------------------------------- */

/*
 * Ask the driver, then swap in the hook when the driver's answer is one of the
 * functions we hook. Matching on the returned address, not the name, picks the right
 * hook whichever ABI version and stream flavour (_ptsz) the driver chose for the
 * caller's cudaVersion and flags; the GPU suite checks that the driver's answers are
 * the exported functions.
 */
static void swap_in_hook(void **pfn)
{
	if (pfn == NULL || *pfn == NULL)
		return;
	for (size_t i = 0; i < NSYMBOLS; i++)
		if (symbols[i].hook != NULL && symbols[i].lib == LIB_CUDA && *real_slot(&symbols[i]) == *pfn) {
			*pfn = symbols[i].hook;
			return;
		}
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
			     CUdriverProcAddressQueryResult *symbolStatus)
{
	HOOK_ENTER();
	HOOK_REAL(cuGetProcAddress_v2);
	CUresult rc = REAL(cuGetProcAddress_v2)(symbol, pfn, cudaVersion, flags, symbolStatus);
	if (rc == CUDA_SUCCESS)
		swap_in_hook(pfn);
	return rc;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
	HOOK_ENTER();
	HOOK_REAL(cuGetProcAddress);
	CUresult rc = REAL(cuGetProcAddress)(symbol, pfn, cudaVersion, flags);
	if (rc == CUDA_SUCCESS)
		swap_in_hook(pfn);
	return rc;
}

/* ---- NVML symbol resolution ------------------------------------------------- */

nvmlReturn_t tessera_nvml_init(void)
{
	/* Caller holds nvml_mu. */
	if (tessera.libnvml != NULL)
		return NVML_SUCCESS;
	void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_GLOBAL);
	if (h == NULL) {
		tessera_log(TESSERA_LOG_ERROR, "cannot load libnvidia-ml.so.1: %s", dlerror());
		return NVML_ERROR_FUNCTION_NOT_FOUND;
	}
	for (size_t i = 0; i < NSYMBOLS; i++)
		if (symbols[i].lib == LIB_NVML)
			*real_slot(&symbols[i]) = real_dlsym(h, symbols[i].name);
	tessera.libnvml = h;
	return NVML_SUCCESS;
}
