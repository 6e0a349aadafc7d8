// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/api"
)

// AnnotationRequirements is where the agent states, on its Node, whether the node
// meets what Tessera needs: "met", or one "<requirement>: <what is wrong>" per line.
const AnnotationRequirements = api.AnnotationRequirements

// NRI fallback policies (--nri-unavailable).
const (
	NRIUnavailableRefuse   = "refuse"
	NRIUnavailableFallback = "fallback"
)

// nriGrace is how long the NRI plugin may take to connect before the node counts as
// not meeting the NRI requirement (a runtime restart takes a few seconds).
const nriGrace = 15 * time.Second

// requirements holds what the node lacks. While anything is missing the agent
// refuses new GPU containers (fail closed): a container started without Tessera's
// binding would run without limits.
type requirements struct {
	mu    sync.Mutex
	unmet map[string]string
}

// set records a requirement's state ("" = met) and reports whether it changed.
func (r *requirements) set(name, why string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.unmet == nil {
		r.unmet = map[string]string{}
	}
	old, had := r.unmet[name]
	if why == "" {
		delete(r.unmet, name)
		return had
	}
	r.unmet[name] = why
	return !had || old != why
}

// list returns "<name>: <why>" for each unmet requirement but those named, sorted.
func (r *requirements) list(except ...string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for n, w := range r.unmet {
		if !slices.Contains(except, n) {
			out = append(out, n+": "+w)
		}
	}
	sort.Strings(out)
	return out
}

// refusal is the reason a new GPU container is refused, or "".
func (r *requirements) refusal() string { return refusalOf(r.list()) }

// bindRefusal is refusal for the binding itself: a container the binding sees came
// through NRI (which therefore works) or through the fallback socket (which does not
// use it), so the NRI requirement is not its concern.
func (r *requirements) bindRefusal() string { return refusalOf(r.list("nri")) }

func refusalOf(l []string) string {
	if len(l) == 0 {
		return ""
	}
	return "the node does not meet Tessera's requirements, so no GPU container is started on it (it would run without limits): " + strings.Join(l, "; ")
}

// cgroup filesystems' magic numbers (statfs f_type).
const (
	cgroup2Magic = unix.CGROUP2_SUPER_MAGIC
	tmpfsMagic   = unix.TMPFS_MAGIC
	cgroup1Magic = unix.CGROUP_SUPER_MAGIC
)

// cgroupMode says how the host mounts cgroups at root (/sys/fs/cgroup): "v2" (one
// unified hierarchy), "hybrid" (v1 controllers, the unified hierarchy at
// root/unified) or "v1"; statfs is unix.Statfs outside tests.
func cgroupMode(root string, statfs func(string, *unix.Statfs_t) error) (string, error) {
	var st unix.Statfs_t
	if err := statfs(root, &st); err != nil {
		return "", fmt.Errorf("reading the cgroup mount %s: %w", root, err)
	}
	switch int64(st.Type) {
	case cgroup2Magic:
		return "v2", nil
	case tmpfsMagic:
		var u unix.Statfs_t
		if err := statfs(filepath.Join(root, "unified"), &u); err == nil && int64(u.Type) == cgroup2Magic {
			return "hybrid", nil
		}
		return "v1", nil
	case cgroup1Magic:
		return "v1", nil
	}
	return "", fmt.Errorf("%s is not a cgroup mount (filesystem type %#x)", root, st.Type)
}

// checkCgroup returns what is wrong with the host's cgroups for Tessera, or "". A
// hybrid host is accepted: the runtime's cgroups path and /proc/<pid>/cgroup name the
// same container on it (the v1 entries, which the agent reads when the unified one is
// "/"), and the runtime enforces the device list with the v1 devices controller.
func checkCgroup(root string, statfs func(string, *unix.Statfs_t) error) (mode, why string) {
	mode, err := cgroupMode(root, statfs)
	switch {
	case err != nil:
		return "", err.Error()
	case mode == "v1":
		return mode, fmt.Sprintf("the host has only cgroup v1 (no cgroup2 hierarchy at %s or %s/unified): unsupported; "+
			"Kubernetes 1.35+ kubelets refuse it by default and Tessera is tested on cgroup v2 only. "+
			"Boot the host with the unified hierarchy (systemd.unified_cgroup_hierarchy=1)", root, root)
	}
	return mode, ""
}

// checkNRISocket returns what is wrong with the runtime's NRI socket, or "".
func checkNRISocket(path string) string {
	st, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Sprintf("the runtime's NRI socket %s does not exist: NRI is disabled or the runtime has none. "+
			"Enable it (containerd 2.x: [plugins.\"io.containerd.nri.v1.nri\"] disable = false; CRI-O: [crio.nri] enable_nri = true), "+
			"or run the agent with --nri=false --bind-fallback, or --nri-unavailable=fallback", path)
	}
	if err != nil {
		return fmt.Sprintf("the runtime's NRI socket %s: %v", path, err)
	}
	if st.Mode()&os.ModeSocket == 0 {
		return fmt.Sprintf("%s is not a socket", path)
	}
	return ""
}

// checkWritableDir returns what keeps the agent from writing files into dir, or "".
func checkWritableDir(what, dir string) string {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Sprintf("%s %s cannot be created: %v", what, dir, err)
	}
	f, err := os.CreateTemp(dir, ".tessera-probe-*")
	if err != nil {
		return fmt.Sprintf("%s %s is not writable: %v", what, dir, err)
	}
	name := f.Name()
	f.Close()
	os.Remove(name)
	return ""
}

// NRIFallback applies --nri-unavailable=fallback: when NRI is asked for and the
// runtime's socket is missing at start-up, the agent binds at the first CUDA call
// instead. It returns what it did ("" when nothing).
func NRIFallback(c *Config) string {
	if !c.NRI || c.NRIUnavailable != NRIUnavailableFallback {
		return ""
	}
	why := checkNRISocket(c.NRISocket)
	if why == "" {
		return ""
	}
	c.NRI, c.BindFallback = false, true
	return why + "; binding GPU containers at their first CUDA call instead (--nri-unavailable=fallback)"
}

// checkStatic runs the checks that need no running subsystem: cgroups, the NRI
// socket's presence and the CDI directory.
func (a *Agent) checkStatic() {
	root := a.cfg.CgroupRoot
	if root == "" {
		root = "/sys/fs/cgroup"
	}
	mode, why := checkCgroup(root, a.statfs)
	a.setRequirement("cgroup", why)
	if mode == "hybrid" {
		a.log.Info("the host's cgroups are hybrid: v1 controllers, with cgroup v2 only at "+filepath.Join(root, "unified")+
			". Accepted (the runtime enforces devices with the v1 controller); Kubernetes 1.35+ kubelets need failCgroupV1=false on such a host",
			"cgroupRoot", root)
	}
	if a.NRI != nil {
		a.setRequirement("nri", checkNRISocket(a.cfg.NRISocket))
	}
	if a.CDI != nil {
		a.setRequirement("cdi-directory", checkWritableDir("the CDI spec directory", a.cfg.CDISpecDir))
	}
}

// checkLive re-checks what changes while the agent runs: the NRI connection and the
// CDI spec (regenerated when the node's devices change).
func (a *Agent) checkLive(now time.Time) {
	if a.NRI != nil {
		up, since, err := a.NRI.Connected()
		why := ""
		switch {
		case up:
		case since.IsZero():
			why = checkNRISocket(a.cfg.NRISocket)
		case now.Sub(since) > nriGrace:
			why = checkNRISocket(a.cfg.NRISocket)
			if why == "" {
				why = fmt.Sprintf("not connected to the runtime's NRI socket %s for %s", a.cfg.NRISocket, now.Sub(since).Round(time.Second))
				if err != nil {
					why += ": " + err.Error()
				}
			}
		default:
			why = "-" // connecting: the last state holds
		}
		if why != "-" {
			a.setRequirement("nri", why)
		}
	}
	if a.CDI != nil {
		a.syncCDI()
	}
}

// setRequirement records a requirement's state and, when it changed, says so in the
// log and in a Node event, and marks the Node.
func (a *Agent) setRequirement(name, why string) {
	if !a.req.set(name, why) {
		return
	}
	if why != "" {
		a.log.Error(errors.New(why), "node requirement not met; GPU containers are refused until it is", "requirement", name)
		a.nodeEvent(corev1.EventTypeWarning, "TesseraRequirementNotMet", name+": "+why)
	} else {
		a.log.Info("node requirement met", "requirement", name)
		a.nodeEvent(corev1.EventTypeNormal, "TesseraRequirementMet", name+" is met")
	}
	a.markNode()
}

func (a *Agent) nodeEvent(kind, reason, msg string) {
	if a.recorder == nil {
		return
	}
	a.recorder.Event(&corev1.ObjectReference{Kind: "Node", Name: a.cfg.NodeName, UID: types.UID(a.cfg.NodeName)}, kind, reason, msg)
}

// requirementsValue is the Node annotation's value: "met" or the unmet
// requirements, then the memory-fence line (information, api.RequirementMemoryFence)
// once the fence was detected.
func (a *Agent) requirementsValue() string {
	v := api.RequirementsMet
	if l := a.req.list(); len(l) > 0 {
		v = strings.Join(l, "\n")
	}
	if f := a.fence.info(); f != "" {
		v += "\n" + api.RequirementMemoryFence + ": " + f
	}
	return v
}

// markNode writes the requirements annotation on the Node (a merge patch of that key
// only, beside the inventory publisher's).
func (a *Agent) markNode() {
	if a.client == nil {
		return
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{AnnotationRequirements: a.requirementsValue()}}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := a.client.CoreV1().Nodes().Patch(ctx, a.cfg.NodeName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		a.log.Error(err, "writing the node requirements annotation")
	}
}

// watchRequirements re-checks the live requirements every poll until ctx is done.
func (a *Agent) watchRequirements(ctx context.Context) error {
	a.markNode()
	t := time.NewTicker(a.cfg.Poll)
	defer t.Stop()
	for {
		a.checkLive(time.Now())
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
