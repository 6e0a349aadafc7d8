"""PyTorch workloads of the B4 compute-limit matrix (gpu/b4-matrix.sh).

    python3 torch_work.py <seconds> <workload>...

Workloads, run one after the other in this process:
    mm<n>   bf16 n x n matmuls back to back (mm2048 ~ tens of us, mm8192 ~ 1.6 ms
            per kernel on an H200)
    mlp     a launch-bound training loop: a small MLP (3 layers of 512, batch 64),
            Adam, loss.item() every step

For each, prints "<workload> rate=<steps per second>" over <seconds> after a warm-up,
from a synchronize to a synchronize, the process's CPU time per step (cpu_us, all its
threads), and that interval's start and end (t0_us, t1_us: microseconds since the
epoch, for NVML's utilisation samples).

TESSERA_BENCH_BARRIER=<dir>:<n> lines up the measured intervals of n processes
started together: after its warm-up each one leaves a file in <dir> and goes on
stepping, unmeasured, until all n have (60 s at most; "barrier=late" then says the
interval began without the others), so all of them measure the same seconds of the
host and the GPU rather than one's start-up beside another's measured steps.
"""
import os
import sys
import time

import torch


def barrier(k):
    """Waits, stepping, for every process of TESSERA_BENCH_BARRIER to reach workload k."""
    spec = os.environ.get("TESSERA_BENCH_BARRIER")
    if not spec:
        return lambda: True
    d, n = spec.rsplit(":", 1)
    os.makedirs(d, exist_ok=True)
    open(os.path.join(d, f"{k}.{os.getpid()}"), "w").close()
    deadline = time.monotonic() + 60
    last = 0.0

    def reached():
        nonlocal last
        now = time.monotonic()
        if now > deadline:
            return None
        if now - last < 0.001:  # a look every millisecond at most
            return False
        last = now
        return sum(1 for f in os.listdir(d) if f.startswith(f"{k}.")) >= int(n)

    return reached


def run(step, seconds, k, warm=0.5):
    t = time.monotonic()
    while time.monotonic() - t < warm:
        step()
    reached = barrier(k)
    while True:
        r = reached()
        if r is None:
            print("barrier=late", file=sys.stderr, flush=True)
        if r is not False:
            break
        step()
    torch.cuda.synchronize()
    n = 0
    e0 = int(time.time() * 1e6)
    c0 = time.process_time()
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        step()
        n += 1
    torch.cuda.synchronize()
    t1 = time.monotonic()
    cpu_us = (time.process_time() - c0) * 1e6 / max(n, 1)
    return n / (t1 - t0), cpu_us, e0, int(time.time() * 1e6)


def matmul(n):
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)

    def step():
        torch.mm(a, b, out=c)

    return step


def mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 10)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(64, 512, device="cuda")
    y = torch.randint(0, 10, (64,), device="cuda")
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        loss.item()

    return step


def main():
    seconds = float(sys.argv[1])
    for k, w in enumerate(sys.argv[2:]):
        step = mlp() if w == "mlp" else matmul(int(w[2:]))
        rate, cpu_us, e0, e1 = run(step, seconds, k)
        print(f"{w} rate={rate:.3f} cpu_us={cpu_us:.1f} t0_us={e0} t1_us={e1}", flush=True)


if __name__ == "__main__":
    main()
