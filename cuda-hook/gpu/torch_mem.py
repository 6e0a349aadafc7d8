# SPDX-License-Identifier: Apache-2.0
"""PyTorch and CuPy under the hook (make test-gpu).

  torch_mem.py oom <limit-mib> <context-mib>   allocate 256 MiB tensors until OOM
  torch_mem.py managed <limit-mib> <context-mib>   the same with CuPy managed memory
  torch_mem.py hold <mib> <ready-file>         allocate, then wait to be killed
  torch_mem.py try <mib> ok|oom                one allocation, checked
  torch_mem.py matmul <seconds>                bf16 matmuls; prints matmuls per second

The allocator backend comes from PYTORCH_CUDA_ALLOC_CONF, set by the caller.
"""
import os
import sys
import time

MIB = 1 << 20
CHUNK = 256


def fail(msg):
    print("FAIL", " ".join(sys.argv[1:]), msg)
    sys.exit(1)


def oom(limit, ctx):
    import torch
    free, total = torch.cuda.mem_get_info()
    if total != limit * MIB:
        fail(f"mem_get_info total {total // MIB} MiB, want {limit}")
    held = []
    try:
        while True:
            held.append(torch.empty(CHUNK * MIB, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError:
        pass
    got = len(held) * CHUNK
    free2, _ = torch.cuda.mem_get_info()
    reserved = torch.cuda.memory_reserved() // MIB
    print(f"torch conf={os.environ.get('PYTORCH_CUDA_ALLOC_CONF', 'default')} limit_mib={limit} "
          f"tensors_mib={got} reserved_mib={reserved} free_after_mib={free2 // MIB}")
    if got + ctx > limit:
        fail(f"got {got} MiB + {ctx} MiB context over the {limit} MiB limit")
    if got + ctx + 2 * CHUNK < limit:
        fail(f"got only {got} MiB of {limit - ctx}")


def managed(limit, ctx):
    import cupy
    cupy.cuda.set_allocator(None)
    held = []
    try:
        while True:
            m = cupy.cuda.memory.malloc_managed(CHUNK * MIB)
            cupy.cuda.runtime.memset(m.ptr, 1, CHUNK * MIB)
            held.append(m)
    except (cupy.cuda.memory.OutOfMemoryError, cupy.cuda.runtime.CUDARuntimeError):
        pass
    got = len(held) * CHUNK
    print(f"cupy managed limit_mib={limit} got_mib={got}")
    if got + ctx > limit or got + ctx + 2 * CHUNK < limit:
        fail(f"got {got} MiB under a {limit} MiB limit with a {ctx} MiB context")


def main():
    mode = sys.argv[1]
    if mode == "oom":
        oom(int(sys.argv[2]), int(sys.argv[3]))
    elif mode == "managed":
        managed(int(sys.argv[2]), int(sys.argv[3]))
    elif mode == "hold":
        import torch
        x = torch.empty(int(sys.argv[2]) * MIB, dtype=torch.uint8, device="cuda")
        open(sys.argv[3], "w").close()
        time.sleep(3600)
        del x
    elif mode == "try":
        import torch
        want = sys.argv[3]
        try:
            torch.empty(int(sys.argv[2]) * MIB, dtype=torch.uint8, device="cuda")
            got = "ok"
        except torch.OutOfMemoryError:
            got = "oom"
        print(f"try {sys.argv[2]} MiB: {got}")
        if got != want:
            fail(f"want {want}")
    elif mode == "devices":
        # devices <uuid>...: PyTorch sees exactly these GPUs, in this order, and can
        # allocate on each.
        import torch
        want = [u.lower().removeprefix("gpu-") for u in sys.argv[2:]]
        n = torch.cuda.device_count()
        got = [str(torch.cuda.get_device_properties(i).uuid).lower().removeprefix("gpu-") for i in range(n)]
        if got != want:
            fail(f"devices {got}, want {want}")
        for i in range(n):
            torch.ones(1 << 20, device=f"cuda:{i}").sum().item()
        print(f"devices {n}: {' '.join(got)}")
    elif mode == "matmul":
        import torch
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()
        n, t0 = 0, time.time()
        while time.time() - t0 < float(sys.argv[2]):
            for _ in range(50):
                a @ a
            n += 50
        torch.cuda.synchronize()
        print(f"matmul rate={n / (time.time() - t0):.1f}")
    else:
        fail("unknown mode")


if __name__ == "__main__":
    main()
