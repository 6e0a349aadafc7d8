/* SPDX-License-Identifier: Apache-2.0 */
// A module whose globals take 1 GiB of device memory (B5: module globals).
__device__ char big[1u << 30];
extern "C" __global__ void touch(void) { big[threadIdx.x] = 1; }
