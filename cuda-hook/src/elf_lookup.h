/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Looking a function up in a loaded object's dynamic symbol table, as the dynamic
 * linker does, without asking the linker (interpose.c finds libc's own dlsym so; the
 * test suite finds the driver's own functions so, which is what a process that goes
 * around the hook can do too: docs/cuda-hook.md, "What the hook cannot see").
 */
#ifndef TESSERA_ELF_LOOKUP_H
#define TESSERA_ELF_LOOKUP_H

#include <link.h>
#include <stdint.h>

/* Code that runs before the sanitizer runtimes are set up (see interpose.c). */
#define EARLY __attribute__((no_sanitize_address))

EARLY static inline int tessera_same_name(const char *a, const char *b)
{
	while (*a && *a == *b)
		a++, b++;
	return *a == *b;
}

EARLY static inline uintptr_t tessera_dyn_ptr(const struct link_map *l, const ElfW(Dyn) *d)
{
	/* glibc relocates these entries in place on most targets, not on all. */
	uintptr_t p = (uintptr_t)d->d_un.d_ptr;
	return p < (uintptr_t)l->l_addr ? p + (uintptr_t)l->l_addr : p;
}

/* The default-version definition of a function named name in object l, or NULL. */
EARLY static inline void *tessera_elf_lookup(const struct link_map *l, const char *name)
{
	const ElfW(Sym) *symtab = NULL;
	const char *strtab = NULL;
	const uint32_t *gnu = NULL, *sysv = NULL;
	const ElfW(Half) *versym = NULL;
	if (l->l_ld == NULL)
		return NULL;
	for (const ElfW(Dyn) *d = l->l_ld; d->d_tag != DT_NULL; d++) {
		switch (d->d_tag) {
		case DT_SYMTAB: symtab = (const ElfW(Sym) *)tessera_dyn_ptr(l, d); break;
		case DT_STRTAB: strtab = (const char *)tessera_dyn_ptr(l, d); break;
		case DT_GNU_HASH: gnu = (const uint32_t *)tessera_dyn_ptr(l, d); break;
		case DT_HASH: sysv = (const uint32_t *)tessera_dyn_ptr(l, d); break;
		case DT_VERSYM: versym = (const ElfW(Half) *)tessera_dyn_ptr(l, d); break;
		}
	}
	if (symtab == NULL || strtab == NULL)
		return NULL;
#define USABLE(i)                                                                                     \
	(symtab[i].st_shndx != SHN_UNDEF && ELF64_ST_TYPE(symtab[i].st_info) == STT_FUNC &&           \
	 (versym == NULL || (versym[i] & 0x8000) == 0) && tessera_same_name(strtab + symtab[i].st_name, name))
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

#endif
