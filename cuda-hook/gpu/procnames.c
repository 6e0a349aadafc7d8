/* SPDX-License-Identifier: Apache-2.0 */
/* Which exported function the driver's cuGetProcAddress answers with, per name,
 * CUDA version and stream flavour: dladdr of each answer. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv)
{
	cuInit(0);
	int vers[] = {11000, 12000, 12080, 13000};
	for (int i = 1; i < argc; i++)
		for (int v = 0; v < 4; v++)
			for (int f = 0; f < 2; f++) {
				void *p = NULL;
				CUdriverProcAddressQueryResult st;
				CUresult rc = cuGetProcAddress(argv[i], &p, vers[v], f ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0, &st);
				Dl_info di = {0};
				if (p)
					dladdr(p, &di);
				printf("%s v%d %s rc=%d -> %s%s (+%ld)\n", argv[i], vers[v], f ? "ptsz" : "def", rc,
				       di.dli_sname ? di.dli_sname : "(no name)", di.dli_saddr == p ? " exactly" : " nearest below",
				       (long)((char *)p - (char *)di.dli_saddr));
			}
	return 0;
}
