/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Prints the layout and constants of every type the hook declares itself. Built
 * twice on a GPU machine, once against include/tessera_cuda.h and once against the
 * real cuda.h and nvml.h (-DREAL_HEADERS); run-tests.sh requires identical output.
 * With the real headers it also checks each prototype in symbols.def.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef REAL_HEADERS
#include <cuda.h>
#include <nvml.h>
/* Each hooked or called function must have exactly the declared type. */
#define TESSERA_CU_HOOK(name, proto, params) \
	_Static_assert(__builtin_types_compatible_p(__typeof__(&proto), CUresult(*) params), #name " differs from cuda.h");
#define TESSERA_CU_REAL(name, params) \
	_Static_assert(__builtin_types_compatible_p(__typeof__(&name), CUresult(*) params), #name " differs from cuda.h");
#define TESSERA_NVML_HOOK(name, params) \
	_Static_assert(__builtin_types_compatible_p(__typeof__(&name), nvmlReturn_t(*) params), #name " differs from nvml.h");
#define TESSERA_NVML_REAL TESSERA_NVML_HOOK
#include "symbols.def"
#else
#include "tessera_cuda.h"
#endif

#define SZ(t) printf("sizeof %s %zu\n", #t, sizeof(t))
#define OFF(t, f) printf("offsetof %s.%s %zu\n", #t, #f, offsetof(t, f))
#define VAL(c) printf("value %s %lld\n", #c, (long long)(c))

int main(void)
{
	SZ(CUdevice); SZ(CUdeviceptr); SZ(CUmemGenericAllocationHandle); SZ(cuuint64_t); SZ(CUuuid); SZ(CUresult);
	SZ(CUDA_ARRAY_DESCRIPTOR); OFF(CUDA_ARRAY_DESCRIPTOR, Format); OFF(CUDA_ARRAY_DESCRIPTOR, NumChannels);
	SZ(CUDA_ARRAY3D_DESCRIPTOR); OFF(CUDA_ARRAY3D_DESCRIPTOR, Depth); OFF(CUDA_ARRAY3D_DESCRIPTOR, Format);
	OFF(CUDA_ARRAY3D_DESCRIPTOR, NumChannels); OFF(CUDA_ARRAY3D_DESCRIPTOR, Flags);
	SZ(CUDA_ARRAY_MEMORY_REQUIREMENTS); OFF(CUDA_ARRAY_MEMORY_REQUIREMENTS, size);
	SZ(CUmemLocation); OFF(CUmemLocation, id);
	SZ(CUmemAllocationProp); OFF(CUmemAllocationProp, location); OFF(CUmemAllocationProp, win32HandleMetaData);
	OFF(CUmemAllocationProp, allocFlags);
	SZ(CUexecAffinityParam); OFF(CUexecAffinityParam, param); OFF(CUexecAffinityParam, param.smCount.val);
	SZ(CUctxCreateParams); OFF(CUctxCreateParams, numExecAffinityParams); OFF(CUctxCreateParams, cigParams);
	VAL(CU_EXEC_AFFINITY_TYPE_SM_COUNT); VAL(CU_DEVICE_ATTRIBUTE_MPS_ENABLED); VAL(CUDA_ERROR_MPS_CONNECTION_FAILED);
	SZ(CUlaunchConfig); OFF(CUlaunchConfig, sharedMemBytes); OFF(CUlaunchConfig, hStream); OFF(CUlaunchConfig, attrs);
	OFF(CUlaunchConfig, numAttrs);
	SZ(CUDA_LAUNCH_PARAMS); OFF(CUDA_LAUNCH_PARAMS, gridDimX); OFF(CUDA_LAUNCH_PARAMS, sharedMemBytes);
	OFF(CUDA_LAUNCH_PARAMS, hStream); OFF(CUDA_LAUNCH_PARAMS, kernelParams);
	SZ(CUmemPoolProps); OFF(CUmemPoolProps, location); OFF(CUmemPoolProps, win32SecurityAttributes);
	OFF(CUmemPoolProps, maxSize); OFF(CUmemPoolProps, usage);
	SZ(CUDA_MEM_ALLOC_NODE_PARAMS); OFF(CUDA_MEM_ALLOC_NODE_PARAMS, accessDescs);
	OFF(CUDA_MEM_ALLOC_NODE_PARAMS, accessDescCount); OFF(CUDA_MEM_ALLOC_NODE_PARAMS, bytesize);
	OFF(CUDA_MEM_ALLOC_NODE_PARAMS, dptr);
	SZ(CUDA_GRAPH_INSTANTIATE_PARAMS); OFF(CUDA_GRAPH_INSTANTIATE_PARAMS, hUploadStream);
	OFF(CUDA_GRAPH_INSTANTIATE_PARAMS, hErrNode_out); OFF(CUDA_GRAPH_INSTANTIATE_PARAMS, result_out);
	SZ(nvmlMemory_t); OFF(nvmlMemory_t, free); OFF(nvmlMemory_t, used);
	SZ(nvmlMemory_v2_t); OFF(nvmlMemory_v2_t, total); OFF(nvmlMemory_v2_t, reserved); OFF(nvmlMemory_v2_t, used);
	VAL(nvmlMemory_v2); VAL(NVML_DEVICE_UUID_V2_BUFFER_SIZE);
	VAL(CUDA_SUCCESS); VAL(CUDA_ERROR_INVALID_VALUE); VAL(CUDA_ERROR_OUT_OF_MEMORY); VAL(CUDA_ERROR_NOT_INITIALIZED);
	VAL(CUDA_ERROR_NO_DEVICE); VAL(CUDA_ERROR_INVALID_DEVICE); VAL(CUDA_ERROR_INVALID_CONTEXT);
	VAL(CUDA_ERROR_OPERATING_SYSTEM); VAL(CUDA_ERROR_NOT_FOUND); VAL(CUDA_ERROR_NOT_READY); VAL(CU_EVENT_DEFAULT); VAL(CU_STREAM_DEFAULT); VAL(CU_STREAM_NON_BLOCKING); VAL(CUDA_ERROR_NOT_PERMITTED);
	VAL(CUDA_ERROR_NOT_SUPPORTED); VAL(CUDA_ERROR_UNKNOWN);
	VAL(CU_GET_PROC_ADDRESS_SUCCESS); VAL(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
	VAL(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT); VAL(CU_GET_PROC_ADDRESS_DEFAULT);
	VAL(CU_GET_PROC_ADDRESS_LEGACY_STREAM); VAL(CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
	VAL(CU_STREAM_CAPTURE_MODE_GLOBAL); VAL(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL); VAL(CU_STREAM_CAPTURE_MODE_RELAXED);
	VAL(CU_STREAM_CAPTURE_STATUS_NONE); VAL(CU_STREAM_CAPTURE_STATUS_ACTIVE); VAL(CU_STREAM_CAPTURE_STATUS_INVALIDATED);
	VAL(CU_POINTER_ATTRIBUTE_BUFFER_ID); VAL((unsigned long long)(uintptr_t)CU_STREAM_PER_THREAD);
	VAL(CU_AD_FORMAT_UNSIGNED_INT8); VAL(CU_AD_FORMAT_UNSIGNED_INT16); VAL(CU_AD_FORMAT_UNSIGNED_INT32);
	VAL(CU_AD_FORMAT_SIGNED_INT8); VAL(CU_AD_FORMAT_SIGNED_INT16); VAL(CU_AD_FORMAT_SIGNED_INT32);
	VAL(CU_AD_FORMAT_HALF); VAL(CU_AD_FORMAT_FLOAT);
	VAL(CU_MEM_LOCATION_TYPE_INVALID); VAL(CU_MEM_LOCATION_TYPE_DEVICE); VAL(CU_MEM_LOCATION_TYPE_HOST);
	VAL(CU_MEM_ALLOCATION_TYPE_PINNED); VAL(CU_MEM_HANDLE_TYPE_NONE);
	VAL(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD); VAL(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT); VAL(CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
	VAL(CU_GRAPH_NODE_TYPE_GRAPH); VAL(CU_GRAPH_NODE_TYPE_MEM_ALLOC); VAL(CU_GRAPH_NODE_TYPE_MEM_FREE);
	VAL(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT); VAL(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT);
	VAL(CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH); VAL(CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD);
	VAL(NVML_SUCCESS); VAL(NVML_ERROR_UNINITIALIZED); VAL(NVML_ERROR_INVALID_ARGUMENT); VAL(NVML_ERROR_NOT_SUPPORTED);
	VAL(NVML_ERROR_NO_PERMISSION); VAL(NVML_ERROR_NOT_FOUND); VAL(NVML_ERROR_INSUFFICIENT_SIZE);
	VAL(NVML_ERROR_FUNCTION_NOT_FOUND); VAL(NVML_ERROR_UNKNOWN);
	return 0;
}
