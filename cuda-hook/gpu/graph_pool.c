/* SPDX-License-Identifier: Apache-2.0 */
/*
 * How the driver's graph memory pool behaves, printed step by step (bench-gpu runs it
 * without the hook): when a graph's memory nodes take memory (upload or first launch,
 * not instantiation), whether a relaunch or a free inside the graph gives any back
 * (no), what a trim does, and what captured cudaMallocAsync becomes. The hook's
 * accounting of graph memory (src/graph.c) rests on these answers.
 */
#include <cuda.h>
#include <stdio.h>
#include <stddef.h>
/* Not driver_check.h's CK, which exits: a refused step is itself an answer here, so it
 * is printed and the walk goes on. */
#define CK(x) do { CUresult r_ = (x); if (r_) { const char *s; cuGetErrorString(r_, &s); printf("%s -> %d %s\n", #x, r_, s); } } while (0)
static CUdevice dev;
static void show(const char *at) {
	cuuint64_t res = 0, used = 0; size_t fr, tot;
	cuDeviceGetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &res);
	cuDeviceGetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &used);
	cuMemGetInfo(&fr, &tot);
	printf("%-40s reserved %8.1f MiB used %8.1f MiB devfree %9.1f MiB\n", at, res / 1048576.0, used / 1048576.0, fr / 1048576.0);
}
static CUgraph build(size_t bytes, int with_free, CUdeviceptr *out) {
	CUgraph g; CK(cuGraphCreate(&g, 0));
	CUDA_MEM_ALLOC_NODE_PARAMS p = {0};
	p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p.poolProps.location.id = dev;
	p.bytesize = bytes;
	CUgraphNode a, f;
	CK(cuGraphAddMemAllocNode(&a, g, NULL, 0, &p));
	*out = p.dptr;
	if (with_free) CK(cuGraphAddMemFreeNode(&f, g, &a, 1, p.dptr));
	return g;
}
int main(void) {
	CUcontext ctx; CK(cuInit(0)); CK(cuDeviceGet(&dev, 0)); CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
	printf("sizeof CUmemPoolProps %zu, CUDA_MEM_ALLOC_NODE_PARAMS %zu, off bytesize %zu dptr %zu poolProps.location %zu\n",
	       sizeof(CUmemPoolProps), sizeof(CUDA_MEM_ALLOC_NODE_PARAMS), offsetof(CUDA_MEM_ALLOC_NODE_PARAMS, bytesize),
	       offsetof(CUDA_MEM_ALLOC_NODE_PARAMS, dptr), offsetof(CUDA_MEM_ALLOC_NODE_PARAMS, poolProps.location));
	printf("CU_GRAPH_NODE_TYPE_MEM_ALLOC %d MEM_FREE %d GRAPH %d; attrs RES_CUR %d USED_CUR %d\n", CU_GRAPH_NODE_TYPE_MEM_ALLOC, CU_GRAPH_NODE_TYPE_MEM_FREE, CU_GRAPH_NODE_TYPE_GRAPH, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT);
	show("start");
	CUstream s; CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	CUdeviceptr d1, d2;
	/* A: 1 GiB alloc freed inside the graph */
	CUgraph ga = build(1 << 30, 1, &d1);
	show("A built (alloc+free 1GiB)");
	CUgraphExec ea; CK(cuGraphInstantiate(&ea, ga, 0));
	show("A instantiated");
	CK(cuGraphUpload(ea, s)); CK(cuStreamSynchronize(s));
	show("A uploaded");
	CK(cuGraphLaunch(ea, s));
	show("A launched (not synced)");
	CK(cuStreamSynchronize(s));
	show("A synced");
	CK(cuGraphLaunch(ea, s)); CK(cuStreamSynchronize(s));
	show("A launched again");
	/* B: 2 GiB alloc NOT freed in graph */
	CUgraph gb = build(2u << 30, 0, &d2);
	CUgraphExec eb; CK(cuGraphInstantiate(&eb, gb, CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH));
	show("B instantiated (2GiB, no free node)");
	CK(cuGraphLaunch(eb, s));
	show("B launched");
	CK(cuStreamSynchronize(s));
	show("B synced");
	CK(cuGraphLaunch(ea, s)); CK(cuStreamSynchronize(s));
	show("A launched while B's alloc live");
	CK(cuMemFreeAsync(d2, s)); CK(cuStreamSynchronize(s));
	show("B's alloc freed (cuMemFreeAsync)");
	CK(cuDeviceGraphMemTrim(dev));
	show("trimmed");
	CK(cuGraphExecDestroy(ea));
	show("A exec destroyed");
	CK(cuDeviceGraphMemTrim(dev));
	show("trimmed");
	CK(cuGraphExecDestroy(eb));
	CK(cuDeviceGraphMemTrim(dev));
	show("B destroyed, trimmed");
	/* C: captured cuMemAllocAsync + kernel-less free */
	CUdeviceptr d3; CUgraph gc; CUgraphExec ec;
	CK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
	CK(cuMemAllocAsync(&d3, 512 << 20, s));
	CK(cuMemsetD8Async(d3, 0, 512 << 20, s));
	CK(cuMemFreeAsync(d3, s));
	CK(cuStreamEndCapture(s, &gc));
	size_t n = 0; CK(cuGraphGetNodes(gc, NULL, &n));
	CUgraphNode nodes[16]; CK(cuGraphGetNodes(gc, nodes, &n));
	for (size_t i = 0; i < n; i++) { CUgraphNodeType t; cuGraphNodeGetType(nodes[i], &t); printf("captured node %zu type %d", i, t);
		if (t == CU_GRAPH_NODE_TYPE_MEM_ALLOC) { CUDA_MEM_ALLOC_NODE_PARAMS p; CK(cuGraphMemAllocNodeGetParams(nodes[i], &p)); printf(" bytes %zu dev %d", p.bytesize, p.poolProps.location.id); }
		printf("\n"); }
	show("C captured");
	CK(cuGraphInstantiate(&ec, gc, 0));
	show("C instantiated");
	CK(cuGraphLaunch(ec, s));
	show("C launched");
	CK(cuStreamSynchronize(s));
	show("C synced");
	/* D: two execs of A-like graphs, launched concurrently-ish */
	CUgraph g1 = build(1 << 30, 1, &d1), g2 = build(1 << 30, 1, &d2);
	CUgraphExec e1, e2; CK(cuGraphInstantiate(&e1, g1, 0)); CK(cuGraphInstantiate(&e2, g2, 0));
	CK(cuGraphLaunch(e1, s)); CK(cuGraphLaunch(e2, s));
	show("D two 1GiB graphs launched, one stream");
	CK(cuStreamSynchronize(s));
	show("D synced");
	show("end");
	return 0;
}
