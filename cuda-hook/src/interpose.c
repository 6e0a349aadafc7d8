/*
 * Interposition: the hook is loaded into every process of a Tessera container (the
 * node agent preloads it). It exports the driver and NVML functions listed in
 * symbols.def under their own names, answers dlsym() and cuGetProcAddress() for those
 * names with its hooks, and calls the real functions through a table filled from the
 * libraries (tessera_resolve). One table, generated from symbols.def, serves every
 * path.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stddef.h>
#include <stdint.h>

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
