// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/binding"
	"github.com/tessera-dev/tessera/node-agent/bindserver"
	"github.com/tessera-dev/tessera/node-agent/gpu"
)

// fallbackReconcile is how often records of containers that are gone are forgotten
// (NRI tells the agent of removals; without it the pod cache does).
const fallbackReconcile = 30 * time.Second

func (c *Config) validateFallback() error {
	if !c.BindFallback {
		return nil
	}
	switch {
	case c.NRI:
		return errors.New("--bind-fallback replaces the NRI binding: set --nri=false with it")
	case !c.DevicePlugin:
		return errors.New("--bind-fallback needs --device-plugin: its Allocate mounts the socket and the hook into GPU containers")
	case c.HookLibrary == "":
		return errors.New("--bind-fallback needs --hook-library: the hook is what asks for the limits")
	case !filepath.IsAbs(c.BindSocket):
		return fmt.Errorf("--bind-socket %q must be an absolute path", c.BindSocket)
	}
	return nil
}

// fallback is the binding at the first CUDA call: the socket server, which identifies
// callers' pods in the agent's cache of this node's pods.
type fallback struct {
	a      *Agent
	server *bindserver.Server
}

func (a *Agent) newFallback() (*fallback, error) {
	f := &fallback{a: a}
	s, err := bindserver.New(bindserver.Config{
		Socket: a.cfg.BindSocket, ProcRoot: a.cfg.ProcRoot, Pods: a.pods, Binder: a.Binder, Log: a.log.WithName("fallback"),
		OnRefused: func(pod *corev1.Pod, _ string, reason string) {
			a.Metrics.ContainerRefused()
			if pod != nil {
				a.podEvent(pod.Namespace, pod.Name, string(pod.UID), "GPUContainerRefused", reason)
			}
		},
	})
	if err != nil {
		return nil, err
	}
	f.server = s
	return f, nil
}

// run serves the socket once the pod cache is synchronised (a caller before that
// would be refused as a pod not on this node), and forgets containers that are gone.
func (f *fallback) run(ctx context.Context) error {
	if !f.a.pods.synced(ctx) {
		return nil
	}
	if err := f.server.Listen(); err != nil {
		return err
	}
	go func() {
		t := time.NewTicker(fallbackReconcile)
		defer t.Stop()
		for {
			for _, err := range f.server.Reconcile() {
				f.a.log.Error(err, "forgetting a container that is gone")
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return f.server.Run(ctx)
}

// fallbackAllocate adds to every GPU container's allocation what the binding at the
// first CUDA call needs. It is the same for every container: Allocate does not know
// the pod, and does not guess it. Without NRI nothing narrows the device cgroup per
// container, so every GPU's device node is given; the hook shows the container only
// its assigned GPUs, and the watchdog catches a process that goes around the hook.
func (a *Agent) fallbackAllocate(r *pluginapi.ContainerAllocateResponse) error {
	if !a.cfg.BindFallback {
		return nil
	}
	devs, err := a.source.Devices()
	if err != nil {
		return fmt.Errorf("listing the node's GPUs: %w", err)
	}
	if a.CDI != nil {
		// The runtime adds the GPUs' device nodes and the driver's files from the
		// node's CDI spec (kubelet passes the names on through the CRI).
		names, err := a.fallbackCDIDevices(devs)
		if err != nil {
			return err
		}
		for _, n := range names {
			r.CdiDevices = append(r.CdiDevices, &pluginapi.CDIDevice{Name: n})
		}
		return a.fallbackMounts(r, devs)
	}
	seen := map[int]bool{}
	add := func(name string, required bool) error {
		if _, err := os.Stat(filepath.Join(a.cfg.DevDir, name)); err != nil {
			if required {
				return fmt.Errorf("device node /dev/%s: %w", name, err)
			}
			return nil
		}
		r.Devices = append(r.Devices, &pluginapi.DeviceSpec{ContainerPath: "/dev/" + name, HostPath: "/dev/" + name, Permissions: "rw"})
		return nil
	}
	for _, d := range devs {
		if d.ParentUUID != "" || d.Minor < 0 || seen[d.Minor] {
			continue
		}
		seen[d.Minor] = true
		if err := add(fmt.Sprintf("nvidia%d", d.Minor), true); err != nil {
			return err
		}
	}
	for _, c := range []struct {
		name     string
		required bool
	}{{"nvidiactl", true}, {"nvidia-uvm", true}, {"nvidia-uvm-tools", false}} {
		if err := add(c.name, c.required); err != nil {
			return err
		}
	}
	if err := a.fallbackMounts(r, devs); err != nil {
		return err
	}
	if r.Envs == nil {
		r.Envs = map[string]string{}
	}
	// Under the NVIDIA container runtime this brings the driver's libraries; the
	// devices it adds are the ones given above anyway.
	r.Envs[binding.EnvVisibleDevices] = "all"
	return nil
}

// fallbackMounts adds the hook, its preload file, the socket's directory, and the share
// directories and turn files of devs, the node's GPUs and MIG instances.
func (a *Agent) fallbackMounts(r *pluginapi.ContainerAllocateResponse, devs []gpu.Device) error {
	r.Mounts = append(r.Mounts,
		// The socket's directory, read-only where the limits file would otherwise be:
		// the hook finds the socket there and the tenant can add nothing beside it.
		&pluginapi.Mount{ContainerPath: api.ContainerLimitsDir, HostPath: filepath.Dir(a.cfg.BindSocket), ReadOnly: true},
		&pluginapi.Mount{ContainerPath: a.cfg.HookLibrary, HostPath: a.cfg.HookLibrary, ReadOnly: true},
		&pluginapi.Mount{ContainerPath: binding.PreloadPath, HostPath: filepath.Join(a.cfg.StateDir, "ld.so.preload"), ReadOnly: true},
	)
	// Likewise every GPU's share directory, read-only: the hook paces a container
	// granted no cores on a GPU to the share its file gives (binding, shares.go).
	var uuids []string
	for _, d := range devs {
		uuids = append(uuids, d.UUID)
	}
	shares, err := binding.ShareDirMounts(a.cfg.LimitsRoot, uuids)
	if err != nil {
		return err
	}
	for _, m := range shares {
		r.Mounts = append(r.Mounts, &pluginapi.Mount{ContainerPath: m.Destination, HostPath: m.Source, ReadOnly: true})
	}
	if dir := a.cfg.TurnsDir; dir != "" {
		// Whether the container will be paced, and on which GPUs, is not known before
		// its first CUDA call, so every GPU container gets the turn file of every GPU
		// and MIG instance of the node, each file mounted on its own (binding,
		// turns.go): the hook uses those of the GPUs it paces the container on.
		mounts, err := binding.TurnFileMounts(dir, uuids)
		if err != nil {
			return err
		}
		for _, m := range mounts {
			r.Mounts = append(r.Mounts, &pluginapi.Mount{ContainerPath: m.Destination, HostPath: m.Source})
		}
	}
	return nil
}
