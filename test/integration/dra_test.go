// SPDX-License-Identifier: Apache-2.0

// The node agent runs the DRA kubelet plugin built with the newest minor's modules
// only (one agent binary serves every supported minor); a suite built in an older
// minor's module (make test-integration K8S_MINOR=1.34) leaves these tests out.

//go:build !k8s1.34 && !k8s1.35 && !k8s1.36

package integration

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/agent"
	"github.com/tessera-dev/tessera/node-agent/binding"
	"github.com/tessera-dev/tessera/node-agent/checkpoint"
	"github.com/tessera-dev/tessera/node-agent/dra"
)

// draAgent is a simulated node agent in DRA mode whose state lives in dir, so that a
// second one on the same dir is the first one restarted.
type draAgent struct {
	dir    string
	cancel context.CancelFunc
	done   chan error
}

// startDRAAgent runs the agent as a node would start it with --dra, on a simulated
// topology file (re-read at every poll), with every directory under dir.
func (c *cluster) startDRAAgent(node, topology, dir string) *draAgent {
	c.t.Helper()
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	var cfg agent.Config
	agent.BindFlags(fs, &cfg)
	if err := fs.Parse([]string{
		"--simulate", topology, "--node-name", node,
		"--dra", "--device-plugin=false", "--poll", "100ms", "--heartbeat", "1s",
		"--state-dir", filepath.Join(dir, "state"), "--limits-root", filepath.Join(dir, "limits"),
		"--turns-dir", filepath.Join(dir, "turns"), "--dev-dir", filepath.Join(dir, "dev"),
		"--dra-cdi-spec-dir", filepath.Join(dir, "cdi"), "--dra-plugin-dir", filepath.Join(dir, "plugin"),
		"--dra-registrar-dir", filepath.Join(dir, "registry"),
		// No tmpfs at the claims' region directories: a claim the test leaves
		// prepared would keep one mounted in the test's temporary directory (the
		// real-node suite and the binder's tests mount them).
		"--dra-claim-region-tmpfs=false",
	}); err != nil {
		c.t.Fatal(err)
	}
	agent.ApplySimulateDefaults(fs, &cfg)
	log := testr.New(c.t)
	src, err := agent.OpenSource(&cfg, log)
	if err != nil {
		c.t.Fatal(err)
	}
	a, err := agent.New(cfg, log, c.client, src, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(c.ctx)
	da := &draAgent{dir: dir, cancel: cancel, done: make(chan error, 1)}
	go func() {
		err := a.Run(ctx)
		if err != nil {
			c.t.Errorf("the node agent stopped: %v", err)
		}
		src.Close()
		da.done <- err
	}()
	c.t.Cleanup(da.stop)
	return da
}

var stopOnce sync.Map

func (a *draAgent) stop() {
	if _, done := stopOnce.LoadOrStore(a, true); done {
		return
	}
	a.cancel()
	<-a.done
}

// call connects to the agent's DRA socket as kubelet does.
func (a *draAgent) client(t *testing.T) drapb.DRAPluginClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(a.dir, "plugin", "dra.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return drapb.NewDRAPluginClient(conn)
}

// makeDevNodes makes the NVIDIA device nodes the binding names for GPUs 0..n-1 in
// dir/dev (char devices with the driver's numbers; nothing opens them).
func makeDevNodes(t *testing.T, dir string, n int) {
	t.Helper()
	dev := filepath.Join(dir, "dev")
	if err := os.MkdirAll(dev, 0o755); err != nil {
		t.Fatal(err)
	}
	nodes := map[string]uint64{"nvidiactl": unix.Mkdev(195, 255), "nvidia-uvm": unix.Mkdev(510, 0)}
	for i := 0; i < n; i++ {
		nodes["nvidia"+strconv.Itoa(i)] = unix.Mkdev(195, uint32(i))
	}
	for name, d := range nodes {
		if err := unix.Mknod(filepath.Join(dev, name), unix.S_IFCHR|0o666, int(d)); err != nil {
			if errors.Is(err, unix.EPERM) {
				t.Skipf("making device nodes needs CAP_MKNOD: %v", err)
			}
			t.Fatal(err)
		}
	}
}

// readObjects decodes the YAML documents of a file under config/dra into objects
// of type T.
func readObjects[T any](t *testing.T, name string) []*T {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "config", "dra", name))
	if err != nil {
		t.Fatal(err)
	}
	var out []*T
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
	for {
		doc, err := r.Read()
		if err != nil {
			break
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		var o T
		if err := yaml.UnmarshalStrict(doc, &o); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out = append(out, &o)
	}
	return out
}

// TestDRAAgent: a node agent in DRA mode publishes its GPUs as shareable devices in
// ResourceSlices the API server accepts as they are, the DeviceClass and claim
// templates under config/dra are valid, and a claim allocated by hand is prepared
// through the plugin's socket as kubelet would (limits file, shared region, CDI spec),
// prepared again and unprepared after the agent restarted (its checkpoint), and a
// claim that would overfill the GPU is refused.
// draNode is a simulated node whose agent runs in DRA mode: two A100s on one NVLink
// bridge, GPU 0 in MIG mode with seven instances (config/simulated/a100-2x-mig.yaml,
// copied to dir/topology.yaml, which the agent re-reads). It returns the agent, the
// topology's content and the node's slices once published.
func (c *cluster) draNode(node, dir string) (*draAgent, []byte, []resourceapi.ResourceSlice) {
	return c.draNodeOf(node, dir, "a100-2x-mig.yaml", 2)
}

// draNodeOf is draNode with the simulated topology config/simulated/<topology> of gpus
// GPUs.
func (c *cluster) draNodeOf(node, dir, topology string, gpus int) (*draAgent, []byte, []resourceapi.ResourceSlice) {
	t := c.t
	t.Helper()
	c.createNode(node, nil)
	makeDevNodes(t, dir, gpus)
	if err := os.MkdirAll(filepath.Join(dir, "registry"), 0o755); err != nil { // kubelet's
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "config", "simulated", topology))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "topology.yaml"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	a := c.startDRAAgent(node, filepath.Join(dir, "topology.yaml"), dir)
	var slices []resourceapi.ResourceSlice
	if err := wait.PollUntilContextTimeout(c.ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := c.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			return false, err
		}
		slices = l.Items
		return len(slices) > 0, nil
	}); err != nil {
		t.Fatalf("no ResourceSlice of %s: %v", node, err)
	}
	// The socket is served once the agent has started the plugin.
	if err := wait.PollUntilContextTimeout(c.ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := os.Stat(filepath.Join(dir, "plugin", "dra.sock"))
		return err == nil, nil
	}); err != nil {
		t.Fatal("the DRA socket never appeared")
	}
	return a, raw, slices
}

// gpuUUID returns the UUID of GPU index i in the node's published inventory.
func (c *cluster) gpuUUID(node string, i int) string {
	c.t.Helper()
	n, err := c.client.CoreV1().Nodes().Get(c.ctx, node, metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	inv, err := api.DecodeInventory(n.Annotations[api.AnnotationInventory])
	if err != nil {
		c.t.Fatal(err)
	}
	return inv.GPUs[i].UUID
}

// prepare asks the agent to prepare one claim, as kubelet does.
func (a *draAgent) prepare(t *testing.T, ctx context.Context, cl *resourceapi.ResourceClaim) *drapb.NodePrepareResourceResponse {
	t.Helper()
	resp, err := a.client(t).NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{
		Claims: []*drapb.Claim{{Namespace: cl.Namespace, Name: cl.Name, Uid: string(cl.UID)}}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Claims[string(cl.UID)]
}

func TestDRAAgent(t *testing.T) {
	c := startCluster(t)
	const node = "dra-node"
	dir := t.TempDir()
	topology := filepath.Join(dir, "topology.yaml")
	a, raw, slices := c.draNode(node, dir)

	// The slices: seven MIG instances of GPU 0 and GPU 1 whole, as the agent
	// published them and the API server kept them.
	if len(slices) != 1 || slices[0].Spec.Driver != dra.DriverName || slices[0].Spec.Pool.Name != node {
		t.Fatalf("slices %+v", slices)
	}
	gpu1 := c.gpuUUID(node, 1)
	devs := slices[0].Spec.Devices
	if len(devs) != 8 {
		t.Fatalf("%d devices, want 8", len(devs))
	}
	var whole *resourceapi.Device
	for i := range devs {
		d := &devs[i]
		// Dropped by an API server without consumable capacity.
		if d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
			t.Errorf("%s: not shareable", d.Name)
		}
		mem, cores := d.Capacity[dra.CapacityMemory], d.Capacity[dra.CapacityCores]
		if mem.RequestPolicy == nil || mem.RequestPolicy.ValidRange == nil || mem.RequestPolicy.ValidRange.Min.Value() != api.DefaultContextMiB<<20 ||
			cores.Value.Value() != 100 || cores.RequestPolicy == nil || cores.RequestPolicy.Default.Value() != 100 {
			t.Errorf("%s: capacity %+v", d.Name, d.Capacity)
		}
		if d.Name == dra.DeviceName(gpu1) {
			whole = d
		}
	}
	if whole == nil {
		t.Fatalf("no device for GPU 1 (%s)", gpu1)
	}
	wholeMem := whole.Capacity[dra.CapacityMemory]
	if wholeMem.Value.Value() != 81920<<20 ||
		*whole.Attributes[dra.AttrType].StringValue != "gpu" || *whole.Attributes[dra.AttrNVLinkIsland].IntValue != 0 {
		t.Fatalf("GPU 1: %+v", whole)
	}

	// The examples are what the API server accepts.
	for _, dc := range readObjects[resourceapi.DeviceClass](t, "deviceclass.yaml") {
		if _, err := c.client.ResourceV1().DeviceClasses().Create(c.ctx, dc, metav1.CreateOptions{}); err != nil {
			t.Fatalf("DeviceClass %s: %v", dc.Name, err)
		}
	}
	templates := readObjects[resourceapi.ResourceClaimTemplate](t, "claim-templates.yaml")
	if len(templates) < 2 {
		t.Fatalf("%d templates", len(templates))
	}
	for _, tpl := range templates {
		if _, err := c.client.ResourceV1().ResourceClaimTemplates(c.ns).Create(c.ctx, tpl, metav1.CreateOptions{}); err != nil {
			t.Fatalf("ResourceClaimTemplate %s: %v", tpl.Name, err)
		}
		// Tessera's configuration in an example is what the agent reads.
		for _, cfg := range tpl.Spec.Spec.Devices.Config {
			if o := cfg.Opaque; o != nil && o.Driver == dra.DriverName {
				if _, err := api.DecodeGPUConfig(o.Parameters.Raw); err != nil {
					t.Errorf("ResourceClaimTemplate %s: %v", tpl.Name, err)
				}
			}
		}
	}

	// A claim from the first template, allocated by hand as the scheduler would: 8 GiB
	// and 30 % of GPU 1.
	claim := c.allocatedClaim("share", templates[0].Spec.Spec, node, gpu1, "8Gi", "30")
	prepare := func(a *draAgent, cl *resourceapi.ResourceClaim) *drapb.NodePrepareResourceResponse {
		t.Helper()
		return a.prepare(t, c.ctx, cl)
	}
	r := prepare(a, claim)
	if r == nil || r.Error != "" || len(r.Devices) != 1 {
		t.Fatalf("prepare: %+v", r)
	}
	d := r.Devices[0]
	claimDevice := "tessera.dev/claim=" + string(claim.UID)
	if d.PoolName != node || d.DeviceName != dra.DeviceName(gpu1) || strings.Join(d.CdiDeviceIds, ",") != claimDevice ||
		d.ShareId == nil || *d.ShareId != string(*claim.Status.Allocation.Devices.Results[0].ShareID) {
		t.Errorf("prepared device %+v", d)
	}
	limitsDir := api.HostLimitsDir(filepath.Join(dir, "limits"), binding.ClaimCgroup(string(claim.UID)))
	limits := readLimits(t, limitsDir)
	if len(limits.GPUs) != 1 || limits.GPUs[0].UUID != gpu1 || limits.GPUs[0].MemoryMiB != 8192 || limits.GPUs[0].Cores != 30 ||
		limits.RegionDir != api.ContainerRegionDir {
		t.Errorf("limits %+v", limits)
	}
	specFile := filepath.Join(dir, "cdi", "tessera.dev-claim_"+string(claim.UID)+".json")
	spec, err := os.ReadFile(specFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{limitsDir, filepath.Join(limitsDir, "region"), "/dev/nvidia1", "/run/tessera-turns/" + gpu1} {
		if !bytes.Contains(spec, []byte(want)) {
			t.Errorf("the claim's CDI spec lacks %s: %s", want, spec)
		}
	}

	// A second claim wanting 71 % of the same GPU does not fit beside the first.
	over := c.allocatedClaim("over", templates[0].Spec.Spec, node, gpu1, "1Gi", "71")
	if r := prepare(a, over); r == nil || !strings.Contains(r.Error, "does not fit") {
		t.Errorf("overfull claim: %+v", r)
	}

	// The agent restarts: the claim stays bound (its checkpoint), prepares again to
	// the same binding, and unprepares by UID alone.
	a.stop()
	a = c.startDRAAgent(node, topology, dir)
	if err := wait.PollUntilContextTimeout(c.ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := a.client(t).NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{})
		return err == nil, nil
	}); err != nil {
		t.Fatal("the restarted agent's DRA socket never answered")
	}
	if r := prepare(a, claim); r == nil || r.Error != "" || len(r.Devices) != 1 || strings.Join(r.Devices[0].CdiDeviceIds, ",") != claimDevice {
		t.Fatalf("prepare after restart: %+v", r)
	}
	if again := readLimits(t, limitsDir); again.GPUs[0] != limits.GPUs[0] {
		t.Errorf("limits after restart %+v, before %+v", again.GPUs, limits.GPUs)
	}
	resp, err := a.client(t).NodeUnprepareResources(c.ctx, &drapb.NodeUnprepareResourcesRequest{
		Claims: []*drapb.Claim{{Namespace: claim.Namespace, Name: claim.Name, Uid: string(claim.UID)}}})
	if err != nil || resp.Claims[string(claim.UID)] == nil || resp.Claims[string(claim.UID)].Error != "" {
		t.Fatalf("unprepare: %+v %v", resp, err)
	}
	if _, err := os.Stat(limitsDir); !os.IsNotExist(err) {
		t.Error("the claim's limits directory is left after unprepare")
	}
	if _, err := os.Stat(specFile); !os.IsNotExist(err) {
		t.Error("the claim's CDI spec is left after unprepare")
	}

	// GPU 1 turns unhealthy: its device is tainted in the slice (the API server keeps
	// the taint) and a new claim on it is refused.
	end := []byte("nvlinks: 12}") // GPU 1's entry is the last one
	i := bytes.LastIndex(raw, end)
	if i < 0 {
		t.Fatal("cannot mark GPU 1 unhealthy in the topology")
	}
	sick := append(append(append([]byte{}, raw[:i]...), `nvlinks: 12, unhealthy: "XID 79"}`...), raw[i+len(end):]...)
	if err := os.WriteFile(topology, sick, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(c.ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := c.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
		if err != nil || len(l.Items) != 1 {
			return false, err
		}
		for _, d := range l.Items[0].Spec.Devices {
			if d.Name == dra.DeviceName(gpu1) {
				return len(d.Taints) == 1 && d.Taints[0].Key == dra.TaintUnhealthy && d.Taints[0].Effect == resourceapi.DeviceTaintEffectNoSchedule, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Errorf("GPU 1 not tainted in the slice: %v", err)
	}
	late := c.allocatedClaim("late", templates[0].Spec.Spec, node, gpu1, "1Gi", "10")
	if r := prepare(a, late); r == nil || !strings.Contains(r.Error, "unhealthy") {
		t.Errorf("claim on the unhealthy GPU: %+v", r)
	}
	a.stop()
	cp, err := checkpoint.Open(filepath.Join(dir, "state", agent.DRACheckpoint))
	if err != nil {
		t.Fatal(err)
	}
	if recs := cp.List(); len(recs) != 0 {
		t.Errorf("claim checkpoint after unprepare: %+v", recs)
	}
}

// allocatedClaim creates a claim with this spec and writes its allocation as the
// scheduler would: one share of device uuid on node, consuming memory and cores.
func (c *cluster) allocatedClaim(name string, spec resourceapi.ResourceClaimSpec, node, gpuUUID, memory, cores string) *resourceapi.ResourceClaim {
	c.t.Helper()
	cl, err := c.client.ResourceV1().ResourceClaims(c.ns).Create(c.ctx, &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns}, Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatalf("claim %s: %v", name, err)
	}
	cl.Status.Allocation = &resourceapi.AllocationResult{
		Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
			Request: spec.Devices.Requests[0].Name, Driver: dra.DriverName, Pool: node, Device: dra.DeviceName(gpuUUID),
			ShareID: ptr.To(types.UID(uuid.NewUUID())),
			ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{
				dra.CapacityMemory: resource.MustParse(memory), dra.CapacityCores: resource.MustParse(cores)},
		}}},
	}
	cl, err = c.client.ResourceV1().ResourceClaims(c.ns).UpdateStatus(c.ctx, cl, metav1.UpdateOptions{})
	if err != nil {
		c.t.Fatalf("allocating claim %s: %v", name, err)
	}
	return cl
}

func readLimits(t *testing.T, dir string) *api.ContainerLimits {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, api.LimitsFileName))
	if err != nil {
		t.Fatal(err)
	}
	l, err := api.DecodeLimits(data)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestDRAClaimsAllocatedUpstream: kube-scheduler's own DRA allocator (in the Tessera
// profiles' TesseraDynamicResources, which only orders the devices it walks) allocates shares of the agent's devices by their capacities and request policies,
// never more than a device has, and what it wrote into each claim is what the agent
// enforces when the claim is prepared.
func TestDRAClaimsAllocatedUpstream(t *testing.T) {
	c := startCluster(t)
	const node = "dra-node"
	dir := t.TempDir()
	a, _, _ := c.draNode(node, dir)
	gpu1 := c.gpuUUID(node, 1)
	c.createDeviceClasses()
	c.startScheduler("tessera-scheduler.yaml")

	// Shares of the whole GPU (not a MIG instance), by binpack.
	share := func(name, memory, cores string) *resourceapi.ResourceClaim {
		return c.shareClaim(name, binpack, memory, cores)
	}
	allocated := func(cl *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
		t.Helper()
		c.waitBound("pod-"+cl.Name, 30*time.Second)
		got, err := c.client.ResourceV1().ResourceClaims(c.ns).Get(c.ctx, cl.Name, metav1.GetOptions{})
		if err != nil || got.Status.Allocation == nil {
			t.Fatalf("claim %s not allocated: %v", cl.Name, err)
		}
		return got
	}
	// 3000M is 2861.02 MiB: the policy's step rounds it up to 2862 MiB.
	first := allocated(share("first", "3000M", "30"))
	second := allocated(share("second", "40Gi", "60"))
	// 110 % of the cores, and the whole GPU's memory (the default) beside 43822 MiB:
	// neither fits.
	share("cores", "1Gi", "20")
	share("memory", "", "10")
	for _, p := range []string{"pod-cores", "pod-memory"} {
		if msg := c.waitUnschedulable(p, 30*time.Second); !strings.Contains(msg, "cannot allocate all claims") {
			t.Errorf("%s: %q", p, msg)
		}
	}

	// The allocation consumed memory in whole MiB within the policy; the agent
	// prepares each claim to exactly that.
	want := map[string][2]int64{"first": {2862, 30}, "second": {40960, 60}}
	for _, cl := range []*resourceapi.ResourceClaim{first, second} {
		res := cl.Status.Allocation.Devices.Results
		if len(res) != 1 || res[0].Device != dra.DeviceName(gpu1) || res[0].ShareID == nil {
			t.Fatalf("claim %s allocated %+v", cl.Name, res)
		}
		if r := a.prepare(t, c.ctx, cl); r == nil || r.Error != "" {
			t.Fatalf("prepare %s: %+v", cl.Name, r)
		}
		l := readLimits(t, api.HostLimitsDir(filepath.Join(dir, "limits"), binding.ClaimCgroup(string(cl.UID))))
		if got := [2]int64{l.GPUs[0].MemoryMiB, int64(l.GPUs[0].Cores)}; got != want[cl.Name] || l.GPUs[0].UUID != gpu1 {
			t.Errorf("claim %s: limits %+v, want %d MiB, %d%% cores", cl.Name, l.GPUs, want[cl.Name][0], want[cl.Name][1])
		}
	}
}

// TestDRAClaimConfig: a claim's Tessera configuration (opaque parameters of
// gpu.tessera.dev) is accepted by the API server, copied into the allocation by the
// scheduler and read by the agent at prepare: workConserving reaches the claim's
// limits file. A configuration with a misspelt field leaves its pod unschedulable with
// the field named, and no share is allocated for it.
func TestDRAClaimConfig(t *testing.T) {
	c := startCluster(t)
	const node = "dra-config"
	dir := t.TempDir()
	a, _, _ := c.draNode(node, dir)
	c.createDeviceClasses()
	c.startScheduler("tessera-scheduler.yaml")

	config := func(params string) resourceapi.DeviceClaimConfiguration {
		return resourceapi.DeviceClaimConfiguration{Requests: []string{"gpu"}, DeviceConfiguration: resourceapi.DeviceConfiguration{
			Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: dra.DriverName, Parameters: runtime.RawExtension{Raw: []byte(params)}}}}
	}
	podFor := func(cl *resourceapi.ResourceClaim) { c.claimPod(cl.Name, binpack, nil) }
	wc := c.newShareClaim("wc", "4Gi", "30", config(`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GPUConfig","workConserving":true}`))
	podFor(wc)
	plain := c.newShareClaim("plain", "4Gi", "30")
	podFor(plain)
	for _, cl := range []*resourceapi.ResourceClaim{wc, plain} {
		c.waitBound("pod-"+cl.Name, 30*time.Second)
		got, err := c.client.ResourceV1().ResourceClaims(c.ns).Get(c.ctx, cl.Name, metav1.GetOptions{})
		if err != nil || got.Status.Allocation == nil {
			t.Fatalf("claim %s not allocated: %v", cl.Name, err)
		}
		if r := a.prepare(t, c.ctx, got); r == nil || r.Error != "" {
			t.Fatalf("prepare %s: %+v", cl.Name, r)
		}
		l := readLimits(t, api.HostLimitsDir(filepath.Join(dir, "limits"), binding.ClaimCgroup(string(got.UID))))
		if want := cl.Name == "wc"; l.WorkConserving != want || len(l.GPUs) != 1 || l.GPUs[0].Cores != 30 {
			t.Errorf("claim %s: limits %+v, want work-conserving %v at 30%% cores", cl.Name, l, want)
		}
	}

	typo := c.newShareClaim("typo", "4Gi", "30", config(`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GPUConfig","workconserving":true}`))
	podFor(typo)
	if msg := c.waitUnschedulable("pod-typo", 30*time.Second); !strings.Contains(msg, `unknown field "workconserving"`) {
		t.Errorf("pod-typo: %q", msg)
	}
	if got, err := c.client.ResourceV1().ResourceClaims(c.ns).Get(c.ctx, typo.Name, metav1.GetOptions{}); err != nil || got.Status.Allocation != nil {
		t.Errorf("claim typo: %v, allocated %+v", err, got.Status.Allocation)
	}
}

// TestDRASharesOnDistinctDevices: a claim with shares in two requests and no
// distinctAttribute constraint leaves its pod unschedulable with the constraint to add
// (the allocator would give both requests the policy's first device, which the agent
// refuses: checked with the check switched off); with the constraint its shares land
// on two GPUs and the agent prepares it. One request of count: 2 needs no constraint
// (the allocator moves past the devices a request took).
func TestDRASharesOnDistinctDevices(t *testing.T) {
	c := startCluster(t)
	const node = "dra-distinct"
	dir := t.TempDir()
	a, _, _ := c.draNodeOf(node, dir, "t4-4x-pcie.yaml", 4)
	c.createDeviceClasses()
	c.startScheduler("tessera-scheduler.yaml")

	share := func(name string, count int64) resourceapi.DeviceRequest {
		return resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: dra.DriverName,
			AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count,
			Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
				dra.CapacityMemory: resource.MustParse("2Gi"), dra.CapacityCores: resource.MustParse("20")}}}}
	}
	create := func(name string, requests []resourceapi.DeviceRequest, constraints ...resourceapi.DeviceConstraint) {
		if _, err := c.client.ResourceV1().ResourceClaims(c.ns).Create(c.ctx, &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns},
			Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: requests, Constraints: constraints}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("claim %s: %v", name, err)
		}
		c.claimPod(name, binpack, nil)
	}
	// prepared checks that claim name is allocated two GPUs and prepared to 2 GiB and
	// 20 % on each.
	prepared := func(name string) {
		t.Helper()
		c.waitBound("pod-"+name, 30*time.Second)
		got, err := c.client.ResourceV1().ResourceClaims(c.ns).Get(c.ctx, name, metav1.GetOptions{})
		if err != nil || got.Status.Allocation == nil {
			t.Fatalf("claim %s not allocated: %v", name, err)
		}
		res := got.Status.Allocation.Devices.Results
		if len(res) != 2 || res[0].Device == res[1].Device {
			t.Fatalf("claim %s allocated %+v, want two devices", name, res)
		}
		if r := a.prepare(t, c.ctx, got); r == nil || r.Error != "" {
			t.Fatalf("prepare %s: %+v", name, r)
		}
		l := readLimits(t, api.HostLimitsDir(filepath.Join(dir, "limits"), binding.ClaimCgroup(string(got.UID))))
		if len(l.GPUs) != 2 || l.GPUs[0].UUID == l.GPUs[1].UUID || l.GPUs[0].MemoryMiB != 2048 || l.GPUs[1].Cores != 20 {
			t.Errorf("claim %s: limits %+v, want 2048 MiB and 20 %% cores on each of two GPUs", name, l.GPUs)
		}
	}
	create("together", []resourceapi.DeviceRequest{share("a", 1), share("b", 1)})
	if msg := c.waitUnschedulable("pod-together", 30*time.Second); !strings.Contains(msg, `{requests: ["a", "b"], distinctAttribute: gpu.tessera.dev/uuid}`) {
		t.Errorf("two requests of shares without the constraint: %q", msg)
	}
	create("apart", []resourceapi.DeviceRequest{share("a", 1), share("b", 1)},
		resourceapi.DeviceConstraint{Requests: []string{"a", "b"}, DistinctAttribute: ptr.To(resourceapi.FullyQualifiedName("gpu.tessera.dev/uuid"))})
	prepared("apart")
	create("count", []resourceapi.DeviceRequest{share("gpus", 2)})
	prepared("count")
}

// TestDRAWholeGPUsByExtendedResource: on a node in DRA mode, a pod that asks only
// tessera.dev/gpu runs unchanged: the whole-GPU DeviceClass names the resource in
// extendedResourceName, TesseraGPUShare passes the node, and the in-tree DRA plugin
// allocates that many whole devices in a claim it creates for the pod, which the agent
// prepares to whole GPUs. A share claim then gets another GPU; a whole-GPU pod with a
// model selection, which a DeviceClass cannot honour, is refused with the reason.
func TestDRAWholeGPUsByExtendedResource(t *testing.T) {
	c := startCluster(t)
	const node = "dra-whole"
	dir := t.TempDir()
	a, _, _ := c.draNodeOf(node, dir, "t4-4x-pcie.yaml", 4)
	c.createDeviceClasses()
	c.startScheduler("tessera-scheduler.yaml")

	c.createPod(newPod(c.ns, "whole-2", binpack, nil, gpuLimits{name: "c", gpu: "2"}))
	p, cl := c.extendedResourceClaim("whole-2")
	st := p.Status.ExtendedResourceClaimStatus
	if len(st.RequestMappings) != 1 || st.RequestMappings[0].ResourceName != "tessera.dev/gpu" || st.RequestMappings[0].ContainerName != "c" {
		t.Fatalf("pod's extended resource claim status %+v, want tessera.dev/gpu of container c", st)
	}
	if _, ok := p.Annotations[api.AnnotationAssignment]; ok {
		t.Error("the pod has a Tessera assignment: its GPUs are the claim's")
	}
	taken := map[string]bool{}
	for _, r := range cl.Status.Allocation.Devices.Results {
		taken[r.Device] = true
	}
	if len(taken) != 2 {
		t.Fatalf("claim %s allocated %+v, want two devices", cl.Name, cl.Status.Allocation.Devices.Results)
	}
	if r := a.prepare(t, c.ctx, cl); r == nil || r.Error != "" {
		t.Fatalf("prepare %s: %+v", cl.Name, r)
	}
	l := readLimits(t, api.HostLimitsDir(filepath.Join(dir, "limits"), binding.ClaimCgroup(string(cl.UID))))
	if len(l.GPUs) != 2 {
		t.Fatalf("limits %+v, want two GPUs", l.GPUs)
	}
	for _, g := range l.GPUs {
		if g.MemoryMiB != 15360 || g.Cores != 100 || !taken[dra.DeviceName(g.UUID)] {
			t.Errorf("limits of %s: %d MiB, %d%% cores; want the whole T4 (15360 MiB in config/simulated/t4-4x-pcie.yaml, 100%%) of an allocated device", g.UUID, g.MemoryMiB, g.Cores)
		}
	}

	// The two GPUs are all used: a share lands on another.
	c.shareClaim("after", binpack, "1Gi", "10")
	if d := c.claimDevice("after"); taken[d] {
		t.Errorf("a share was allocated %s, a GPU the whole-GPU pod holds", d)
	}
	// A selection only Tessera's annotations express: not served here.
	c.createPod(newPod(c.ns, "whole-model", binpack, map[string]string{api.AnnotationModelInclude: "T4"}, gpuLimits{name: "c", gpu: "1"}))
	if msg := c.waitUnschedulable("whole-model", 30*time.Second); !strings.Contains(msg, "extendedResourceName") {
		t.Errorf("whole-GPU pod with a model selection: %q", msg)
	}
}

// TestDRAWholeGPUsPlacedByPolicy: whole GPUs asked by the extended resource on a DRA
// node are chosen by the profile's device policy, as a claim's are, though the claim
// is the in-tree plugin's own: with a share on GPU 0, two whole GPUs go together to
// NUMA node 1 (GPUs 2 and 3), where first fit in slice order takes GPUs 1 and 2
// across the two NUMA nodes.
func TestDRAWholeGPUsPlacedByPolicy(t *testing.T) {
	c := startCluster(t)
	gpu := c.t4DRANode("dra-whole-policy")

	c.shareClaim("first", binpack, "1Gi", "10")
	if d := c.claimDevice("first"); d != gpu[0] {
		t.Fatalf("the first share on %s, want GPU 0 (%s)", d, gpu[0])
	}
	c.createPod(newPod(c.ns, "whole-pair", binpack, nil, gpuLimits{name: "c", gpu: "2"}))
	_, cl := c.extendedResourceClaim("whole-pair")
	var got []string
	for _, r := range cl.Status.Allocation.Devices.Results {
		got = append(got, r.Device)
	}
	slices.Sort(got)
	want := []string{gpu[2], gpu[3]}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("two whole GPUs on %v, want GPUs 2 and 3 of NUMA node 1 %v (first fit: GPUs 1 and 2)", got, want)
	}
}

// t4DRANode starts a node of four T4s (two per NUMA node) in DRA mode, the
// DeviceClasses and the scheduler, and returns the node's device names by GPU index.
func (c *cluster) t4DRANode(node string) []string {
	c.t.Helper()
	c.draNodeOf(node, c.t.TempDir(), "t4-4x-pcie.yaml", 4)
	gpu := make([]string, 4)
	for i := range gpu {
		gpu[i] = dra.DeviceName(c.gpuUUID(node, i))
	}
	c.createDeviceClasses()
	c.startScheduler("tessera-scheduler.yaml")
	return gpu
}

// extendedResourceClaim waits for the pod to be bound and returns it with the claim
// the scheduler made for its extended resources, allocated.
func (c *cluster) extendedResourceClaim(pod string) (*v1.Pod, *resourceapi.ResourceClaim) {
	t := c.t
	t.Helper()
	c.waitBound(pod, 30*time.Second)
	p, err := c.client.CoreV1().Pods(c.ns).Get(c.ctx, pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := p.Status.ExtendedResourceClaimStatus
	if st == nil {
		t.Fatalf("pod %s has no extended resource claim: %+v", pod, p.Status)
	}
	cl, err := c.client.ResourceV1().ResourceClaims(c.ns).Get(c.ctx, st.ResourceClaimName, metav1.GetOptions{})
	if err != nil || cl.Status.Allocation == nil {
		t.Fatalf("claim %s not allocated: %v", st.ResourceClaimName, err)
	}
	return p, cl
}

// shareClaim creates a claim for one share of a whole GPU (memory, cores; empty: the
// device's default) and a pod of profile using it.
func (c *cluster) shareClaim(name, profile, memory, cores string) *resourceapi.ResourceClaim {
	c.t.Helper()
	cl := c.newShareClaim(name, memory, cores)
	c.claimPod(cl.Name, profile, nil)
	return cl
}

// claimPod creates pod pod-<claim> of profile with annotations, one container using
// the claim.
func (c *cluster) claimPod(claim, profile string, annotations map[string]string) {
	c.t.Helper()
	p := newPod(c.ns, "pod-"+claim, profile, annotations)
	p.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim}}
	p.Spec.Containers = []v1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10", Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}}}}
	c.createPod(p)
}

// newShareClaim creates the claim of shareClaim, without a pod, with config.
func (c *cluster) newShareClaim(name, memory, cores string, config ...resourceapi.DeviceClaimConfiguration) *resourceapi.ResourceClaim {
	c.t.Helper()
	return c.newSelectedShareClaim(name, `device.attributes["gpu.tessera.dev"].type == "gpu"`, memory, cores, config...)
}

// newSelectedShareClaim is newShareClaim on the devices the CEL expression selects.
func (c *cluster) newSelectedShareClaim(name, selector, memory, cores string, config ...resourceapi.DeviceClaimConfiguration) *resourceapi.ResourceClaim {
	t := c.t
	t.Helper()
	req := resourceapi.ExactDeviceRequest{DeviceClassName: dra.DriverName,
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: selector}}},
		Capacity:  &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}}
	if memory != "" {
		req.Capacity.Requests[dra.CapacityMemory] = resource.MustParse(memory)
	}
	if cores != "" {
		req.Capacity.Requests[dra.CapacityCores] = resource.MustParse(cores)
	}
	cl, err := c.client.ResourceV1().ResourceClaims(c.ns).Create(c.ctx, &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &req}}, Config: config}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("claim %s: %v", name, err)
	}
	return cl
}

// claimDevice waits for the pod of claim name to be bound and returns the device its
// claim was allocated.
func (c *cluster) claimDevice(name string) string {
	t := c.t
	t.Helper()
	c.waitBound("pod-"+name, 30*time.Second)
	got, err := c.client.ResourceV1().ResourceClaims(c.ns).Get(c.ctx, name, metav1.GetOptions{})
	if err != nil || got.Status.Allocation == nil || len(got.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claim %s not allocated one device: %v %+v", name, err, got.Status)
	}
	return got.Status.Allocation.Devices.Results[0].Device
}

// TestDRAClaimsPlacedByPolicy: the Tessera profiles place claims on the GPU their
// device policy picks, where the in-tree allocator alone takes the first device that
// fits: Spread puts a second share on an empty GPU, Binpack a third on the fullest
// GPU it fits, though GPU 0 comes first and has room for both.
func TestDRAClaimsPlacedByPolicy(t *testing.T) {
	c := startCluster(t)
	gpu := c.t4DRANode("dra-t4")

	// Spread: the first share on GPU 0 (all empty, the first of equals), the second,
	// larger, on another GPU; first fit would put it on GPU 0 too.
	c.shareClaim("s1", spread, "4Gi", "20")
	if d := c.claimDevice("s1"); d != gpu[0] {
		t.Fatalf("s1 on %s, want GPU 0 (%s)", d, gpu[0])
	}
	c.shareClaim("s2", spread, "8Gi", "40")
	s2 := c.claimDevice("s2")
	if s2 == gpu[0] {
		t.Fatalf("spread put s2 beside s1 on GPU 0 (first fit), want an empty GPU")
	}
	// Binpack: the fullest GPU with room is s2's, though GPU 0 comes first.
	c.shareClaim("b1", binpack, "2Gi", "10")
	if d := c.claimDevice("b1"); d != s2 {
		t.Errorf("binpack put b1 on %s, want the fullest GPU %s", d, s2)
	}
	// The pod's own policy orders its claim's devices: Spread asked in a Binpack
	// profile's pod takes an empty GPU, not the fullest.
	c.newShareClaim("own", "1Gi", "10")
	c.claimPod("own", binpack, map[string]string{api.AnnotationDevicePolicy: "Spread"})
	if d := c.claimDevice("own"); d == s2 || d == gpu[0] {
		t.Errorf("a pod asking Spread in the Binpack profile was put on %s, which holds shares; want an empty GPU", d)
	}
	// An annotation a claim does not follow: unschedulable, with what to write instead.
	c.newShareClaim("model", "1Gi", "10")
	c.claimPod("model", binpack, map[string]string{api.AnnotationModelInclude: "T4"})
	if msg := c.waitUnschedulable("pod-model", 30*time.Second); !strings.Contains(msg, `device.attributes["gpu.tessera.dev"].model in the claim's request`) {
		t.Errorf("a claim pod with a model annotation: %q", msg)
	}
	// Fragmentation places validly beside them.
	c.shareClaim("f1", "tessera-fragmentation", "1Gi", "10")
	if d := c.claimDevice("f1"); !slices.Contains(gpu, d) {
		t.Errorf("fragmentation put f1 on %s, not a whole GPU", d)
	}
	// One container may use one Tessera claim (their limits mount at one path); two
	// containers may use one each.
	for _, n := range []string{"two-a", "two-b", "two-c", "two-d"} {
		c.newShareClaim(n, "1Gi", "5")
	}
	twoPod := func(name string, a, b []v1.ResourceClaim, claims ...string) {
		p := newPod(c.ns, name, binpack, nil)
		p.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "a", ResourceClaimName: &claims[0]}, {Name: "b", ResourceClaimName: &claims[1]}}
		p.Spec.Containers = []v1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10", Resources: v1.ResourceRequirements{Claims: a}}}
		if b != nil {
			p.Spec.Containers = append(p.Spec.Containers, v1.Container{Name: "d", Image: "registry.k8s.io/pause:3.10", Resources: v1.ResourceRequirements{Claims: b}})
		}
		c.createPod(p)
	}
	twoPod("one-container", []v1.ResourceClaim{{Name: "a"}, {Name: "b"}}, nil, "two-a", "two-b")
	if msg := c.waitUnschedulable("one-container", 30*time.Second); !strings.Contains(msg, `container "c" uses 2 claims of Tessera GPUs (a, b)`) {
		t.Errorf("two claims in one container: %q", msg)
	}
	twoPod("two-containers", []v1.ResourceClaim{{Name: "a"}}, []v1.ResourceClaim{{Name: "b"}}, "two-c", "two-d")
	c.waitBound("two-containers", 30*time.Second)

	// A pod of tessera.dev/* resources does not go to the DRA node: kubelet there
	// has none of them.
	c.createPod(newPod(c.ns, "plugin-pod", binpack, nil, gpuLimits{name: "c", gpu: "1", mem: "1024"}))
	if msg := c.waitUnschedulable("plugin-pod", 30*time.Second); !strings.Contains(msg, "through DRA") {
		t.Errorf("device-plugin pod on the DRA node: %q", msg)
	}
}

// TestDRAClaimBurst: a burst of 1,000 claims on six eight-H100 nodes, more than fit,
// with a node agent restarted after a third of them and the scheduler after two
// thirds: every claim placed is on one of the nodes' GPUs and on its pod's node, no
// GPU's memory or cores are consumed past its capacity, and what did not fit stays
// pending.
func TestDRAClaimBurst(t *testing.T) {
	c := startCluster(t)
	const nodes, gpus = 6, 8
	var agents []*draAgent
	var dirs []string
	for i := 0; i < nodes; i++ {
		dir := t.TempDir()
		a, _, _ := c.draNodeOf(fmt.Sprintf("burst-%d", i), dir, "h100-8x-two-nvlink-islands.yaml", gpus)
		agents, dirs = append(agents, a), append(dirs, dir)
	}
	c.createDeviceClasses()
	// 2 GiB and 5 % each: twenty fit an H100 by cores (39 by memory), so 960 of the
	// 1,000 fit the six nodes.
	const claims, fit = 1000, nodes * gpus * 20
	profiles := []string{binpack, spread, "tessera-fragmentation"}
	stop := c.startScheduler("tessera-scheduler.yaml")
	start := time.Now()
	for i := 0; i < claims; i++ {
		c.shareClaim(fmt.Sprintf("burst-%d", i), profiles[i%len(profiles)], "2Gi", "5")
		switch i {
		case claims / 3:
			// The agent of the first node restarts: it publishes its slices again
			// from its checkpoint while claims are being allocated on them.
			agents[0].stop()
			agents[0] = c.startDRAAgent("burst-0", filepath.Join(dirs[0], "topology.yaml"), dirs[0])
		case 2 * claims / 3:
			// The scheduler goes away and a new one takes over from what the API
			// server holds.
			stop()
			c.startScheduler("tessera-scheduler.yaml")
		}
	}
	allocated := func(ctx context.Context) ([]resourceapi.ResourceClaim, int, error) {
		l, err := c.client.ResourceV1().ResourceClaims(c.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, 0, err
		}
		n := 0
		for i := range l.Items {
			if l.Items[i].Status.Allocation != nil {
				n++
			}
		}
		return l.Items, n, nil
	}
	var n int
	err := wait.PollUntilContextTimeout(c.ctx, time.Second, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		_, n, err = allocated(ctx)
		return n >= fit, err
	})
	if err != nil {
		t.Fatalf("%d of %d claims allocated after %s, want %d: %v", n, claims, time.Since(start).Round(time.Second), fit, err)
	}
	t.Logf("%d claims allocated %s after the first was created", n, time.Since(start).Round(time.Second))
	// Settle: nothing more may be allocated.
	time.Sleep(3 * time.Second)
	items, n, err := allocated(c.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n != fit {
		t.Errorf("%d claims allocated after the burst settled, want %d", n, fit)
	}
	pods, err := c.client.CoreV1().Pods(c.ns).List(c.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nodeOf := map[string]string{}
	for i := range pods.Items {
		nodeOf[pods.Items[i].Name] = pods.Items[i].Spec.NodeName
	}
	type key struct{ pool, device string }
	mem, cores := map[key]int64{}, map[key]int64{}
	for i := range items {
		a := items[i].Status.Allocation
		if a == nil {
			if node := nodeOf["pod-"+items[i].Name]; node != "" {
				t.Errorf("claim %s is not allocated, its pod is bound to %s", items[i].Name, node)
			}
			continue
		}
		for _, r := range a.Devices.Results {
			k := key{r.Pool, r.Device}
			m, cs := r.ConsumedCapacity[dra.CapacityMemory], r.ConsumedCapacity[dra.CapacityCores]
			mem[k] += m.Value() >> 20
			cores[k] += cs.Value()
			if node := nodeOf["pod-"+items[i].Name]; node != "" && node != r.Pool {
				t.Errorf("claim %s allocated on %s, its pod bound to %s", items[i].Name, r.Pool, node)
			}
		}
	}
	if len(mem) != nodes*gpus {
		t.Errorf("claims on %d devices, want all %d GPUs", len(mem), nodes*gpus)
	}
	for k := range mem {
		if !strings.HasPrefix(k.pool, "burst-") || mem[k] > 81559 || cores[k] > 100 {
			t.Errorf("%s/%s: %d MiB, %d%% cores consumed", k.pool, k.device, mem[k], cores[k])
		}
	}
}

// claimNode waits for the pod of claim name to be bound and returns its node.
func (c *cluster) claimNode(name string) string {
	c.t.Helper()
	return c.waitBound("pod-"+name, 30*time.Second).Spec.NodeName
}

// TestDRANodeScore: nodes are scored for claim pods by the profile's node policy over
// what claims consume: Binpack keeps shares on the node it started, Spread sends
// them to the emptier one.
func TestDRANodeScore(t *testing.T) {
	c := startCluster(t)
	for _, node := range []string{"score-a", "score-b"} {
		c.draNodeOf(node, t.TempDir(), "t4-4x-pcie.yaml", 4)
	}
	c.createDeviceClasses()
	c.startScheduler("tessera-scheduler.yaml")
	c.shareClaim("b0", binpack, "2Gi", "10")
	packed := c.claimNode("b0")
	for i := 1; i < 4; i++ {
		name := fmt.Sprintf("b%d", i)
		c.shareClaim(name, binpack, "2Gi", "10")
		if n := c.claimNode(name); n != packed {
			t.Errorf("binpack put %s on %s, want %s beside the others", name, n, packed)
		}
	}
	for i := 0; i < 2; i++ {
		name := fmt.Sprintf("s%d", i)
		c.shareClaim(name, spread, "2Gi", "10")
		if n := c.claimNode(name); n == packed {
			t.Errorf("spread put %s on %s beside the binpacked shares", name, n)
		}
	}
}

// createDeviceClasses creates the DeviceClass of config/dra/deviceclass.yaml.
func (c *cluster) createDeviceClasses() {
	c.t.Helper()
	for _, dc := range readObjects[resourceapi.DeviceClass](c.t, "deviceclass.yaml") {
		if _, err := c.client.ResourceV1().DeviceClasses().Create(c.ctx, dc, metav1.CreateOptions{}); err != nil {
			c.t.Fatal(err)
		}
	}
}
