/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The driver's and NVML's own functions (interpose.c fills the table): what every layer
 * of the hook calls the driver through, REAL(name) (state.h). The hooks' own
 * prototypes are in interpose.h, which only the interposer layer includes.
 */
#ifndef TESSERA_REAL_H
#define TESSERA_REAL_H

#include "tessera_cuda.h"

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

/* Which library a symbols.def entry comes from. */
enum tessera_lib { TESSERA_LIB_CUDA, TESSERA_LIB_NVML };

/* Fills the real-function table's entries of lib from handle (a dlopen of that
 * library), looked up with libc's own dlsym; a function the library lacks is NULL. */
void tessera_resolve(void *handle, enum tessera_lib lib);

#endif
