/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Interposition (interpose.c): the hooks are exported under the driver's and NVML's
 * own names, dlsym() and cuGetProcAddress() answer with them, and the hook calls the
 * real functions through a table. All three come from the one list in symbols.def.
 */
#ifndef TESSERA_INTERPOSE_H
#define TESSERA_INTERPOSE_H

#include "tessera_cuda.h"

#define TESSERA_EXPORT __attribute__((visibility("default")))

/* The real-function table, generated from symbols.def. */
struct tessera_real {
#define TESSERA_CU_HOOK(name, proto, params) CUresult (*name) params;
#define TESSERA_CU_LEGACY(name, params) CUresult (*name) params;
#define TESSERA_CU_REAL(name, params) CUresult (*name) params;
#define TESSERA_NVML_HOOK(name, params) nvmlReturn_t (*name) params;
#define TESSERA_NVML_LEGACY(name, params) nvmlReturn_t (*name) params;
#define TESSERA_NVML_REAL(name, params) nvmlReturn_t (*name) params;
#include "symbols.def"
};

/* The hooks, exported under the driver's and NVML's own names. */
#define TESSERA_CU_HOOK(name, proto, params) TESSERA_EXPORT CUresult name params;
#define TESSERA_CU_LEGACY(name, params) TESSERA_EXPORT CUresult name params;
#define TESSERA_NVML_HOOK(name, params) TESSERA_EXPORT nvmlReturn_t name params;
#define TESSERA_NVML_LEGACY(name, params) TESSERA_EXPORT nvmlReturn_t name params;
#include "symbols.def"

/* Which library a symbols.def entry comes from. */
enum tessera_lib { TESSERA_LIB_CUDA, TESSERA_LIB_NVML };

/* Fills the real-function table's entries of lib from handle (a dlopen of that
 * library), looked up with libc's own dlsym; a function the library lacks is NULL. */
void tessera_resolve(void *handle, enum tessera_lib lib);

#endif
