/* What the GPU suite's driver-API programs (b5_paths.c, legacy_launch.c) share: a
 * driver call that fails ends the program, naming the call and its error. */
#ifndef TESSERA_GPU_DRIVER_CHECK_H
#define TESSERA_GPU_DRIVER_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                       \
	do {                                                        \
		CUresult r_ = (x);                                  \
		if (r_ != CUDA_SUCCESS) {                           \
			fprintf(stderr, "%s failed: %d\n", #x, r_); \
			exit(1);                                    \
		}                                                   \
	} while (0)

#endif
