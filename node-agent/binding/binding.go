// SPDX-License-Identifier: Apache-2.0

// Package binding connects one container to the GPUs and limits the scheduler assigned
// it. It is runtime-agnostic: given the facts a runtime reports at container creation
// (the pod's annotations, the container's name, id, environment and cgroups path) it
// decides whether the container is Tessera's, refuses it when it asked for GPUs
// without an assignment, writes its limits file, records it in the checkpoint, and
// returns the edits (device nodes, environment, mounts) that the NRI plugin applies.
//
// It never looks for "the pod that is probably starting": every decision is a function
// of the facts above.
package binding

import (
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

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/checkpoint"
	"github.com/tessera-dev/tessera/node-agent/deviceplugin"
	"github.com/tessera-dev/tessera/node-agent/gpu"
)

// PreloadPath is where the hook is preloaded from inside the container. The dynamic
// loader reads it for every process, whatever the process's environment says, so a
// tenant cannot opt out by unsetting LD_PRELOAD; the mount is read-only.
const PreloadPath = "/etc/ld.so.preload"

// EnvVisibleDevices is the NVIDIA container toolkit's variable; set to the assigned
// UUIDs it also keeps the toolkit (when it is the runtime) from injecting other GPUs.
const EnvVisibleDevices = "NVIDIA_VISIBLE_DEVICES"

// DeviceNode is a device node to create in the container and allow in its device cgroup.
type DeviceNode struct {
	Path     string
	Type     string // "c" or "b"
	Major    int64
	Minor    int64
	FileMode uint32
	UID, GID uint32
}

// Mount is a mount into the container: a bind mount of the host path Source, or, when
// Type is set, a new file system of that type (Source names it, as mount(8) would) with
// Options.
type Mount struct {
	Source, Destination string
	ReadOnly            bool
	Type                string
	Options             []string
}

// EnvLibraryPath is the dynamic loader's search path.
const EnvLibraryPath = "LD_LIBRARY_PATH"

// Edits are the changes to a container's spec.
type Edits struct {
	// Devices are device nodes to add; empty when CDIDevices gives them.
	Devices []DeviceNode
	// CDIDevices are fully qualified CDI device names (tessera.dev/gpu=<uuid>), one
	// per granted GPU or MIG instance, in the grant's order: the runtime adds their
	// device nodes and the driver's files from the node's CDI spec.
	CDIDevices []string
	Env        [][2]string // ordered key/value pairs
	Mounts     []Mount
	// Limits is the content of the limits file written for the container (the
	// fallback binding hands it to the hook over the agent's socket).
	Limits []byte
}

// Request is what the runtime tells about a container being created.
type Request struct {
	PodUID         string
	Namespace      string
	Pod            string
	PodAnnotations map[string]string
	Container      string
	ContainerID    string
	// CgroupsPath is the OCI spec's linux.cgroupsPath.
	CgroupsPath string
	// Env is the container's environment, KEY=VALUE.
	Env []string
	// Started is set when the container already runs (the fallback binding at its
	// first CUDA call): its environment and mounts can no longer be changed.
	Started bool
	// Running is set for a container the runtime already runs when NRI reports it at
	// synchronisation (bound again after a lost checkpoint): the edits are not applied,
	// and Mounts are the destinations of the mounts it was created with.
	Running bool
	Mounts  []string
	// claimWorkConserving is a DRA claim's workConserving (BindClaim), which a
	// claim has in place of the pod annotation.
	claimWorkConserving bool
}

// RefusedError is a container that must not start, with the reason a user can act on.
type RefusedError struct{ Reason string }

func (e *RefusedError) Error() string { return "Tessera refused the container: " + e.Reason }

// Config configures a Binder.
type Config struct {
	NodeName string
	Names    api.ResourceNames
	// Devices lists the node's GPUs and MIG instances with their minor numbers.
	Devices func() ([]gpu.Device, error)
	// Store is the checkpoint of bound containers.
	Store *checkpoint.Store
	// ClaimStore, when set, is the checkpoint of the DRA ResourceClaims prepared on
	// the node (claim.go): their grants count beside the containers' in every check of
	// room, phase placement and unreserved share. Nil: no claims (DRA off).
	ClaimStore *checkpoint.Store
	// ClaimRegions, when set, gives each claim's region directory a file system of its
	// own (TmpfsRegions), taken away when the claim is unbound. Nil: the directory is
	// on the limits root's file system.
	ClaimRegions ClaimRegionFS
	// LimitsRoot is the host directory under which each container's limits directory
	// lives (api.DefaultHostLimitsRoot).
	LimitsRoot string
	// HookLibrary is the host path of the CUDA hook; it is mounted at the same path in
	// the container and preloaded. Empty: no hook is injected.
	HookLibrary string
	// PreloadFile is the host file the agent writes with the hook's path, mounted at
	// PreloadPath. Required with HookLibrary.
	PreloadFile string
	// TurnsDir is the host directory of the GPU turn files (turns.go), mounted
	// read-write at api.ContainerTurnsDir into containers the hook paces on a
	// time-sliced GPU. Empty: no turn files and no mount.
	TurnsDir string
	// CDI, when set, gives containers their GPUs and the driver's files through the
	// node's CDI spec: the edits name CDI devices and carry no device nodes.
	CDI CDI
	// Unmet, when set, says why the node cannot take new GPU containers ("" when it
	// can): a container bound for the first time is refused with it. (A container
	// already bound keeps its grant.)
	Unmet func() string
	// DevDir is where the NVIDIA device nodes live on the host ("/dev").
	DevDir string
	// ProcRoot is the host's /proc ("/proc"): MIG capability minors are read from
	// driver/nvidia/capabilities there, the nvidia-caps major from devices.
	ProcRoot string
	// StatDevice reads a device node; unix.Stat when nil.
	StatDevice func(path string) (DeviceNode, error)
	// Pods reads a pod of this node, from a cache where it can and from the API
	// server otherwise or when fresh is set; (nil, nil) when no pod with this
	// namespace, name and UID exists. The binder checks every assignment against its
	// pod's spec with it.
	Pods func(namespace, name, uid string, fresh bool) (*corev1.Pod, error)
	// CachedPod, when set, reads a pod of this node from the cache only (no API
	// request): false while the cache is not synchronised. Phase placement uses it to
	// free the compute windows of containers whose pod has finished or is gone but
	// that the runtime has not removed yet (NRI's RemoveContainer comes later, the
	// fallback binding forgets them at its next reconcile).
	CachedPod func(uid string) (*corev1.Pod, bool)
	// SchedulerNames are the Tessera schedulers (profiles) whose assignments are
	// enforced: a pod naming another scheduler is never bound.
	SchedulerNames []string
	// Inventory returns the node's GPU inventory (the last one published); a grant's
	// memory is checked against the device's memory in it.
	Inventory func() (*api.NodeInventory, error)
	// ContextMiB overrides api.DefaultContextMiB in the limits files.
	ContextMiB int64
	// ChargeKernel writes the charge line (per-kernel charges) into every limits
	// file; false for the class estimator.
	ChargeKernel bool
	// MPS returns the MPS directories of a GPU the agent serves in mps mode, and
	// false for any other GPU; nil when no GPU is served so (see mps.go).
	MPS func(uuid string) (MPSDirs, bool)
	// Fence, when set, is the driver's per-cgroup memory limit (fence.go): set at
	// StartContainer through NRI, and before the first CUDA call is answered by the
	// fallback binding.
	Fence *Fence
	Now   func() time.Time
}

// CDI names the CDI devices of the node's spec.
type CDI interface {
	// DeviceNames returns the fully qualified CDI names of these GPU or MIG UUIDs, or
	// an error when the spec has no device for one of them.
	DeviceNames(uuids []string) ([]string, error)
	// LibraryDir is the container directory holding the driver's libraries that the
	// loader must be told about (the spec uses no hook to update its cache), or "".
	LibraryDir() string
}

// Binder binds containers. It is safe for concurrent use.
type Binder struct {
	cfg Config
	// mu serialises binds so that phase placement on a shared GPU sees every
	// container placed before it.
	mu sync.Mutex
}

// New checks cfg and writes the preload file.
func New(cfg Config) (*Binder, error) {
	if cfg.NodeName == "" || cfg.Devices == nil || cfg.Store == nil || cfg.LimitsRoot == "" || cfg.Pods == nil || cfg.Inventory == nil {
		return nil, errors.New("binding: node name, devices, store, limits root, pods and inventory are required")
	}
	if len(cfg.SchedulerNames) == 0 {
		return nil, errors.New("binding: at least one Tessera scheduler name is required")
	}
	if cfg.DevDir == "" {
		cfg.DevDir = "/dev"
	}
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.StatDevice == nil {
		cfg.StatDevice = statDevice
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.ContextMiB == 0 {
		cfg.ContextMiB = api.DefaultContextMiB
	}
	if cfg.HookLibrary != "" {
		if !filepath.IsAbs(cfg.HookLibrary) || cfg.PreloadFile == "" {
			return nil, errors.New("binding: the hook library needs an absolute path and a preload file")
		}
		if _, err := os.Stat(cfg.HookLibrary); err != nil {
			return nil, fmt.Errorf("binding: hook library: %w", err)
		}
		if err := writeAtomic(cfg.PreloadFile, []byte(cfg.HookLibrary+"\n"), 0o644); err != nil {
			return nil, fmt.Errorf("binding: preload file: %w", err)
		}
	}
	if err := os.MkdirAll(cfg.LimitsRoot, 0o755); err != nil {
		return nil, fmt.Errorf("binding: limits root: %w", err)
	}
	if cfg.TurnsDir != "" && !filepath.IsAbs(cfg.TurnsDir) {
		return nil, fmt.Errorf("binding: the GPU turns directory %q must be an absolute path", cfg.TurnsDir)
	}
	return &Binder{cfg: cfg}, nil
}

func envValue(env []string, key string) (string, bool) {
	for _, e := range env {
		if k, v, ok := strings.Cut(e, "="); ok && k == key {
			return v, true
		}
	}
	return "", false
}

// requested reports whether the container asked for GPUs: kubelet gave it the device
// plugin's marker, or its pod spec says so. (Kubelet gives every container that asks
// for the GPU resource the marker; the spec is the second source where the device
// plugin is off. A pod that cannot be read is not taken to ask, so a node agent cut
// off from the API server does not stop containers that have nothing to do with GPUs.)
func (b *Binder) requested(r *Request) bool {
	if _, ok := envValue(r.Env, deviceplugin.EnvRequested); ok {
		return true
	}
	pod, err := b.cfg.Pods(r.Namespace, r.Pod, r.PodUID, false)
	if err != nil || pod == nil {
		return false
	}
	c := specContainer(pod, r.Container)
	if c == nil || draServed(pod, r.Container, b.cfg.Names.GPU) {
		return false
	}
	return api.HasGPURequest(&corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{*c}}}, b.cfg.Names)
}

// draServed reports whether the scheduler left the container's GPU resource to DRA:
// on a node in DRA mode, a pod asking only whole GPUs gets them through a ResourceClaim
// of the DeviceClass that names the resource in extendedResourceName, which the
// scheduler creates and records in the pod's status (KEP-5004). That claim is
// prepared and bound by the node's DRA plugin, like any claim of Tessera's devices,
// and the container has no assignment to be refused for.
func draServed(pod *corev1.Pod, container string, gpu corev1.ResourceName) bool {
	st := pod.Status.ExtendedResourceClaimStatus
	if st == nil {
		return false
	}
	for _, m := range st.RequestMappings {
		if m.ContainerName == container && corev1.ResourceName(m.ResourceName) == gpu {
			return true
		}
	}
	return false
}

// specContainer returns the pod's init or regular container with this name, or nil.
func specContainer(pod *corev1.Pod, name string) *corev1.Container {
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			if cs[i].Name == name {
				return &cs[i]
			}
		}
	}
	return nil
}

// Bind decides for one container being created. It returns nil edits and no error for
// a container that is not Tessera's, a RefusedError for one that must not start.
//
// A container is bound once, with the grant its pod's assignment gives it after that
// grant is checked against the pod (see verify). Its record in the checkpoint then
// freezes the grant: binding the same container again (a runtime retry, the agent's
// restart, every new process under the fallback binding) uses the record and never
// reads the annotation again, so a later edit of the annotation changes nothing.
func (b *Binder) Bind(r Request) (*Edits, error) {
	who := fmt.Sprintf("container %q of pod %s/%s", r.Container, r.Namespace, r.Pod)
	refuse := func(format string, args ...any) (*Edits, error) {
		return nil, &RefusedError{Reason: who + ": " + fmt.Sprintf(format, args...)}
	}
	if r.ContainerID != "" {
		if rec, ok := b.cfg.Store.Get(r.ContainerID); ok {
			return b.rebind(r, rec, who)
		}
	}
	// Asked lazily: the pod-spec lookup may be an API call, needed only when the
	// container is not in an assignment.
	requested := func() bool { return b.requested(&r) }
	raw, has := r.PodAnnotations[api.AnnotationAssignment]
	if !has {
		if requested() {
			return refuse("it asks for %s but the pod has no %s annotation, so no GPU share was reserved for it; "+
				"set the pod's spec.schedulerName to Tessera's scheduler. It is not started without limits", b.cfg.Names.GPU, api.AnnotationAssignment)
		}
		return nil, nil
	}
	a, err := api.DecodeAssignment(raw)
	if err != nil {
		if requested() {
			return refuse("the pod's %s annotation is invalid: %v", api.AnnotationAssignment, err)
		}
		return nil, nil
	}
	ca := a.Container(r.Container)
	if ca == nil {
		if requested() {
			return refuse("it asks for %s but the pod's GPU assignment has no entry for it", b.cfg.Names.GPU)
		}
		return nil, nil
	}
	if a.Node != b.cfg.NodeName {
		return refuse("the GPU assignment is for node %q, but the container is being created on %q", a.Node, b.cfg.NodeName)
	}
	if r.ContainerID == "" {
		return refuse("the runtime gave no container id")
	}
	if b.cfg.Unmet != nil {
		if why := b.cfg.Unmet(); why != "" {
			return refuse("%s", why)
		}
	}
	cgroup, err := ResolveCgroup(r.CgroupsPath)
	if err != nil {
		return refuse("%v", err)
	}

	b.mu.Lock()
	defer b.mu.Unlock()
	if why := b.verify(&r, raw, ca); why != "" {
		return refuse("%s. It is not started", why)
	}
	return b.apply(r, who, cgroup, ca.Devices, nil, false)
}

// rebind binds a container again with the grant frozen in its record.
func (b *Binder) rebind(r Request, rec checkpoint.Record, who string) (*Edits, error) {
	cgroup, err := ResolveCgroup(r.CgroupsPath)
	if err != nil {
		return nil, &RefusedError{Reason: who + ": " + err.Error()}
	}
	if cgroup != rec.Cgroup {
		return nil, &RefusedError{Reason: fmt.Sprintf("%s: container %s was bound in cgroup %s, not %s", who, r.ContainerID, rec.Cgroup, cgroup)}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.apply(r, who, cgroup, rec.Devices, &rec, false)
}

// verify checks an assignment the container has no record of against everything the
// node can confirm for itself, so that it holds without the admission policy that
// reserves the annotation to the scheduler: the pod exists with this UID on this node,
// carries the same annotation, names one of Tessera's schedulers, the container asks
// for GPUs and the grant is exactly what the scheduler gives for its request, and the
// grant fits beside every other pod's on its devices. It returns "" or what is wrong.
// The caller holds b.mu.
func (b *Binder) verify(r *Request, raw string, ca *api.ContainerAssignment) string {
	pod, err := b.cfg.Pods(r.Namespace, r.Pod, r.PodUID, false)
	if err == nil && (pod == nil || pod.Annotations[api.AnnotationAssignment] != raw) {
		// The cache may not have caught up with a pod bound a moment ago.
		pod, err = b.cfg.Pods(r.Namespace, r.Pod, r.PodUID, true)
	}
	if err != nil {
		return fmt.Sprintf("the node agent cannot read the pod to check its GPU assignment: %v", err)
	}
	if pod == nil {
		return "the pod does not exist in the API server, so its GPU assignment cannot be checked"
	}
	if pod.Annotations[api.AnnotationAssignment] != raw {
		return fmt.Sprintf("the pod's %s annotation differs from the one it was created with", api.AnnotationAssignment)
	}
	if pod.Spec.NodeName != b.cfg.NodeName {
		return fmt.Sprintf("the pod is bound to node %q, not %q", pod.Spec.NodeName, b.cfg.NodeName)
	}
	if !slices.Contains(b.cfg.SchedulerNames, pod.Spec.SchedulerName) {
		return fmt.Sprintf("the pod's spec.schedulerName %q is not one of Tessera's schedulers (%s), so Tessera did not place it and its %s annotation is not enforced",
			pod.Spec.SchedulerName, strings.Join(b.cfg.SchedulerNames, ", "), api.AnnotationAssignment)
	}
	req, err := api.ParsePodRequest(pod, b.cfg.Names)
	if err != nil {
		return fmt.Sprintf("the pod's GPU request is invalid: %v", err)
	}
	var cr *api.ContainerRequest
	for i := range req.Containers {
		if req.Containers[i].Name == r.Container {
			cr = &req.Containers[i]
		}
	}
	if cr == nil {
		return fmt.Sprintf("the pod's GPU assignment grants it GPUs, but its spec asks for no %s", b.cfg.Names.GPU)
	}
	inv, err := b.cfg.Inventory()
	if err != nil {
		return fmt.Sprintf("the node's GPU inventory is not available to check the grant against: %v", err)
	}
	if err := api.CheckGrant(*cr, ca, inv.SchedulableMemoryMiB); err != nil {
		return fmt.Sprintf("its GPU assignment does not match its request: %v", err)
	}
	if why := b.checkSharing(r, pod, req, ca, inv); why != "" {
		return why
	}
	if why := b.checkContextCharge(pod, cr, ca); why != "" {
		return why
	}
	return b.checkRoom(r, ca, inv)
}

// checkContextCharge checks that the grant on each device covers this node's charge
// for one of the container's CUDA contexts (api.ContextCharge; the scheduler places
// no smaller grant on a node that publishes the charge): below it, no process of the
// container could create one, and the container is refused at creation rather than
// left to fail at its first CUDA call.
func (b *Binder) checkContextCharge(pod *corev1.Pod, cr *api.ContainerRequest, ca *api.ContainerAssignment) string {
	sharing, _ := api.PodSharing(pod) // checkSharing has refused an invalid one
	charge := api.ContextCharge(b.cfg.ContextMiB, sharing, cr.Cores)
	for _, d := range ca.Devices {
		if d.MemoryMiB < charge {
			return fmt.Sprintf("its grant on %s is %d MiB, less than the %d MiB the CUDA hook on this node charges for %s (--context-mib %d), "+
				"so no process of the container could create one; ask for at least %d MiB per GPU", d.UUID, d.MemoryMiB, charge,
				api.ContextChargeWords(sharing, cr.Cores), b.cfg.ContextMiB, charge)
		}
	}
	return ""
}

// checkRoom checks that the grant fits on its devices beside the grants of every other
// bound container whose pod still exists: memory within the device's, cores within
// 100%. Another instance of the same container (a restart) is not counted. A pod the
// cache still has is read again from the API server before a refusal, so a pod
// deleted a moment ago does not hold its share.
func (b *Binder) checkRoom(r *Request, ca *api.ContainerAssignment, inv *api.NodeInventory) string {
	return b.checkRoomFor(r.PodUID, r.Container, "", ca.Devices, inv)
}

// checkRoomFor is checkRoom for devices held by the container (podUID, container), or
// by the claim claimUID: every other bound container whose pod exists and every
// other prepared claim count.
func (b *Binder) checkRoomFor(podUID, container, claimUID string, devices []api.DeviceGrant, inv *api.NodeInventory) string {
	type key struct{ pod, container string }
	var others []checkpoint.Record
	seen := map[key]bool{{podUID, container}: claimUID == ""}
	for _, rec := range b.cfg.Store.List() {
		k := key{rec.PodUID, rec.Container}
		if seen[k] {
			continue
		}
		seen[k] = true
		others = append(others, rec)
	}
	for _, rec := range b.claimRecords() {
		if rec.ContainerID != claimUID {
			others = append(others, rec)
		}
	}
	over := func(exists func(checkpoint.Record) bool) string {
		for _, d := range devices {
			total, _ := inv.SchedulableMemoryMiB(d.UUID)
			mem, cores := d.MemoryMiB, d.Cores
			for _, rec := range others {
				for _, g := range rec.Devices {
					if g.UUID == d.UUID && exists(rec) {
						mem += g.MemoryMiB
						cores += g.Cores
					}
				}
			}
			if mem > total || cores > 100 {
				return fmt.Sprintf("its grant on %s (%d MiB, %d%% cores) does not fit beside the containers and claims already bound there "+
					"(%d MiB of %d, %d%% cores in all): the GPU would be granted twice", d.UUID, d.MemoryMiB, d.Cores, mem, total, cores)
			}
		}
		return ""
	}
	exists := func(fresh bool) func(checkpoint.Record) bool {
		return func(rec checkpoint.Record) bool {
			if rec.Claim {
				return true // a prepared claim holds its share until it is unprepared
			}
			p, err := b.cfg.Pods(rec.Namespace, rec.Pod, rec.PodUID, fresh)
			return err != nil || p != nil // a pod that cannot be read still holds its share
		}
	}
	if why := over(exists(false)); why == "" {
		return ""
	}
	return over(exists(true))
}

// apply writes the container's limits for these grants, records it and returns its
// edits. prev is its earlier record when it is bound again. With claim set, r stands
// for a DRA claim (claim.go): its record goes to the claim checkpoint, and its
// accounting region is a host directory that every container of the claim shares.
// The caller holds b.mu.
func (b *Binder) apply(r Request, who, cgroup string, grants []api.DeviceGrant, prev *checkpoint.Record, claim bool) (*Edits, error) {
	refuse := func(format string, args ...any) (*Edits, error) {
		return nil, &RefusedError{Reason: who + ": " + fmt.Sprintf(format, args...)}
	}
	ca := &api.ContainerAssignment{Name: r.Container, Devices: grants}
	uuids := make([]string, len(grants))
	for i, d := range grants {
		uuids[i] = d.UUID
	}
	var nodes []DeviceNode
	var cdiNames []string
	var err error
	if b.cfg.CDI != nil {
		// Checked before anything is written: without its spec entry the container
		// would start without the GPU it was granted.
		if cdiNames, err = b.cfg.CDI.DeviceNames(uuids); err != nil {
			return refuse("%v", err)
		}
	} else if nodes, err = b.deviceNodes(ca); err != nil {
		return refuse("%v", err)
	}
	limits, err := api.NewContainerLimits(*ca, cgroup)
	if err != nil {
		return refuse("%v", err)
	}
	limits.ContextMiB = b.cfg.ContextMiB
	limits.ChargeKernel = b.cfg.ChargeKernel
	limits.RegionDir = regionDir(&r, prev)
	mpsEnv, mpsMounts, err := b.mpsEdits(&r, grants, limits)
	if err != nil {
		return refuse("%v", err)
	}
	if claim {
		limits.WorkConserving = r.claimWorkConserving
	} else if limits.WorkConserving, err = api.ParseWorkConserving(r.PodAnnotations[api.AnnotationWorkConserving]); err != nil {
		return refuse("%v", err)
	}
	if limits.WorkConserving && limits.MPS != nil {
		if claim {
			return refuse("its %s configuration asks for work-conserving pacing (workConserving: true), which is for time-sliced GPUs, but it was "+
				"allocated a GPU served by MPS, which divides the SMs and paces nothing: leave workConserving out, or select time-sliced devices "+
				"(device.attributes[\"%s\"].sharing == \"time-sliced\")", api.DRADriverName, api.DRADriverName)
		}
		return refuse("it asks for work-conserving pacing (%s: true), which is for time-sliced GPUs, but its GPU is served by MPS, "+
			"which divides the SMs and paces nothing: remove the annotation, or the %s: mps one", api.AnnotationWorkConserving, api.AnnotationSharing)
	}
	phases := map[string]int{}
	for i := range limits.GPUs {
		g := &limits.GPUs[i]
		if prev != nil {
			if p, ok := prev.Phases[g.UUID]; ok && g.Cores > 0 && p+g.Cores <= 100 {
				g.Phase = p
				phases[g.UUID] = p
				continue
			}
		}
		g.Phase, _ = api.PlacePhase(b.taken(g.UUID, r.ContainerID), g.Cores)
		if g.Cores > 0 {
			phases[g.UUID] = g.Phase
		}
	}
	data, err := api.EncodeLimits(limits)
	if err != nil {
		return refuse("%v", err)
	}
	if r.Started {
		// The fallback binding: the container runs, and its first CUDA call waits
		// for this answer. Through NRI the cgroup does not exist yet at creation:
		// the plugin sets the fence at StartContainer (FenceContainer).
		if err := b.fence(cgroup, grants); err != nil {
			return refuse("%v. Its CUDA calls are refused", err)
		}
	}
	turnMounts, err := b.turnMounts(limits)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", who, err)
	}
	shareMounts, err := b.shareMounts(limits)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", who, err)
	}
	dir := api.HostLimitsDir(b.cfg.LimitsRoot, cgroup)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("%s: limits directory: %w", who, err)
	}
	regionMount := RegionMount()
	if claim {
		if regionMount, err = claimRegionMount(dir, b.cfg.ClaimRegions); err != nil {
			return nil, fmt.Errorf("%s: %w", who, err)
		}
	}
	// The directory, not the file, is mounted: the file can then be replaced
	// atomically (after an agent restart, say) and the container sees the new one.
	if err := writeAtomic(filepath.Join(dir, api.LimitsFileName), data, 0o644); err != nil {
		return nil, fmt.Errorf("%s: limits file: %w", who, err)
	}
	rec := checkpoint.Record{
		ContainerID: r.ContainerID, PodUID: r.PodUID, Namespace: r.Namespace, Pod: r.Pod, Container: r.Container,
		Cgroup: cgroup, Devices: grants, Phases: phases, LimitsDir: dir, RegionDir: limits.RegionDir, BoundAt: b.cfg.Now().UTC(),
		Claim: claim,
	}
	if prev != nil {
		rec.BoundAt = prev.BoundAt
	}
	store := b.cfg.Store
	if claim {
		store = b.cfg.ClaimStore
	}
	if err := store.Put(rec); err != nil {
		return nil, fmt.Errorf("%s: checkpoint: %w", who, err)
	}
	// Before the container starts: the containers without cores on its GPUs are held
	// to what is left (shares.go), and this one, if it has none, finds its file.
	if err := b.writeShares(uuids); err != nil {
		return nil, fmt.Errorf("%s: %w", who, err)
	}

	e := &Edits{Devices: nodes, CDIDevices: cdiNames, Limits: data}
	if b.cfg.CDI == nil {
		e.Env = append(e.Env, [2]string{EnvVisibleDevices, strings.Join(uuids, ",")})
	} else if dir := b.cfg.CDI.LibraryDir(); dir != "" && !claim {
		// The spec sets NVIDIA_VISIBLE_DEVICES=void itself (so that an NVIDIA runtime
		// adds nothing more). Without the toolkit's hook nothing updates the image's
		// loader cache: the library directory goes at the end of the image's own
		// search path, which is kept.
		e.Env = append(e.Env, [2]string{EnvLibraryPath, appendPath(r.Env, dir)})
	}
	e.Mounts = append(e.Mounts, Mount{Source: dir, Destination: api.ContainerLimitsDir, ReadOnly: true})
	if limits.RegionDir != "" {
		e.Mounts = append(e.Mounts, regionMount)
	}
	e.Env = append(e.Env, mpsEnv...)
	e.Mounts = append(e.Mounts, mpsMounts...)
	if b.cfg.HookLibrary != "" {
		e.Mounts = append(e.Mounts,
			Mount{Source: b.cfg.HookLibrary, Destination: b.cfg.HookLibrary, ReadOnly: true},
			Mount{Source: b.cfg.PreloadFile, Destination: PreloadPath, ReadOnly: true})
	}
	e.Mounts = append(e.Mounts, turnMounts...)
	e.Mounts = append(e.Mounts, shareMounts...)
	return e, nil
}

// appendPath returns the container's LD_LIBRARY_PATH with dir at its end (unless it
// holds dir already).
func appendPath(env []string, dir string) string {
	cur, _ := envValue(env, EnvLibraryPath)
	if cur == "" {
		return dir
	}
	if slices.Contains(strings.Split(cur, ":"), dir) {
		return cur
	}
	return cur + ":" + dir
}

// taken returns the compute windows already placed on a GPU by other containers that
// may still compute.
func (b *Binder) taken(uuid, except string) []api.PhaseSpan {
	var out []api.PhaseSpan
	for _, r := range b.allRecords() {
		if r.ContainerID == except || b.windowFree(r) {
			continue
		}
		for _, d := range r.Devices {
			if d.UUID == uuid && d.Cores > 0 {
				out = append(out, api.PhaseSpan{Phase: r.Phases[uuid], Cores: d.Cores})
			}
		}
	}
	return out
}

// windowLag is how long after its binding a record's pod may be missing from the
// pod cache without its window being freed: a container can be bound from a pod read
// from the API server before the cache has it.
const windowLag = 10 * time.Second

// windowFree reports whether the record's container no longer computes although the
// runtime has not removed it yet: its pod has finished, or is gone from the
// (synchronised) pod cache and was bound more than windowLag ago.
func (b *Binder) windowFree(r checkpoint.Record) bool {
	if b.cfg.CachedPod == nil || r.Claim {
		return false
	}
	p, synced := b.cfg.CachedPod(r.PodUID)
	switch {
	case !synced:
		return false
	case p == nil:
		return b.cfg.Now().Sub(r.BoundAt) > windowLag
	default:
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
	}
}

// controlNodes are the NVIDIA nodes every CUDA process needs besides its GPUs'; the
// optional ones are added when the host has them.
var controlNodes = []struct {
	name     string
	required bool
}{{"nvidiactl", true}, {"nvidia-uvm", true}, {"nvidia-uvm-tools", false}}

func (b *Binder) deviceNodes(ca *api.ContainerAssignment) ([]DeviceNode, error) {
	devs, err := b.cfg.Devices()
	if err != nil {
		return nil, fmt.Errorf("listing the node's GPUs: %w", err)
	}
	byUUID := make(map[string]gpu.Device, len(devs))
	for _, d := range devs {
		byUUID[d.UUID] = d
	}
	var out, capNodes []DeviceNode
	seen := map[int]bool{}
	for _, g := range ca.Devices {
		d, ok := byUUID[g.UUID]
		if !ok {
			return nil, fmt.Errorf("assigned GPU %s is not on this node", g.UUID)
		}
		if d.Minor < 0 {
			return nil, fmt.Errorf("GPU %s has no known device minor number", g.UUID)
		}
		if d.ParentUUID != "" {
			// A MIG instance is reached through its parent's node, but the driver lets
			// a process use it only with the capability nodes of its GPU and compute
			// instance. Without them it would have to be given the whole parent GPU,
			// which is never done.
			caps, err := b.migCapNodes(d)
			if err != nil {
				return nil, fmt.Errorf("assigned MIG instance %s: %w", g.UUID, err)
			}
			capNodes = append(capNodes, caps...)
		}
		if seen[d.Minor] {
			continue
		}
		seen[d.Minor] = true
		name := fmt.Sprintf("nvidia%d", d.Minor)
		n, err := b.cfg.StatDevice(filepath.Join(b.cfg.DevDir, name))
		if err != nil {
			return nil, fmt.Errorf("GPU %s: %w", g.UUID, err)
		}
		n.Path = "/dev/" + name // the agent may see the host's /dev elsewhere
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Minor < out[j].Minor })
	for _, c := range controlNodes {
		n, err := b.cfg.StatDevice(filepath.Join(b.cfg.DevDir, c.name))
		if err != nil {
			if c.required {
				return nil, fmt.Errorf("NVIDIA control device: %w", err)
			}
			continue
		}
		n.Path = "/dev/" + c.name
		out = append(out, n)
	}
	return append(out, capNodes...), nil
}

// Unbind forgets a container that is gone, rewrites the share files of its GPUs and
// removes its limits directory.
func (b *Binder) Unbind(containerID string) error {
	return b.unbind(b.cfg.Store, containerID)
}

// unbind forgets the record id of store (the containers' or the claims').
func (b *Binder) unbind(store *checkpoint.Store, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := store.Get(id)
	if !ok {
		return nil
	}
	if err := store.Delete(id); err != nil {
		return err
	}
	// The containers without cores left on its GPUs get back what it reserved.
	uuids := make([]string, len(r.Devices))
	for i, d := range r.Devices {
		uuids[i] = d.UUID
	}
	if err := b.writeShares(uuids); err != nil {
		return err
	}
	if r.LimitsDir != "" && strings.HasPrefix(r.LimitsDir, b.cfg.LimitsRoot+string(os.PathSeparator)) {
		if r.Claim && b.cfg.ClaimRegions != nil {
			if err := b.cfg.ClaimRegions.Unmount(filepath.Join(r.LimitsDir, claimRegionSubdir)); err != nil {
				return err
			}
		}
		return os.RemoveAll(r.LimitsDir)
	}
	return nil
}

// Reconcile is given every container the runtime has (after the agent starts, or
// reconnects to the runtime). Records of containers that no longer exist are removed;
// Tessera containers without a record (a lost or corrupt checkpoint) are bound again,
// which rewrites their limits file in the directory they already have mounted. It
// returns the refusals it met, for logging: a running container cannot be refused.
func (b *Binder) Reconcile(live []Request) []error {
	var errs []error
	alive := map[string]bool{}
	for _, r := range live {
		alive[r.ContainerID] = true
	}
	for _, rec := range b.cfg.Store.List() {
		if !alive[rec.ContainerID] {
			if err := b.Unbind(rec.ContainerID); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, r := range live {
		if _, ok := b.cfg.Store.Get(r.ContainerID); ok {
			continue
		}
		if _, has := r.PodAnnotations[api.AnnotationAssignment]; !has {
			continue
		}
		if _, err := b.Bind(r); err != nil {
			errs = append(errs, err)
		}
	}
	if err := b.RefreshShares(); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// Records returns the bound containers.
func (b *Binder) Records() []checkpoint.Record { return b.cfg.Store.List() }

func statDevice(path string) (DeviceNode, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return DeviceNode{}, fmt.Errorf("%s: %w", path, err)
	}
	var typ string
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFCHR:
		typ = "c"
	case unix.S_IFBLK:
		typ = "b"
	default:
		return DeviceNode{}, fmt.Errorf("%s is not a device node", path)
	}
	return DeviceNode{Path: path, Type: typ, Major: int64(unix.Major(uint64(st.Rdev))), Minor: int64(unix.Minor(uint64(st.Rdev))),
		FileMode: st.Mode & 0o777, UID: st.Uid, GID: st.Gid}, nil
}

func writeAtomic(path string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
