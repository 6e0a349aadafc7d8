# SPDX-License-Identifier: Apache-2.0
"""What an event pair around a CUDA-graph replay reads, by what comes before its start.

  replay_lead.py <seconds>

Steps of torch_work.py's graph + eager workload (an MLP's forward captured in a graph
and replayed, then eager launches on its output and a loss.item() that waits for the
step), the replay timed by an event pair in four ways, turned step by step:

  idle      the start event first on the drained stream (as a hook's launch sample
            records it where the step begins after its host waited)
  kernel    the start event behind a 20 us kernel of the program's (torch.cuda._sleep)
  memset    the start event behind a 4-byte cuMemsetD32Async of a word of the
            program's (what the hook does before a graph launch's sample)
  host-word the start event behind a cuStreamWaitValue32 on a pinned word that the
            host sets once the replay is launched (the stream held until then)

Prints, per way, the replays' mean, 10th percentile, median and 90th percentile in us.
Run it alone, then two at once (a pair on one time-sliced GPU):

  python3 replay_lead.py 3
  python3 replay_lead.py 3 & python3 replay_lead.py 3; wait

It measures and reports; it asserts nothing. Without the hook (the readings are the
driver's); the hook's own samples are set beside them by gpu/pace-trace.sh.
"""
import ctypes
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_work  # noqa: E402


def main():
    secs = float(sys.argv[1]) if len(sys.argv) > 1 else 3
    cu = ctypes.CDLL("libcuda.so.1")
    cu.cuMemsetD32Async.argtypes = [ctypes.c_uint64, ctypes.c_uint32, ctypes.c_size_t, ctypes.c_void_p]
    # cuda.h's cuStreamWaitValue32 is the _v2 entry point; the unsuffixed one needs
    # the older stream memory operations, which drivers turn off by default.
    cu.cuStreamWaitValue32_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
    word = torch.zeros(16, dtype=torch.int32, device="cuda")
    pinned = torch.zeros(16, dtype=torch.int32).pin_memory()
    host_word = (ctypes.c_uint32 * 1).from_address(pinned.data_ptr())

    ways = ["idle", "kernel", "memset", "host-word"]
    start = [torch.cuda.Event(enable_timing=True) for _ in ways]
    end = [torch.cuda.Event(enable_timing=True) for _ in ways]
    reads = [[] for _ in ways]
    way = [0]
    released = [0]

    def timed(replay):
        stream = torch.cuda.current_stream().cuda_stream
        name = ways[way[0]]
        if name == "kernel":
            torch.cuda._sleep(20000)
        elif name == "memset":
            rc = cu.cuMemsetD32Async(word.data_ptr(), 0, 1, stream)
            if rc != 0:
                sys.exit("cuMemsetD32Async: %d" % rc)
        elif name == "host-word":
            released[0] += 1
            rc = cu.cuStreamWaitValue32_v2(stream, pinned.data_ptr(), released[0], 0)  # CU_STREAM_WAIT_VALUE_GEQ
            if rc != 0:
                sys.exit("cuStreamWaitValue32_v2: %d" % rc)
        start[way[0]].record()
        replay()
        end[way[0]].record()
        if name == "host-word":
            host_word[0] = released[0]

    step = torch_work.graphmix(timed)
    i = 0
    t0 = time.time()
    stop = t0 + 1 + secs
    while time.time() < stop:
        way[0] = i % len(ways)
        step()  # ends with loss.item(): the step's work has run
        if time.time() - t0 > 1:  # past a second of warm-up
            reads[way[0]].append(start[way[0]].elapsed_time(end[way[0]]) * 1000)
        i += 1
    for w, name in enumerate(ways):
        r = sorted(reads[w])
        n = len(r)
        if n == 0:
            continue
        print("replay %-9s n=%5d mean %7.1f p10 %7.1f median %7.1f p90 %7.1f us" % (
            name, n, sum(r) / n, r[n // 10], r[n // 2], r[n * 9 // 10]))
    print("steps/s %.1f" % (i / (time.time() - t0)))


if __name__ == "__main__":
    main()
