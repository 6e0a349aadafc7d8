/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Interposition: the hook is loaded into every process of a Tessera container (the
 * node agent preloads it). It exports the driver and NVML functions listed in
 * symbols.def under their own names, answers dlsym() and cuGetProcAddress() for those
 * names with its hooks, and calls the real functions through a table filled from the
 * libraries (tessera_resolve). One table, generated from symbols.def, serves every
 * path.
 *
 * The lookups themselves are hooked names too: whatever a program asks for by name
 * (dlsym, dlvsym with any handle and any version, glibc's private lookups, the
 * driver's cuGetProcAddress), asking for a lookup function answers the hook's, so no
 * lookup reachable by name hands out libc's own dlsym and, through it, the driver's
 * functions. A process can still find the driver's code without asking the loader by
 * name (docs/cuda-hook.md, "What the hook cannot see").
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stddef.h>
#include <stdint.h>

#include "elf_lookup.h"
#include "interpose.h"
#include "state.h"

/* ---- the symbol table ------------------------------------------------------- */

struct symbol {
	const char *name;
	void *hook;   /* NULL: used by the hook, not hooked */
	size_t real;  /* offset of the real pointer in struct tessera_real */
	enum tessera_lib lib;
};

static const struct symbol symbols[] = {
#define TESSERA_CU_HOOK(name, proto, params) {#name, (void *)name, offsetof(struct tessera_real, name), TESSERA_LIB_CUDA},
#define TESSERA_CU_LEGACY(name, params) {#name, (void *)name, offsetof(struct tessera_real, name), TESSERA_LIB_CUDA},
#define TESSERA_CU_REAL(name, params) {#name, NULL, offsetof(struct tessera_real, name), TESSERA_LIB_CUDA},
#define TESSERA_NVML_HOOK(name, params) {#name, (void *)name, offsetof(struct tessera_real, name), TESSERA_LIB_NVML},
#define TESSERA_NVML_LEGACY(name, params) {#name, (void *)name, offsetof(struct tessera_real, name), TESSERA_LIB_NVML},
#define TESSERA_NVML_REAL(name, params) {#name, NULL, offsetof(struct tessera_real, name), TESSERA_LIB_NVML},
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
 * instrumented, must not allocate and must not need the hook's state (EARLY, from
 * elf_lookup.h).
 */

EARLY static const struct symbol *hook_by_name(const char *name)
{
	for (size_t i = 0; i < NSYMBOLS; i++)
		if (symbols[i].hook != NULL && tessera_same_name(symbols[i].name, name))
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

EARLY static void find_real_dlsym(void)
{
	Dl_info info;
	struct link_map *self = NULL;
	if (dladdr1((void *)find_real_dlsym, &info, (void **)&self, RTLD_DL_LINKMAP) == 0 || self == NULL)
		return;
	for (struct link_map *l = self->l_next; l != NULL && real_dlvsym_fn == NULL; l = l->l_next)
		real_dlvsym_fn = (dlvsym_fn)tessera_elf_lookup(l, "dlvsym");
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

/* ---- glibc's private lookups ---------------------------------------------------- */

/*
 * glibc 2.28 to 2.33 export four more lookups from libc.so.6, version GLIBC_PRIVATE:
 * _dl_sym and _dl_vsym (what libdl's dlsym and dlvsym call) and __libc_dlsym and
 * __libc_dlvsym (for libpthread and NSS). A program can link against them or ask
 * dlvsym for them, and each would hand out the driver's functions. The hook exports
 * them too, so that they are answered like dlsym; glibc 2.34 and later export none of
 * them, and there the hook's answer with its own lookup.
 *
 * Before 2.34 the hook's own lookups (real_dlsym: libdl's dlsym) reach the hook's
 * _dl_sym, called from libdl: those get the real answer, or the hook would resolve
 * its real-function table to itself. Every other caller gets the hooked answer. The
 * caller is told by the return address, not by the `who` argument, which a program
 * may set to anything.
 */
typedef void *(*dl_sym_fn)(void *, const char *, void *);
typedef void *(*dl_vsym_fn)(void *, const char *, const char *, void *);
static dl_sym_fn real__dl_sym;
static dl_vsym_fn real__dl_vsym;
static dlsym_fn real___libc_dlsym;
static dlvsym_fn real___libc_dlvsym;
static struct link_map *libdl_map; /* the object whose dlvsym real_dlvsym uses */
static pthread_once_t private_once = PTHREAD_ONCE_INIT;

/* Only the dynamic linker's tables are read here (no lookup through dlsym): the hook's
 * _dl_vsym runs inside find_real_dlsym on glibc before 2.34. */
EARLY static void find_private(void)
{
	Dl_info info;
	struct link_map *self = NULL;
	if (dladdr1((void *)find_private, &info, (void **)&self, RTLD_DL_LINKMAP) == 0 || self == NULL)
		return;
	for (struct link_map *l = self->l_next; l != NULL; l = l->l_next) {
		if (libdl_map == NULL && tessera_elf_lookup(l, "dlvsym") != NULL)
			libdl_map = l;
		if (real__dl_sym == NULL)
			real__dl_sym = (dl_sym_fn)tessera_elf_lookup(l, "_dl_sym");
		if (real__dl_vsym == NULL)
			real__dl_vsym = (dl_vsym_fn)tessera_elf_lookup(l, "_dl_vsym");
		if (real___libc_dlsym == NULL)
			real___libc_dlsym = (dlsym_fn)tessera_elf_lookup(l, "__libc_dlsym");
		if (real___libc_dlvsym == NULL)
			real___libc_dlvsym = (dlvsym_fn)tessera_elf_lookup(l, "__libc_dlvsym");
	}
}

/* Whether a call returning to ret comes from the dlsym and dlvsym the hook calls. */
EARLY static int from_libdl(const void *ret)
{
	Dl_info info;
	struct link_map *lm = NULL;
	return libdl_map != NULL && dladdr1(ret, &info, (void **)&lm, RTLD_DL_LINKMAP) != 0 && lm == libdl_map;
}

/* ---- the answer ------------------------------------------------------------------ */

TESSERA_EXPORT void *_dl_sym(void *handle, const char *name, void *who);
TESSERA_EXPORT void *_dl_vsym(void *handle, const char *name, const char *version, void *who);
TESSERA_EXPORT void *__libc_dlsym(void *map, const char *name);
TESSERA_EXPORT void *__libc_dlvsym(void *map, const char *name, const char *version);

/* The lookup functions, answered with the hook's own (which answer like dlsym). */
static const struct {
	const char *name;
	void *hook;
} lookups[] = {
	{"dlsym", (void *)dlsym},
	{"dlvsym", (void *)dlvsym},
	{"_dl_sym", (void *)_dl_sym},
	{"_dl_vsym", (void *)_dl_vsym},
	{"__libc_dlsym", (void *)__libc_dlsym},
	{"__libc_dlvsym", (void *)__libc_dlvsym},
};

/* A program or runtime that looks up a hooked function in the driver (the CUDA runtime
 * does dlopen("libcuda.so.1") then dlsym), or a lookup function in libc or libdl, gets
 * the hook, whichever lookup it uses. */
EARLY static void *hooked_answer(const char *name, void *p)
{
	if (p == NULL || name == NULL)
		return p;
	if ((name[0] == 'c' && name[1] == 'u') || (name[0] == 'n' && name[1] == 'v' && name[2] == 'm')) {
		const struct symbol *s = hook_by_name(name);
		if (s != NULL)
			return s->hook;
	} else if (name[0] == 'd' || name[0] == '_') {
		for (size_t i = 0; i < sizeof(lookups) / sizeof(lookups[0]); i++)
			if (tessera_same_name(lookups[i].name, name))
				return lookups[i].hook;
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

TESSERA_EXPORT EARLY void *_dl_sym(void *handle, const char *name, void *who)
{
	pthread_once(&private_once, find_private);
	const void *ret = __builtin_return_address(0);
	if (real__dl_sym != NULL) {
		void *p = real__dl_sym(handle, name, who);
		return from_libdl(ret) ? p : hooked_answer(name, p);
	}
	void *p = handle == RTLD_NEXT ? lookup_next(ret, name, NULL) : real_dlsym(handle, name);
	return hooked_answer(name, p);
}

TESSERA_EXPORT EARLY void *_dl_vsym(void *handle, const char *name, const char *version, void *who)
{
	pthread_once(&private_once, find_private);
	const void *ret = __builtin_return_address(0);
	if (real__dl_vsym != NULL) {
		void *p = real__dl_vsym(handle, name, version, who);
		return from_libdl(ret) ? p : hooked_answer(name, p);
	}
	void *p = handle == RTLD_NEXT ? lookup_next(ret, name, version) : real_dlvsym(handle, name, version);
	return hooked_answer(name, p);
}

TESSERA_EXPORT EARLY void *__libc_dlsym(void *map, const char *name)
{
	pthread_once(&private_once, find_private);
	return hooked_answer(name, real___libc_dlsym != NULL ? real___libc_dlsym(map, name) : real_dlsym(map, name));
}

TESSERA_EXPORT EARLY void *__libc_dlvsym(void *map, const char *name, const char *version)
{
	pthread_once(&private_once, find_private);
	return hooked_answer(name, real___libc_dlvsym != NULL ? real___libc_dlvsym(map, name, version)
							    : real_dlvsym(map, name, version));
}

/* ---- filling the real-function table ---------------------------------------- */

void tessera_resolve(void *handle, enum tessera_lib lib)
{
	for (size_t i = 0; i < NSYMBOLS; i++)
		if (symbols[i].lib == lib)
			*real_slot(&symbols[i]) = real_dlsym(handle, symbols[i].name);
	/* Drivers before CUDA 12.8 have only the first ABI, with the same signature. */
	if (lib == TESSERA_LIB_CUDA && tessera.real.cuEventElapsedTime_v2 == NULL)
		*(void **)&tessera.real.cuEventElapsedTime_v2 = real_dlsym(handle, "cuEventElapsedTime");
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
		if (symbols[i].hook != NULL && symbols[i].lib == TESSERA_LIB_CUDA && *real_slot(&symbols[i]) == *pfn) {
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
