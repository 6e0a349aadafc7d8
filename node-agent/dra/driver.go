// SPDX-License-Identifier: Apache-2.0

// Package dra is the node agent's Dynamic Resource Allocation kubelet plugin, driver
// gpu.tessera.dev: it publishes the node's GPUs and MIG instances as shareable devices
// in ResourceSlices (slices.go) and prepares the claims kubelet hands it by binding each
// one through package binding, exactly as a container of the device-plugin path is
// bound, and giving its containers that binding as a CDI device of the claim's own
// (cdi.go). A node serves Tessera's GPUs either through the device plugin or through
// this driver, never both.
package dra

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/binding"
)

// Config configures a Driver.
type Config struct {
	NodeName string
	Client   kubernetes.Interface
	// Binder binds the claims; it must have a claim checkpoint (binding.Config.ClaimStore).
	Binder *binding.Binder
	// Inventory is the node's last published inventory: a claim's device names are
	// resolved to GPUs and MIG instances in it.
	Inventory func() (*api.NodeInventory, error)
	// ClaimSpecDir is the CDI directory the claims' specs are written to (one
	// transient spec per prepared claim); the runtime must read it.
	ClaimSpecDir string
	// ClaimKind is the vendor/class of the claims' CDI devices (DefaultClaimKind).
	ClaimKind string
	// PluginDir is the plugin's directory under kubelet's plugins directory (its
	// gRPC socket), RegistrarDir kubelet's plugin registration directory.
	PluginDir, RegistrarDir string
	Log                     logr.Logger
}

// Driver is the DRA kubelet plugin. Start serves it; Publish (re)publishes the node's
// devices.
type Driver struct {
	cfg    Config
	specs  claimSpecs
	mu     sync.Mutex
	helper *kubeletplugin.Helper
	last   *api.NodeInventory // published last, or waiting for Start
	fatal  chan error
}

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// New checks cfg.
func New(cfg Config) (*Driver, error) {
	if cfg.NodeName == "" || cfg.Client == nil || cfg.Binder == nil || cfg.Inventory == nil || cfg.ClaimSpecDir == "" {
		return nil, errors.New("dra: node name, client, binder, inventory and claim spec directory are required")
	}
	if cfg.ClaimKind == "" {
		cfg.ClaimKind = DefaultClaimKind
	}
	if cfg.PluginDir == "" {
		cfg.PluginDir = kubeletplugin.KubeletPluginsDir + "/" + DriverName
	}
	if cfg.RegistrarDir == "" {
		cfg.RegistrarDir = kubeletplugin.KubeletRegistryDir
	}
	specs, err := newClaimSpecs(cfg.ClaimSpecDir, cfg.ClaimKind)
	if err != nil {
		return nil, err
	}
	return &Driver{cfg: cfg, specs: specs, fatal: make(chan error, 1)}, nil
}

// Start registers the plugin with kubelet and serves it until ctx is done (Stop
// waits for that), then publishes what Publish was given before.
func (d *Driver) Start(ctx context.Context) error {
	ctx = klog.NewContext(ctx, d.cfg.Log)
	// The plugin's own directory is the driver's to make; kubelet's registration
	// directory is kubelet's.
	if err := os.MkdirAll(d.cfg.PluginDir, 0o750); err != nil {
		return fmt.Errorf("dra: plugin directory: %w", err)
	}
	h, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(DriverName),
		kubeletplugin.KubeClient(d.cfg.Client),
		kubeletplugin.NodeName(d.cfg.NodeName),
		kubeletplugin.PluginDataDirectoryPath(d.cfg.PluginDir),
		kubeletplugin.RegistrarDirectoryPath(d.cfg.RegistrarDir),
		// Health is published as device taints from the inventory.
		kubeletplugin.HealthService(false),
	)
	if err != nil {
		return fmt.Errorf("dra: starting the kubelet plugin: %w", err)
	}
	d.mu.Lock()
	d.helper = h
	inv := d.last
	d.mu.Unlock()
	if inv != nil {
		return d.Publish(inv)
	}
	return nil
}

// Stop stops serving and publishing; the published slices stay (kubelet removes a
// node's slices when its driver is gone for good).
func (d *Driver) Stop() {
	d.mu.Lock()
	h := d.helper
	d.helper = nil
	d.mu.Unlock()
	h.Stop()
}

// Publish publishes the devices of inv; before Start it is kept for Start.
func (d *Driver) Publish(inv *api.NodeInventory) error {
	d.mu.Lock()
	d.last = inv
	h := d.helper
	d.mu.Unlock()
	if h == nil {
		return nil
	}
	err := h.PublishResources(context.Background(), Resources(d.cfg.NodeName, inv))
	if errors.Is(err, context.Canceled) {
		return nil // stopping
	}
	return err
}

// PrepareResourceClaims binds each claim: the device results of this driver in its
// allocation, each with the memory and cores it consumed, become one binding shared by
// the claim's containers, configured by the claim's Tessera configuration
// (ClaimConfig). A claim that cannot be bound gets its error (kubelet retries
// and shows it on the pod); the others are prepared.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		if c == nil {
			continue
		}
		start := time.Now()
		devs, err := d.prepare(ctx, c)
		if err != nil {
			d.cfg.Log.Error(err, "claim not prepared", "namespace", c.Namespace, "claim", c.Name, "uid", c.UID)
		} else {
			d.cfg.Log.Info("claim prepared", "namespace", c.Namespace, "claim", c.Name, "uid", c.UID, "devices", len(devs), "took", time.Since(start))
		}
		out[c.UID] = kubeletplugin.PrepareResult{Devices: devs, Err: err}
	}
	return out, nil
}

func (d *Driver) prepare(ctx context.Context, c *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	if c.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s/%s is not allocated", c.Namespace, c.Name)
	}
	inv, err := d.cfg.Inventory()
	if err != nil {
		return nil, fmt.Errorf("claim %s/%s: the node's GPU inventory is not available: %w", c.Namespace, c.Name, err)
	}
	results, grants, err := Grants(c, d.cfg.NodeName, inv)
	if err != nil {
		return nil, err
	}
	if len(results) == 0 {
		return []kubeletplugin.Device{}, nil
	}
	cfg, err := ClaimConfig(c, results)
	if err != nil {
		return nil, err
	}
	// Checked before anything is bound: a claim bound without its CDI device would
	// hold its share with no container to use it.
	if err := d.specs.validName(string(c.UID)); err != nil {
		return nil, fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)
	}
	claim := binding.Claim{UID: string(c.UID), Namespace: c.Namespace, Name: c.Name, Devices: grants, WorkConserving: cfg.IsWorkConserving()}
	e, err := d.cfg.Binder.BindClaim(claim)
	var refused *binding.RefusedError
	if errors.As(err, &refused) && d.releaseStale(ctx, string(c.UID)) > 0 {
		e, err = d.cfg.Binder.BindClaim(claim)
	}
	if errors.As(err, &refused) {
		return nil, fmt.Errorf("Tessera refused the claim: %s", refused.Reason)
	}
	if err != nil {
		return nil, err
	}
	if err := d.specs.write(string(c.UID), e); err != nil {
		return nil, fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)
	}
	claimDevice := d.specs.qualifiedName(string(c.UID))
	out := make([]kubeletplugin.Device, len(results))
	for i, r := range results {
		ids := []string{}
		if len(e.CDIDevices) == len(results) {
			ids = append(ids, e.CDIDevices[i])
		}
		// Every result carries the claim's device: a container may name one request of
		// the claim only, and must get the claim's limits with it.
		ids = append(ids, claimDevice)
		out[i] = kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device, ShareID: r.ShareID, CDIDeviceIDs: ids}
	}
	return out, nil
}

// releaseStale unbinds the claims prepared here that the API no longer allocates
// (deleted, re-created under another UID, or deallocated) and returns how many. The
// resource claim controller deallocates a claim once no pod uses it, and the
// scheduler gives its share away at once, while kubelet unprepares it on its own
// schedule: a claim allocated the freed share could reach Prepare first, and be
// refused for room the old claim still held (each such pod then waited for kubelet's
// retry, 14 s on a real node). Kubelet's later Unprepare of a released claim finds
// nothing to do. A claim the API cannot be asked about is kept; except, the claim
// being prepared.
func (d *Driver) releaseStale(ctx context.Context, except string) int {
	if d.cfg.Client == nil {
		return 0
	}
	n := 0
	for _, rec := range d.cfg.Binder.Claims() {
		if rec.ContainerID == except {
			continue
		}
		c, err := d.cfg.Client.ResourceV1().ResourceClaims(rec.Namespace).Get(ctx, rec.Pod, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			continue
		case string(c.UID) == rec.ContainerID && c.Status.Allocation != nil:
			continue
		}
		if err := d.unprepare(rec.ContainerID); err != nil {
			d.cfg.Log.Error(err, "released claim not unprepared", "namespace", rec.Namespace, "claim", rec.Pod, "uid", rec.ContainerID)
			continue
		}
		d.cfg.Log.Info("claim released by the API before kubelet unprepared it: its share is freed", "namespace", rec.Namespace, "claim", rec.Pod, "uid", rec.ContainerID)
		n++
	}
	return n
}

// Grants returns the allocation results of this driver in a claim and the grant each
// stands for: the device (a GPU or MIG instance of inv, by its device name in the
// node's pool) with the memory and cores the result consumed; a result without a
// consumed capacity takes the capacity's default, the whole device. An allocation
// for another node's pool, of a device the node does not publish, or consuming a
// malformed amount is an error that says so.
func Grants(c *resourceapi.ResourceClaim, nodeName string, inv *api.NodeInventory) ([]resourceapi.DeviceRequestAllocationResult, []api.DeviceGrant, error) {
	who := fmt.Sprintf("claim %s/%s", c.Namespace, c.Name)
	if c.Status.Allocation == nil {
		return nil, nil, fmt.Errorf("%s is not allocated", who)
	}
	type dev struct {
		uuid   string
		index  int
		memMiB int64
	}
	byName := map[string]dev{}
	for i := range inv.GPUs {
		g := &inv.GPUs[i]
		if g.MIG == nil {
			byName[DeviceName(g.UUID)] = dev{g.UUID, g.Index, g.MemoryMiB}
			continue
		}
		for _, m := range g.MIG.Instances {
			byName[DeviceName(m.UUID)] = dev{m.UUID, g.Index, m.MemoryMiB}
		}
	}
	var results []resourceapi.DeviceRequestAllocationResult
	var grants []api.DeviceGrant
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != DriverName {
			continue
		}
		if r.Pool != nodeName {
			return nil, nil, fmt.Errorf("%s: request %q is allocated device %s of pool %q, not of this node's pool %q", who, r.Request, r.Device, r.Pool, nodeName)
		}
		dv, ok := byName[r.Device]
		if !ok {
			return nil, nil, fmt.Errorf("%s: request %q is allocated device %q, which this node does not publish (a GPU that is gone, or a GPU in MIG mode as a whole)", who, r.Request, r.Device)
		}
		g := api.DeviceGrant{UUID: dv.uuid, Index: dv.index, MemoryMiB: dv.memMiB, Cores: 100}
		for name, q := range r.ConsumedCapacity {
			switch name {
			case CapacityMemory:
				m, err := quantityMiB(q)
				if err != nil {
					return nil, nil, fmt.Errorf("%s: request %q on %s: %w", who, r.Request, r.Device, err)
				}
				g.MemoryMiB = m
			case CapacityCores:
				v, ok := q.AsInt64()
				if !ok || v < 1 || v > 100 {
					return nil, nil, fmt.Errorf("%s: request %q on %s consumes cores %s; cores are a whole percent 1..100", who, r.Request, r.Device, q.String())
				}
				g.Cores = int(v)
			default:
				return nil, nil, fmt.Errorf("%s: request %q on %s consumes capacity %q, which the device does not have", who, r.Request, r.Device, name)
			}
		}
		results = append(results, r)
		grants = append(grants, g)
	}
	return results, grants, nil
}

// UnprepareResourceClaims unbinds each claim and removes its CDI spec. A claim that
// is not prepared is no error.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		err := d.unprepare(string(c.UID))
		if err != nil {
			d.cfg.Log.Error(err, "claim not unprepared", "namespace", c.Namespace, "claim", c.Name, "uid", c.UID)
		} else {
			d.cfg.Log.Info("claim unprepared", "namespace", c.Namespace, "claim", c.Name, "uid", c.UID)
		}
		out[c.UID] = err
	}
	return out, nil
}

func (d *Driver) unprepare(uid string) error {
	// The spec first: once it is gone no new container gets the claim's binding.
	if err := d.specs.remove(uid); err != nil {
		return err
	}
	return d.cfg.Binder.UnbindClaim(uid)
}

// HandleError logs errors of the plugin's background work. A recoverable one (a
// slice the API server refused, say) is only logged; any other (a gRPC server that
// stopped) is also sent on Fatal, so that the agent stops and its pod restarts rather
// than run without its plugin.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	recoverable := errors.Is(err, kubeletplugin.ErrRecoverable)
	d.cfg.Log.Error(err, msg, "recoverable", recoverable)
	if !recoverable {
		select {
		case d.fatal <- fmt.Errorf("%s: %w", msg, err):
		default:
		}
	}
}

// Fatal delivers the first error after which the plugin no longer serves kubelet.
func (d *Driver) Fatal() <-chan error { return d.fatal }

// Registered reports whether kubelet has registered the plugin, and why not when it
// said so.
func (d *Driver) Registered() (bool, string) {
	d.mu.Lock()
	h := d.helper
	d.mu.Unlock()
	if h == nil {
		return false, "not started"
	}
	st := h.RegistrationStatus()
	switch {
	case st == nil:
		return false, "kubelet has not registered it yet"
	case !st.PluginRegistered:
		return false, "kubelet refused it: " + st.Error
	}
	return true, ""
}

// WatchHealthStatus is not served (HealthService(false)): unhealthy devices are
// tainted in the slices instead.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}
