// SPDX-License-Identifier: Apache-2.0

package watchdog

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tessera-dev/tessera/node-agent/checkpoint"
	"github.com/tessera-dev/tessera/node-agent/gpu"
)

// Attribution by device files. NVML names the PID that created the memory's CUDA
// context; that PID may be gone while the memory lives on (the driver frees it when
// the last descriptor of the context's device files closes, and descriptors can be
// inherited or passed over a Unix socket), it may be a PID of another PID namespace,
// or it may be a process in a container the agent bound no GPU to (a sidecar that was
// handed the descriptors: the device cgroup is checked only at open). Memory NVML
// lists for such a PID is charged by who holds the GPU's device files open now: the
// live processes whose /proc/<pid>/fd leads to the GPU's character device (major 195,
// the GPU's minor), or to /dev/nvidiactl (195:255) without any GPU's file (an RM
// client detached from its device file still keeps its memory). Each holder is mapped
// to a container through its cgroup: a bound container, or another container of the
// pod of a bound one (its cgroup lies beside the bound container's, under the pod's).
// Holders outside the pods the agent bound GPUs to (the agent's own MPS servers, host
// tools, other vendors' pods) are never acted on.

// nvidiaMajor is the character-device major of /dev/nvidia<N> and /dev/nvidiactl.
const nvidiaMajor = 195

// nvidiactlMinor is /dev/nvidiactl's minor number.
const nvidiactlMinor = 255

// holder is a live process with an NVIDIA device file open.
type holder struct {
	pid    int
	cgroup string
	// minors are the GPU device files (195:N, N < 255) it holds; ctl is /dev/nvidiactl.
	minors []int
	ctl    bool
}

// holdsGPU reports whether h keeps memory of the GPU with that minor number alive.
func (h holder) holdsGPU(minor int) bool {
	return slices.Contains(h.minors, minor) || h.ctl && len(h.minors) == 0
}

// charDev returns the major and minor numbers of the character device that path
// (a /proc/<pid>/fd link) leads to. Matching the device numbers, not the link's text,
// keeps a device node made elsewhere with mknod from hiding.
func charDev(path string) (major, minor uint32, ok bool) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR {
		return 0, 0, false
	}
	return unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev)), true
}

// scanHolders reads every process's open descriptors under procRoot and returns the
// processes that hold an NVIDIA device file. Its cost is one readlink per descriptor
// (and a stat for those that name a path), so the watchdog runs it only in a pass
// that found memory it could not attribute by PID.
func scanHolders(procRoot string, devOf func(string) (uint32, uint32, bool)) []holder {
	ents, err := os.ReadDir(procRoot)
	if err != nil {
		return nil
	}
	var out []holder
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		fdDir := filepath.Join(procRoot, e.Name(), "fd")
		fds, err := os.ReadDir(fdDir)
		if err != nil {
			continue // exited, or a kernel thread
		}
		h := holder{pid: pid}
		for _, fd := range fds {
			p := filepath.Join(fdDir, fd.Name())
			target, err := os.Readlink(p)
			// Sockets, pipes and anonymous inodes read "socket:[…]", "pipe:[…]",
			// "anon_inode:…": only a path can be a device file.
			if err != nil || !strings.HasPrefix(target, "/") {
				continue
			}
			major, minor, ok := devOf(p)
			if !ok || major != nvidiaMajor {
				continue
			}
			switch {
			case minor == nvidiactlMinor:
				h.ctl = true
			case minor < nvidiactlMinor-1 && !slices.Contains(h.minors, int(minor)): // 254 is nvidia-modeset
				h.minors = append(h.minors, int(minor))
			}
		}
		if len(h.minors) == 0 && !h.ctl {
			continue
		}
		if h.cgroup, err = CgroupOf(procRoot, pid); err != nil {
			continue
		}
		out = append(out, h)
	}
	return out
}

// podContainer maps a cgroup that is no bound container's to a container of the pod
// of a bound record: the record's pod cgroup (the parent of its container cgroup)
// holds cg, and the container is cg's first component below the pod's. The record it
// returns names that container by its cgroup and carries no grant: every MiB it holds
// on a GPU is over its limit.
func podContainer(recs []checkpoint.Record, cg string) (checkpoint.Record, bool) {
	for _, r := range recs {
		if r.Cgroup == "" || r.Cgroup == "/" {
			continue
		}
		pod := filepath.Dir(r.Cgroup)
		if pod == "/" || pod == "." || !holds(pod, cg) {
			continue
		}
		podName := filepath.Base(pod)
		parts := strings.Split(cg, "/")
		ccg := ""
		for i, p := range parts {
			if p == podName {
				ccg = strings.Join(parts[:min(i+2, len(parts))], "/")
				break
			}
		}
		if ccg == "" {
			// cg is below the pod but its components do not show the pod's name:
			// not a layout the agent knows.
			continue
		}
		return checkpoint.Record{ContainerID: "cgroup:" + ccg, PodUID: r.PodUID, Namespace: r.Namespace, Pod: r.Pod,
			Container: "(no GPU grant) " + filepath.Base(ccg), Cgroup: ccg}, true
	}
	return checkpoint.Record{}, false
}

// cgroupProcs lists the live processes whose cgroup is cg or below it.
func cgroupProcs(procRoot, cg string) []int {
	ents, err := os.ReadDir(procRoot)
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		if c, err := CgroupOf(procRoot, pid); err == nil && holds(cg, c) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// fileCharge is memory charged to a container by byDeviceFiles: a whole NVML process
// (process set) or an amount held through the device files by pids.
type fileCharge struct {
	rec     checkpoint.Record
	process *gpu.ProcessUsage
	gpu     string
	mib     int64
	pids    []int
}

// byDeviceFiles attributes the memory of pending, the processes NVML lists that are
// in no bound container, and records in s (and why) what stays unattributed.
//
// A pending process that is alive and holds the GPU's device file is the holder of
// its memory: charged to its container when that is a container of a bound pod, left
// unattributed otherwise. The memory of the others (gone, or a PID of another PID
// namespace that names some unrelated process here) is charged, per GPU, to the
// containers whose processes hold the GPU's device files without being listed by
// NVML there: to every such container that has no GPU grant at all (it has no
// business holding a GPU's file), otherwise to the only such container if there is
// one. When several containers with grants hold the files, the memory cannot be told
// apart and stays unattributed.
func (w *Watchdog) byDeviceFiles(all, pending []gpu.ProcessUsage, recs, claims []checkpoint.Record, self string, s *Sample, why map[string][]string) []fileCharge {
	minors := map[string]int{}
	if devs, err := w.cfg.Devices(); err == nil {
		for _, d := range devs {
			if d.Minor >= 0 {
				minors[d.UUID] = d.Minor
			}
		}
	} else {
		w.cfg.Log.Error(err, "listing the GPUs' device minor numbers; memory of unknown processes stays unattributed")
	}
	holders := scanHolders(w.cfg.ProcRoot, w.devOf)
	byPID := map[int]holder{}
	for _, h := range holders {
		byPID[h.pid] = h
	}
	listed := map[string]map[int]bool{}
	for _, p := range all {
		if listed[p.GPUUUID] == nil {
			listed[p.GPUUUID] = map[int]bool{}
		}
		listed[p.GPUUUID][p.PID] = true
	}
	var out []fileCharge
	unresolved := map[string]int64{}
	gone := map[string][]string{}
	for i := range pending {
		p := pending[i]
		minor, known := minors[p.GPUUUID]
		h, alive := byPID[p.PID]
		if alive && (!known || h.holdsGPU(minor)) {
			if rec, ok := podContainer(recs, h.cgroup); ok {
				out = append(out, fileCharge{rec: rec, process: &p})
				continue
			}
			s.Unattributed[p.GPUUUID] += p.UsedMemoryMiB
			why[p.GPUUUID] = append(why[p.GPUUUID], fmt.Sprintf("PID %d in cgroup %s, not a container of a pod the agent bound a GPU to (%d MiB)",
				p.PID, h.cgroup, p.UsedMemoryMiB))
			continue
		}
		if !known {
			s.Unattributed[p.GPUUUID] += p.UsedMemoryMiB
			why[p.GPUUUID] = append(why[p.GPUUUID], fmt.Sprintf("PID %d, no live process here holding the GPU's files, and the GPU's device minor number is unknown (%d MiB)",
				p.PID, p.UsedMemoryMiB))
			continue
		}
		unresolved[p.GPUUUID] += p.UsedMemoryMiB
		gone[p.GPUUUID] = append(gone[p.GPUUUID], strconv.Itoa(p.PID))
	}
	gpus := make([]string, 0, len(unresolved))
	for g := range unresolved {
		gpus = append(gpus, g)
	}
	sort.Strings(gpus)
	for _, g := range gpus {
		mib, minor := unresolved[g], minors[g]
		type group struct {
			rec  checkpoint.Record
			pids []int
		}
		groups := map[string]*group{}
		var ids, outside []string
		for _, h := range holders {
			if !h.holdsGPU(minor) || listed[g][h.pid] || self != "" && h.cgroup == self {
				continue
			}
			rec, ok := owner(recs, h.cgroup)
			if !ok {
				rec, ok = podContainer(recs, h.cgroup)
			}
			if !ok {
				rec, ok = claimOf(w.cfg.ProcRoot, h.pid, claims)
			}
			if !ok {
				outside = append(outside, fmt.Sprintf("PID %d in %s", h.pid, h.cgroup))
				continue
			}
			gr := groups[rec.ContainerID]
			if gr == nil {
				gr = &group{rec: rec}
				groups[rec.ContainerID] = gr
				ids = append(ids, rec.ContainerID)
			}
			gr.pids = append(gr.pids, h.pid)
		}
		sort.Strings(ids)
		var charged []string
		for _, id := range ids {
			if len(groups[id].rec.Devices) == 0 {
				charged = append(charged, id)
			}
		}
		if len(charged) == 0 && len(ids) == 1 && len(outside) == 0 {
			charged = ids
		}
		what := fmt.Sprintf("PIDs %s (gone, or of another PID namespace) hold %d MiB", strings.Join(gone[g], ","), mib)
		if len(charged) == 0 {
			s.Unattributed[g] += mib
			names := make([]string, 0, len(ids)+len(outside))
			for _, id := range ids {
				names = append(names, groups[id].rec.Namespace+"/"+groups[id].rec.Pod+"/"+groups[id].rec.Container)
			}
			names = append(names, outside...)
			switch {
			case len(names) == 0:
				why[g] = append(why[g], what+"; no live process holds the GPU's device files")
			case len(ids) == 0:
				why[g] = append(why[g], what+"; only processes outside the pods the agent bound GPUs to hold the GPU's device files: "+strings.Join(names, ", "))
			default:
				why[g] = append(why[g], what+"; the GPU's device files are held by more than one container or process, with GPU grants or outside the bound pods: "+strings.Join(names, ", "))
			}
			continue
		}
		s.ByDeviceFiles[g] += mib
		for _, id := range charged {
			out = append(out, fileCharge{rec: groups[id].rec, gpu: g, mib: mib, pids: groups[id].pids})
		}
		w.cfg.Log.V(1).Info("memory attributed by device files", "gpu", g, "mib", mib, "pids", gone[g], "containers", charged)
	}
	return out
}

// unattributedEvents raises a Warning event on the Node for a GPU whose memory no
// container could be charged with for Grace within Window: once per episode, until a
// whole Window passes without any.
func (w *Watchdog) unattributedEvents(s *Sample, why map[string][]string, now time.Time, dur time.Duration) {
	for g, tr := range w.unattributed {
		if s.Unattributed[g] == 0 {
			if w.pruneMemory(tr, now); len(tr.over) == 0 {
				delete(w.unattributed, g)
			}
		}
	}
	gpus := make([]string, 0, len(s.Unattributed))
	for g, mib := range s.Unattributed {
		if mib > 0 {
			gpus = append(gpus, g)
		}
	}
	sort.Strings(gpus)
	for _, g := range gpus {
		tr := w.unattributed[g]
		if tr == nil {
			tr = &track{}
			w.unattributed[g] = tr
		}
		tr.over = append(tr.over, span{at: now, dur: dur})
		w.pruneMemory(tr, now)
		var total time.Duration
		for _, sp := range tr.over {
			total += sp.dur
		}
		if tr.memActed || total < w.cfg.Grace {
			continue
		}
		tr.memActed = true
		msg := fmt.Sprintf("%d MiB on GPU %s cannot be attributed to any container (for %s of the last %s): %s",
			s.Unattributed[g], g, total.Round(time.Second), w.cfg.Window, strings.Join(why[g], "; "))
		w.cfg.Log.Info("unattributed GPU memory", "gpu", g, "mib", s.Unattributed[g], "why", why[g])
		if w.cfg.NodeEvent != nil {
			w.cfg.NodeEvent("GPUMemoryUnattributed", msg)
		}
	}
}
