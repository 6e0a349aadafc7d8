/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Keeps libtessera-cuda.so loadable with glibc 2.28 and later whatever glibc builds it.
 *
 * The hook is preloaded into tenant containers, which bring their own C library. A
 * shared object records, for each libc function it calls, the symbol version it was
 * linked against; glibc 2.33 and 2.34 gave several functions new versions (fstat,
 * and everything that moved from libdl and libpthread into libc), and a library
 * linked on a newer system needs those versions, which an older glibc lacks: the
 * loader then refuses to load the hook. The Makefile force-includes this header in
 * every compilation unit (-include), and links libdl.so.2 and libpthread.so.0 so that
 * these functions resolve from them on glibc older than 2.34. Every function here
 * keeps its interface across those versions, only its version changed.
 *
 * make -C cuda-hook test (test/check_exports.sh) and the image build check the result
 * and fail on any version newer than GLIBC_2.28. A new libc call that needs a pin
 * shows up there; add it below.
 */
#ifndef TESSERA_COMPAT_GLIBC_2_28_H
#define TESSERA_COMPAT_GLIBC_2_28_H

#if defined(__GLIBC__) || defined(__linux__)

/* The sources define _GNU_SOURCE themselves (an identical definition); it must be set
 * before the first system header, which this header now is. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <features.h>
/* glibc 2.38 and later turn strtol, strtoull and the rest into __isoc23_* (symbol
 * version GLIBC_2.38) under _GNU_SOURCE, for C23's 0b prefix, which the hook never
 * parses: keep the classic functions. */
#ifdef __GLIBC_USE_C2X_STRTOL
#undef __GLIBC_USE_C2X_STRTOL
#define __GLIBC_USE_C2X_STRTOL 0
#endif
#ifdef __GLIBC_USE_C23_STRTOL
#undef __GLIBC_USE_C23_STRTOL
#define __GLIBC_USE_C23_STRTOL 0
#endif
#include <sys/stat.h>

#if defined(__x86_64__)
#define TESSERA_GLIBC_BASE "GLIBC_2.2.5"
#define TESSERA_GLIBC_STAT_VER 1 /* _STAT_VER_LINUX */
#elif defined(__aarch64__)
#define TESSERA_GLIBC_BASE "GLIBC_2.17"
#define TESSERA_GLIBC_STAT_VER 0 /* _STAT_VER_LINUX */
#else
#error "compat/glibc-2.28.h: add the base glibc symbol version of this architecture"
#endif

#define TESSERA_PIN(sym, ver) __asm__(".symver " #sym "," #sym "@" ver)

/* libdl until glibc 2.34. */
TESSERA_PIN(dlopen, TESSERA_GLIBC_BASE);
TESSERA_PIN(dlclose, TESSERA_GLIBC_BASE);
TESSERA_PIN(dlerror, TESSERA_GLIBC_BASE);
#if defined(__x86_64__)
TESSERA_PIN(dladdr, TESSERA_GLIBC_BASE);
TESSERA_PIN(dladdr1, "GLIBC_2.3.3");
TESSERA_PIN(dlinfo, "GLIBC_2.3.3");
#else
TESSERA_PIN(dladdr, TESSERA_GLIBC_BASE);
TESSERA_PIN(dladdr1, TESSERA_GLIBC_BASE);
TESSERA_PIN(dlinfo, TESSERA_GLIBC_BASE);
#endif
/* dlsym and dlvsym are not pinned: the hook defines both (its interposers), finds
 * libc's dlvsym in the symbol tables of the objects loaded after it, and libc's dlsym
 * through that dlvsym under each version glibc has used. */

/* libpthread until glibc 2.34. */
TESSERA_PIN(pthread_once, TESSERA_GLIBC_BASE);
TESSERA_PIN(pthread_key_create, TESSERA_GLIBC_BASE);
TESSERA_PIN(pthread_getspecific, TESSERA_GLIBC_BASE);
TESSERA_PIN(pthread_setspecific, TESSERA_GLIBC_BASE);
TESSERA_PIN(pthread_create, TESSERA_GLIBC_BASE);
TESSERA_PIN(pthread_join, TESSERA_GLIBC_BASE);
TESSERA_PIN(pthread_detach, TESSERA_GLIBC_BASE);
TESSERA_PIN(pthread_mutexattr_init, TESSERA_GLIBC_BASE);
TESSERA_PIN(pthread_mutexattr_destroy, TESSERA_GLIBC_BASE);
TESSERA_PIN(pthread_mutexattr_settype, TESSERA_GLIBC_BASE);
TESSERA_PIN(pthread_mutexattr_setpshared, TESSERA_GLIBC_BASE);
TESSERA_PIN(pthread_mutex_trylock, TESSERA_GLIBC_BASE);
TESSERA_PIN(pthread_rwlock_rdlock, TESSERA_GLIBC_BASE);
TESSERA_PIN(pthread_rwlock_wrlock, TESSERA_GLIBC_BASE);
TESSERA_PIN(pthread_rwlock_unlock, TESSERA_GLIBC_BASE);
TESSERA_PIN(pthread_cond_timedwait, TESSERA_GLIBC_BASE);
TESSERA_PIN(pthread_sigmask, TESSERA_GLIBC_BASE);
TESSERA_PIN(sem_post, TESSERA_GLIBC_BASE);
TESSERA_PIN(sem_wait, TESSERA_GLIBC_BASE);
TESSERA_PIN(sem_timedwait, TESSERA_GLIBC_BASE);
#if defined(__x86_64__)
TESSERA_PIN(pthread_mutexattr_setrobust, "GLIBC_2.12");
TESSERA_PIN(pthread_mutex_consistent, "GLIBC_2.12");
#else
TESSERA_PIN(pthread_mutexattr_setrobust, TESSERA_GLIBC_BASE);
TESSERA_PIN(pthread_mutex_consistent, TESSERA_GLIBC_BASE);
#endif

/* fstat became a libc symbol in glibc 2.33; before, <sys/stat.h> turned it into a call
 * of __fxstat, which every glibc since 2.2.5 exports. The hook calls no stat() (its
 * pinned form, __xstat, links into a broken PLT entry under -fsanitize=address with the
 * binutils here): make -C cuda-hook test fails on one. */
extern int __fxstat(int ver, int fd, struct stat *st);
TESSERA_PIN(__fxstat, TESSERA_GLIBC_BASE);
static inline int tessera_compat_fstat(int fd, struct stat *st)
{
	return __fxstat(TESSERA_GLIBC_STAT_VER, fd, st);
}
#define fstat(fd, st) tessera_compat_fstat((fd), (st))

#endif /* __GLIBC__ || __linux__ */
#endif /* TESSERA_COMPAT_GLIBC_2_28_H */
