# SPDX-License-Identifier: Apache-2.0
"""PyTorch workloads of the B4 compute-limit matrix (gpu/b4-matrix.sh).

    python3 torch_work.py <seconds> <workload>...

Workloads, run one after the other in this process:
    mm<n>   bf16 n x n matmuls back to back (mm2048 ~ tens of us, mm8192 ~ 1.6 ms
            per kernel on an H200)
    mlp     a launch-bound training loop: a small MLP (3 layers of 512, batch 64),
            Adam, loss.item() every step
    attn    a transformer's attention training step: scaled_dot_product_attention
            (flash kernels, bf16, causal, batch 8 x 16 heads x 2048 x 64) forward
            and backward, loss.item() every step: a few long kernels among short ones
    convnet a small mixed-precision convnet training step (batch 32, 3 x 64 x 64,
            autocast fp16, GradScaler, SGD), loss.item() every step
    llm     LLM-inference-like work: a prefill of 1024 tokens through 4 layers of
            1024 (long matmuls and attention), then 32 decode steps of one token
            against the cached keys and values (many short kernels), per step
    graphmix a CUDA graph of an MLP's forward replayed, then eager launches on its
            output (a loss, a backward of a small head, an update), per step
    streams two streams at once, 2048^2 bf16 matmuls on one and elementwise work
            on the other, joined every step
    polled  attn's step whose gradients go through a second stream (record_stream,
            as data-parallel training's communication stream), waited for by
            polling an event rather than a synchronize
    fusedopt a training step whose update is one fused AdamW over 134 M fp32
            parameters: the forward and backward's matmuls and elementwise kernels,
            then the optimizer's multi-tensor kernels over every parameter, its
            moments and its gradient, loss.item() every step
    loader  a data loader's step without NCCL: a batch of 64 samples in pinned host
            memory copied to the GPU one sample at a time (12 KiB copies, as a
            collate of per-sample tensors), normalised, a small MLP's forward,
            backward and SGD update, the loss and accuracy copied back every step

TESSERA_BENCH_BUSY=1 also prints, per workload, its GPU busy fractions over a further
second of steps, from torch.profiler's trace: busy=<pct>, kernel time over wall time
(kernels of several streams that overlap counted once), and held=<pct>, that and the
GPU's own gaps between back-to-back kernels (the next already queued when the one
before it ended), the GPU time the workload holds and a cap's share is measured
against (busy(), below), and prate=<steps per second> the profiled steps ran at. The
profiler slows launches, also those of the workloads after it in the same process:
measure rates in a process without it, and carry a fraction over to that rate as GPU
time per step (held / prate).
TESSERA_BENCH_KERNELS=1 prints the profiler's kernels instead, one line each
("kernel count=<per step> mean_us=<mean> name=<name>", the longest in all first), for
setting beside what the hook charged them (gpu/pace-trace.sh).

For each, prints "<workload> rate=<steps per second>" over <seconds> after a warm-up,
from a synchronize to a synchronize, the process's CPU time per step (cpu_us, all its
threads), and that interval's start and end (t0_us, t1_us: microseconds since the
epoch, for NVML's utilisation samples).

TESSERA_BENCH_PHASES=<share-file>:<cap>:<rounds>[:<settle-seconds>] measures each
workload capped and unpaced in this one process, in <rounds> rounds of two phases of
<seconds> each, the order turned each round: before a phase it writes the node agent's
unreserved-share file (api/shares.go's format) with share <cap> or 100 (not paced) and
steps <settle-seconds> (0.25) unmeasured, for the hook of a container granted no cores
to re-read it and its allowance to settle. Prints "<workload> phases cap=<cap>
unpaced=<rate>/... capped=<rate>/..." (one rate a round) and rate_u, rate_c (all
steps over all measured seconds of each kind), and where pynvml is there nvml_u,
nvml_c: NVML's GPU utilisation over each kind's phases (the samples wholly inside
them). A host-bound step's speed moves from
one process to the next by more than a verdict's margin; within one process it is
the same host on both sides of the comparison.

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
    e0 = int(time.time() * 1e6)
    c0 = time.process_time()
    n, wall = measure(step, seconds)
    cpu_us = (time.process_time() - c0) * 1e6 / max(n, 1)
    return n / wall, cpu_us, e0, int(time.time() * 1e6)


def write_share(path, share):
    """The node agent's share file (api/shares.go, version 1), replaced atomically."""
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(f"version 1\nreserved {100 - share}\ncontainers 1\nshare {share}\nphase 0\n")
    os.replace(tmp, path)


def measure(step, seconds):
    """Steps for <seconds> from a synchronize to a synchronize: (steps, wall seconds)."""
    torch.cuda.synchronize()
    n = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        step()
        n += 1
    torch.cuda.synchronize()
    return n, time.monotonic() - t0


class Util:
    """NVML's GPU utilisation samples (the share of each sample period in which a kernel
    ran) of GPU 0 between two instants, where pynvml is there: alone on the GPU, a
    process's own busy time, read beside the GPU time its rate gives."""

    def __init__(self):
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml, self.h = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:
            self.nvml = None

    def mean(self, t0_us, t1_us):
        """The samples whose period lies within [t0_us, t1_us] (a period is 1/6 s to
        1 s: those ending in the first 170 ms may reach back before t0_us)."""
        if self.nvml is None:
            return []
        try:
            _, got = self.nvml.nvmlDeviceGetSamples(self.h, self.nvml.NVML_GPU_UTILIZATION_SAMPLES, t0_us)
        except Exception:
            return []
        return [x.sampleValue.uiVal for x in got if t0_us + 170000 <= x.timeStamp <= t1_us]


def phases(step, seconds, spec):
    """TESSERA_BENCH_PHASES: capped and unpaced phases in turn, in this process."""
    parts = spec.split(":")
    path, cap, rounds = parts[0], int(parts[1]), int(parts[2])
    if not 1 <= cap < 100 or rounds < 1:
        raise ValueError(f"TESSERA_BENCH_PHASES={spec}: want a cap of 1 to 99 and a round or more")
    settle = float(parts[3]) if len(parts) > 3 else 0.25
    got = {cap: [], 100: []}
    util, busy = Util(), {cap: [], 100: []}
    for r in range(rounds):
        for share in ((cap, 100) if r % 2 == 0 else (100, cap)):
            write_share(path, share)
            t = time.monotonic()
            while time.monotonic() - t < settle:
                step()
            t0_us = int(time.time() * 1e6)
            got[share].append(measure(step, seconds))
            busy[share] += util.mean(t0_us, int(time.time() * 1e6))
    write_share(path, 100)

    def rates(k):
        return "/".join(f"{n / t:.3f}" for n, t in got[k])

    def total(k):
        return sum(n for n, _ in got[k]) / sum(t for _, t in got[k])

    nvml = "".join(f" nvml_{k}={sum(busy[v]) / len(busy[v]):.1f}" for k, v in (("u", 100), ("c", cap)) if busy[v])
    return (f"phases cap={cap} unpaced={rates(100)} capped={rates(cap)} rate_u={total(100):.3f} "
            f"rate_c={total(cap):.3f}{nvml}")


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


def attention():
    """attn's tensors and its forward and backward, which return the loss."""
    torch.manual_seed(0)
    shape = (8, 16, 2048, 64)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))

    def fwd_bwd():
        for t in (q, k, v):
            t.grad = None
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        loss = out.float().square().mean()
        loss.backward()
        return loss

    return (q, k, v), fwd_bwd


def attn():
    _, fwd_bwd = attention()

    def step():
        fwd_bwd().item()

    return step


def convnet():
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(128, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda")
    x = torch.randn(32, 3, 64, 64, device="cuda")
    y = torch.randint(0, 10, (32,), device="cuda")
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        loss.item()

    return step


def llm():
    torch.manual_seed(0)
    d, heads, layers, batch, prompt, decode = 1024, 16, 4, 4, 1024, 32
    hd = d // heads
    w = [(torch.randn(d, 3 * d, device="cuda", dtype=torch.bfloat16) * 0.02,
          torch.randn(d, d, device="cuda", dtype=torch.bfloat16) * 0.02,
          torch.randn(d, 4 * d, device="cuda", dtype=torch.bfloat16) * 0.02,
          torch.randn(4 * d, d, device="cuda", dtype=torch.bfloat16) * 0.02) for _ in range(layers)]
    x0 = torch.randn(batch, prompt, d, device="cuda", dtype=torch.bfloat16)
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def layer(x, wl, cache, causal):
        b, t, _ = x.shape
        q, k, v = (x @ wl[0]).view(b, t, 3, heads, hd).permute(2, 0, 3, 1, 4)
        if cache is not None:
            k = torch.cat([cache[0], k], dim=2)
            v = torch.cat([cache[1], v], dim=2)
        a = sdpa(q, k, v, is_causal=causal).transpose(1, 2).reshape(b, t, d)
        x = x + a @ wl[1]
        x = x + torch.nn.functional.gelu(x @ wl[2]) @ wl[3]
        return x, (k, v)

    @torch.no_grad()
    def step():
        x, caches = x0, []
        for wl in w:  # prefill: long kernels
            x, c = layer(x, wl, None, True)
            caches.append(c)
        tok = x[:, -1:, :]
        for _ in range(decode):  # decode: one token at a time, many short kernels
            for i, wl in enumerate(w):
                tok, caches[i] = layer(tok, wl, caches[i], False)
        tok.float().sum().item()

    return step


def graphmix(replay=None):
    """The graph + eager step; replay, where given, is called with the graph's replay
    in its place (replay_lead.py times the replay with it)."""
    torch.manual_seed(0)
    nn = torch.nn
    body = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024), nn.GELU(),
                         nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).cuda().half()
    head = nn.Linear(1024, 10).cuda()
    opt = torch.optim.SGD(head.parameters(), lr=0.01)
    x = torch.randn(256, 1024, device="cuda", dtype=torch.half)
    y = torch.randint(0, 10, (256,), device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(3):
            body(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g), torch.no_grad():
        feat = body(x)

    def step():
        if replay is None:
            g.replay()  # the graph, then eager launches on its output
        else:
            replay(g.replay)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(head(feat.float()), y)
        loss.backward()
        opt.step()
        loss.item()

    return step


def streams():
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(2048, 2048, device="cuda", dtype=torch.bfloat16)
    e = torch.randn(16, 1 << 20, device="cuda")
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    main = torch.cuda.current_stream()

    def step():
        s1.wait_stream(main)
        s2.wait_stream(main)
        with torch.cuda.stream(s1):
            for _ in range(4):
                torch.mm(a, b, out=c)
        with torch.cuda.stream(s2):
            for _ in range(8):
                e.mul_(1.0001).add_(1e-4)
        main.wait_stream(s1)
        main.wait_stream(s2)

    return step


def polled():
    """attn's step with its gradients handed to a second stream (record_stream, as
    data-parallel training hands them to its communication stream: the caching
    allocator then queries an event at its allocations), waited for by polling an
    event, as TensorFlow's event manager and XLA's host callbacks wait, not by a
    synchronize."""
    params, fwd_bwd = attention()
    side, main = torch.cuda.Stream(), torch.cuda.current_stream()
    done = torch.cuda.Event()
    sums = []

    def step():
        fwd_bwd()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            for t in params:
                g = t.grad.float()  # allocated on the side stream
                g.record_stream(main)
                sums.append(g.norm())
        main.wait_stream(side)
        done.record(main)
        while not done.query():
            time.sleep(0)
        sums.clear()

    return step


def fusedopt():
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(*(m for _ in range(4) for m in (nn.Linear(2048, 8192), nn.GELU(), nn.Linear(8192, 2048)))).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x = torch.randn(128, 2048, device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        loss.item()

    return step


def loader():
    torch.manual_seed(0)
    nn = torch.nn
    batch = 64
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 1024), nn.ReLU(), nn.Linear(1024, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    samples = [torch.randn(3, 32, 32).pin_memory() for _ in range(batch)]
    labels = torch.randint(0, 10, (batch,)).pin_memory()
    xb = torch.empty(batch, 3, 32, 32, device="cuda")
    mean = torch.full((1, 3, 1, 1), 0.5, device="cuda")

    def step():
        for i, sample in enumerate(samples):
            xb[i].copy_(sample, non_blocking=True)
        y = labels.to("cuda", non_blocking=True)
        opt.zero_grad(set_to_none=True)
        out = model((xb - mean) / 0.25)
        loss = nn.functional.cross_entropy(out, y)
        loss.backward()
        opt.step()
        torch.stack([loss.detach(), (out.argmax(1) == y).float().mean()]).cpu()

    return step


WORKLOADS = {"mlp": mlp, "attn": attn, "convnet": convnet, "llm": llm, "graphmix": graphmix, "streams": streams,
             "polled": polled, "fusedopt": fusedopt, "loader": loader}


def busy(step, seconds=1.0):
    """The GPU's busy fractions over seconds of steps, from the profiler's trace, in
    percent of wall time, and the steps per second the profiled steps ran at: (kernel,
    held, rate). kernel is the time the workload's kernels,
    copies and memsets ran (those that overlap, on several streams, counted once); held
    adds the gaps between one and the next that the GPU spent going from one to the
    other with the next already queued (launched before the one before it ended): the
    GPU's own time between back-to-back kernels, one to a few microseconds each, in
    which it runs no other context's work either. A gap in which the GPU waited for the
    host (the next was launched after the one before it ended) is idle in both. The
    profiler's own cost per launch slows a step whose host keeps only a little ahead of
    its GPU (the attention step on an H100): its fractions are then those of a slower
    program, and the GPU time per step (a fraction over the rate) is what carries over
    to the unprofiled one; it too is low by the queued gaps the profiler turned into
    waits for the host."""
    import json
    import tempfile
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    n = 0
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            step()
            n += 1
        torch.cuda.synchronize()
        wall = time.monotonic() - t0
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        with open(f.name) as r:
            trace = json.load(r)
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    kernel, held = busy_of(events, wall)
    return kernel, held, n / wall


def busy_of(events, wall):
    """(kernel, held) of a chrome trace's events over wall seconds (busy, above). A gap
    whose next kernel has no launch in the trace (a launch path the profiler does not
    trace) is held if it is shorter than the GPU took, anywhere in the trace, to start a
    kernel launched onto an idle GPU: the GPU cannot have waited for a host that launched
    after the kernel before it ended in less."""
    launched = {}
    spans = []
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        corr = (e.get("args") or {}).get("correlation")
        cat = e.get("cat", "")
        if cat in ("cuda_runtime", "cuda_driver") and corr is not None:
            launched[corr] = float(e["ts"]) + float(e["dur"])
        elif cat in ("kernel", "gpu_memcpy", "gpu_memset") and float(e["dur"]) > 0:
            spans.append((float(e["ts"]), float(e["ts"]) + float(e["dur"]), corr))
    spans.sort()
    kernel = held = 0.0
    end = float("-inf")
    latency = float("inf")  # the shortest start of a kernel launched onto an idle GPU
    unknown = []  # gaps whose next kernel's launch is not in the trace
    for a, b, corr in spans:
        if b <= end:
            continue
        if a > end > float("-inf"):
            at = launched.get(corr)
            if at is None:
                unknown.append(a - end)
            elif at <= end:
                held += a - end
            else:
                latency = min(latency, a - at)
        kernel += b - max(a, end)
        end = b
    held += sum(g for g in unknown if g < latency)
    if spans and not launched:
        print("busy: the profiler's trace has no launches; held is the kernel time", file=sys.stderr)
    elif unknown:
        print(f"busy: {len(unknown)} gaps before kernels without their launch in the trace; held where shorter "
              f"than the idle GPU's start, {latency:.1f} us", file=sys.stderr)
    return 100.0 * kernel / 1e6 / wall, 100.0 * (kernel + held) / 1e6 / wall


def kernels(w, step, seconds=1.0):
    """The profiler's kernels of seconds of steps, by name: launches per step and mean
    duration."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    n = 0
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            step()
            n += 1
        torch.cuda.synchronize()
        wall = time.monotonic() - t0
    by = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start:
            c, t = by.get(e.name, (0, 0.0))
            by[e.name] = (c + 1, t + e.time_range.end - e.time_range.start)
    total = sum(t for _, t in by.values())
    print(f"{w} steps={n} wall_s={wall:.3f} kernels_per_step={sum(c for c, _ in by.values()) / n:.1f} "
          f"kernel_us_per_step={total / n:.1f}", flush=True)
    for name, (c, t) in sorted(by.items(), key=lambda x: -x[1][1]):
        print(f"kernel count={c / n:.2f} mean_us={t / c:.2f} name={name}", flush=True)


def main():
    seconds = float(sys.argv[1])
    for k, w in enumerate(sys.argv[2:]):
        step = WORKLOADS[w]() if w in WORKLOADS else matmul(int(w[2:]))
        if os.environ.get("TESSERA_BENCH_KERNELS"):
            for _ in range(20):
                step()
            kernels(w, step, seconds)
            continue
        if os.environ.get("TESSERA_BENCH_PHASES"):
            t = time.monotonic()
            while time.monotonic() - t < 0.5:
                step()
            print(f"{w} {phases(step, seconds, os.environ['TESSERA_BENCH_PHASES'])}", flush=True)
            continue
        rate, cpu_us, e0, e1 = run(step, seconds, k)
        extra = ""
        if os.environ.get("TESSERA_BENCH_BUSY"):
            kernel, held, prate = busy(step)
            extra = f" busy={kernel:.1f} held={held:.1f} prate={prate:.3f}"
        print(f"{w} rate={rate:.3f} cpu_us={cpu_us:.1f} t0_us={e0} t1_us={e1}{extra}", flush=True)


if __name__ == "__main__":
    main()
