"""PyTorch workloads of the B4 compute-limit matrix (gpu/b4-matrix.sh).

    python3 torch_work.py <seconds> <workload>...

Workloads, run one after the other in this process:
    mm<n>   bf16 n x n matmuls back to back (mm2048 ~ tens of us, mm8192 ~ 1.6 ms
            per kernel on an H200)
    mlp     a launch-bound training loop: a small MLP (3 layers of 512, batch 64),
            Adam, loss.item() every step

For each, prints "<workload> rate=<steps per second>" over <seconds> after a warm-up,
from a synchronize to a synchronize, and that interval's start and end (t0_us, t1_us:
microseconds since the epoch, for NVML's utilisation samples).
"""
import sys
import time

import torch


def run(step, seconds, warm=0.5):
    t = time.monotonic()
    while time.monotonic() - t < warm:
        step()
    torch.cuda.synchronize()
    n = 0
    e0 = int(time.time() * 1e6)
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        step()
        n += 1
    torch.cuda.synchronize()
    return n / (time.monotonic() - t0), e0, int(time.time() * 1e6)


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
    for w in sys.argv[2:]:
        step = mlp() if w == "mlp" else matmul(int(w[2:]))
        rate, e0, e1 = run(step, seconds)
        print(f"{w} rate={rate:.3f} t0_us={e0} t1_us={e1}", flush=True)


if __name__ == "__main__":
    main()
