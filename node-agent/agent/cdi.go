// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"

	"github.com/go-logr/logr"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-dev/tessera/node-agent/cdi"
	"github.com/tessera-dev/tessera/node-agent/gpu"
)

func (c *Config) validateCDI() error {
	switch c.NRIUnavailable {
	case "", NRIUnavailableRefuse:
	case NRIUnavailableFallback:
		if c.NRI && (c.HookLibrary == "" || !c.DevicePlugin) {
			return errors.New("--nri-unavailable=fallback needs --hook-library and --device-plugin: the fallback binding works through both")
		}
	default:
		return fmt.Errorf("--nri-unavailable %q must be %s or %s", c.NRIUnavailable, NRIUnavailableRefuse, NRIUnavailableFallback)
	}
	if c.CgroupRoot != "" && !filepath.IsAbs(c.CgroupRoot) {
		return fmt.Errorf("--cgroup-root %q must be an absolute path", c.CgroupRoot)
	}
	if c.CDISpecDir == "" {
		return nil
	}
	if !filepath.IsAbs(c.CDISpecDir) {
		return fmt.Errorf("--cdi-spec-dir %q must be an absolute path", c.CDISpecDir)
	}
	if filepath.Base(filepath.Clean(c.DevDir)) != "dev" {
		return fmt.Errorf("--dev-dir %q must end in /dev with --cdi-spec-dir (the CDI spec names device nodes under it)", c.DevDir)
	}
	_, err := cdi.New(c.cdiConfig(logr.Discard()))
	if err != nil {
		return fmt.Errorf("--cdi-*: %w", err)
	}
	return nil
}

func (c *Config) cdiConfig(log logr.Logger) cdi.Config {
	return cdi.Config{
		SpecDir: c.CDISpecDir, Kind: c.CDIKind, DriverRoot: c.CDIDriverRoot, HostDriverRoot: c.CDIHostDriverRoot,
		DevRoot: filepath.Dir(filepath.Clean(c.DevDir)), HostDevRoot: "/",
		LibrarySearchPaths: c.CDILibrarySearchPaths, Hook: c.CDIHook, Log: log,
	}
}

func (a *Agent) newCDI() (*cdi.Generator, error) {
	return cdi.New(a.cfg.cdiConfig(a.log.WithName("cdi")))
}

// syncCDI writes the CDI spec when the node's devices changed, and records whether
// the node has a usable one.
func (a *Agent) syncCDI() {
	devs, err := a.source.Devices()
	if err != nil {
		a.setRequirement("cdi", fmt.Sprintf("listing the node's GPUs for the CDI spec: %v", err))
		return
	}
	wrote, s, err := a.CDI.Sync(devs)
	if err != nil {
		a.setRequirement("cdi", fmt.Sprintf("the node's CDI spec could not be written: %v", err))
		return
	}
	if wrote {
		a.log.Info("CDI spec written", "path", s.Path, "kind", s.Kind, "devices", len(s.Devices), "libraries", len(s.Libraries),
			"deviceNodes", len(s.DeviceNodes), "hook", s.Hook, "libraryDir", s.LibraryDir)
		if len(s.Missing) > 0 {
			a.log.Error(fmt.Errorf("the driver's discovery found no device for %v", s.Missing),
				"GPUs left out of the CDI spec; containers granted them are refused", "path", s.Path)
		}
	}
	a.setRequirement("cdi", "")
}

// allocate is the device plugin's addition to each GPU container: it refuses the
// container while the node lacks a requirement (kubelet then fails the pod with the
// reason instead of starting it without limits) and adds what the fallback binding
// needs.
func (a *Agent) allocate(r *pluginapi.ContainerAllocateResponse) error {
	if why := a.req.refusal(); why != "" {
		return errors.New(why)
	}
	return a.fallbackAllocate(r)
}

// fallbackCDIDevices names every whole GPU's CDI device: the fallback binding gives
// a container all of them (as it gives all device nodes without CDI), and the hook
// shows it only its assigned ones.
func (a *Agent) fallbackCDIDevices(devs []gpu.Device) ([]string, error) {
	var uuids []string
	for _, d := range devs {
		if d.ParentUUID == "" {
			uuids = append(uuids, d.UUID)
		}
	}
	return a.CDI.DeviceNames(uuids)
}

// PrintCDISpec writes the node's CDI spec into --cdi-spec-dir and prints what it
// holds, as JSON (needs the driver, not the API server).
func PrintCDISpec(w io.Writer, c *Config, log logr.Logger) error {
	if c.CDISpecDir == "" {
		return errors.New("--cdi-spec-dir is empty: CDI is off")
	}
	if err := c.validateCDI(); err != nil {
		return err
	}
	src, err := OpenSource(c, log)
	if err != nil {
		return err
	}
	defer src.Close()
	devs, err := src.Devices()
	if err != nil {
		return err
	}
	g, err := cdi.New(c.cdiConfig(log.WithName("cdi")))
	if err != nil {
		return err
	}
	s, err := g.Generate(devs)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(s)
}
