/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Interposition (interpose.c): the hooks are exported under the driver's and NVML's
 * own names, dlsym() and cuGetProcAddress() answer with them, and the hook calls the
 * real functions through a table (real.h). All three come from the one list in
 * symbols.def.
 *
 * The interposer layer: only a file that defines hooks includes this. The services
 * under it never call a hook by its exported name (test/check_layers.sh).
 */
#ifndef TESSERA_INTERPOSE_H
#define TESSERA_INTERPOSE_H

#include "real.h"
#include "tessera_cuda.h"

#define TESSERA_EXPORT __attribute__((visibility("default")))

/* The hooks, exported under the driver's and NVML's own names. */
#define TESSERA_CU_HOOK(name, proto, params) TESSERA_EXPORT CUresult name params;
#define TESSERA_CU_LEGACY(name, params) TESSERA_EXPORT CUresult name params;
#define TESSERA_NVML_HOOK(name, params) TESSERA_EXPORT nvmlReturn_t name params;
#define TESSERA_NVML_LEGACY(name, params) TESSERA_EXPORT nvmlReturn_t name params;
#include "symbols.def"

#endif
