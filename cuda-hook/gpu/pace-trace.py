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
more (or less) than its GPU time a cap holds the workload to; first over the kernels
matched by their whole name, then over every launch (steps counted by the profiler's
kernels a step), with each function's share, its template instances pooled (the
trace's mangled names are cut short, and most of a PyTorch step's kernels match by
no whole name)."""
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
    return ({norm(dm[n]): r for n, r in rows.items()}, {norm(dm[n]): m for n, m in mins.items()}, rows)


def base(name):
    """A kernel's function without its template arguments, from either kind of name:
    the trace's mangled names are cut short (c++filt then leaves them as they are), so
    the nested name's parts are read from the front (_ZN2at6native29vectorized_...
    gives at::native::vectorized_...); a demangled one is cut at its arguments."""
    if name.startswith("_ZN") or name.startswith("_Z"):
        i, parts = (3 if name.startswith("_ZN") else 2), []
        while i < len(name) and name[i].isdigit():
            j = i
            while j < len(name) and name[j].isdigit():
                j += 1
            n = int(name[i:j])
            part = name[j:j + n]
            parts.append("{anon}" if part.startswith("_GLOBAL__N") else part)
            i = j + n
            if not name.startswith("_ZN"):
                break
        return "::".join(parts) if parts else name
    name = name.strip().replace("(anonymous namespace)", "{anon}")
    name = re.sub(r"^(void|[\w:]+)\s+(?=[\w:{}]+[<(])", "", name)
    return re.split(r"[<(]", name, 1)[0]


def pooled(prof, raw, per_step):
    """Per function (templates pooled), the profiler's kernel time a step against what
    the trace's launches of it were charged a step, over every kernel both name."""
    p = collections.Counter()
    for name, (c, m) in prof.items():
        p[base(name)] += c * m
    t = collections.Counter()
    for name, r in raw.items():
        f = base(name)
        # The trace cuts a long plain name short: the profiler's name it begins.
        if f not in p:
            f = next((g for g in p if len(f) >= 64 and g.startswith(f)), f)
        t[f] += r["charged"] / 1000 / per_step
    return p, t


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
            rows, mins, raw = trace(tp)
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
            kps = float(head.get("kernels_per_step", 0) or 0)
            launches = sum(r["launches"] for r in raw.values())
            if kps > 0 and launches > 0:
                steps = launches / kps
                p, t = pooled(prof, raw, steps)
                both = [f for f in p if f in t]
                cb, pb = sum(t[f] for f in both), sum(p[f] for f in both)
                print(f"   whole step ({steps:.1f} steps by launches): charged {sum(t.values()):.1f} us a step against "
                      f"{per_step_us:.1f} us of kernels (ratio {sum(t.values()) / per_step_us:.2f}); by function, "
                      f"templates pooled, {len(both)} named by both: {cb:.1f} against {pb:.1f} (ratio {cb / pb if pb else 0:.2f})")
                print(f"   {'excess us/step':>14} {'prof us':>9} {'charged':>9}  function")
                for f in sorted(both, key=lambda f: p[f] - t[f])[:12]:
                    print(f"   {t[f] - p[f]:14.1f} {p[f]:9.1f} {t[f]:9.1f}  {short(f)}")


if __name__ == "__main__":
    main()
