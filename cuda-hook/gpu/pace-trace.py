# SPDX-License-Identifier: Apache-2.0
"""Sets what the diagnostic hook charged each kernel beside what the profiler says it
takes (gpu/pace-trace.sh's results):

    python3 pace-trace.py <trace-dir> [<workload>...]

For each workload's traces (<w>.<cap>.<charge>.trace) and its profiler listing
(<w>.kernels), per kernel name: launches a step and mean duration from the profiler;
charged per launch, the mean of its samples as folded (after the host gap of an idle
stream was set aside), their minimum, and the share of its samples that found the
stream idle, from the trace. Then the step's whole: kernel time a step from the
profiler against what its launches were charged, the charge ratio that says how much
more (or less) than its GPU time a cap holds the workload to."""
import collections
import glob
import os
import re
import subprocess
import sys


def demangle(names):
    """The trace holds the driver's (mangled) names, the profiler demangled ones."""
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
        return dict(zip(names, out))
    except OSError:
        return {n: n for n in names}


def norm(name):
    return re.sub(r"\s+", "", name)


def profiler(path):
    head, rows = {}, {}
    for line in open(path):
        if line.startswith("kernel "):
            m = re.match(r"kernel count=(\S+) mean_us=(\S+) name=(.*)", line.rstrip("\n"))
            rows[m.group(3)] = (float(m.group(1)), float(m.group(2)))
        elif "steps=" in line:
            head = dict(kv.split("=", 1) for kv in line.split()[1:])
    return head, rows


def trace(path):
    rows = collections.defaultdict(lambda: collections.Counter())
    mins = {}
    for line in open(path):
        if line.startswith("#"):
            continue
        f = line.rstrip("\n").split(" ", 14)
        name = f[14]
        r = rows[name]
        for k, v in zip("launches charged samples idle raw gap folded".split(), f[2:9]):
            r[k] += int(v)
        r["met"] += int(f[12])
        mn = int(f[9])
        if mn > 0:
            mins[name] = min(mins.get(name, mn), mn)
    dm = demangle(list(rows))
    return ({norm(dm[n]): r for n, r in rows.items()}, {norm(dm[n]): m for n, m in mins.items()})


def short(name, n=60):
    return name if len(name) <= n else name[: n - 3] + "..."


def main():
    d = sys.argv[1]
    works = sys.argv[2:] or sorted({os.path.basename(p).split(".")[0] for p in glob.glob(f"{d}/*.kernels")})
    for w in works:
        head, prof = profiler(f"{d}/{w}.kernels")
        per_step_us = sum(c * m for c, m in prof.values())
        print(f"== {w}: profiler {head.get('kernels_per_step')} kernels, {per_step_us:.1f} us of kernels a step")
        for tp in sorted(glob.glob(f"{d}/{w}.*.trace")):
            rows, mins = trace(tp)
            charged_step = matched = 0.0
            out = []
            for name, (c, m) in prof.items():
                r = rows.get(norm(name))
                if not r or r["launches"] == 0:
                    continue
                cpl = r["charged"] / r["launches"] / 1000
                charged_step += c * cpl
                matched += c * m
                sm = r["samples"] - r["met"]
                out.append((c * cpl - c * m, name, c, m, cpl, r["folded"] / sm / 1000 if sm else 0,
                            mins.get(norm(name), 0) / 1000, r["idle"] / r["samples"] if r["samples"] else 0, r["samples"]))
            graph = sum(r["charged"] for n, r in rows.items() if n.startswith("(graph"))
            nohandle = sum(r["charged"] for n, r in rows.items() if n.startswith("(no"))
            print(f"-- {os.path.basename(tp)}: charged {charged_step:.1f} us a step for {matched:.1f} us of kernels "
                  f"matched by name (ratio {charged_step / matched if matched else 0:.2f}); graphs charged "
                  f"{graph / 1e6:.1f} ms, launches without a handle {nohandle / 1e6:.1f} ms in all")
            print(f"   {'excess us/step':>14} {'n/step':>7} {'prof us':>8} {'charged':>8} {'sampled':>8} {'min':>7} {'idle':>5} {'samples':>7}  name")
            for ex, name, c, m, cpl, sm, mn, idle, ns in sorted(out, reverse=True)[:25]:
                print(f"   {ex:14.1f} {c:7.2f} {m:8.2f} {cpl:8.2f} {sm:8.2f} {mn:7.2f} {idle:5.2f} {ns:7d}  {short(name)}")


if __name__ == "__main__":
    main()
