// SPDX-License-Identifier: Apache-2.0

package dra

import (
	"fmt"
	"os"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-dev/tessera/node-agent/binding"
)

// DefaultClaimKind is the vendor/class of the claims' CDI devices: one device per
// prepared claim, named by the claim's UID, in a transient spec of its own. It
// carries what the binding gives every container of the claim besides its GPUs (which
// come from the node's spec, tessera.dev/gpu=<UUID>): the limits directory, the shared
// region directory, the hook and its preload file, turn files, share directories and
// the MPS client's directories and environment.
const DefaultClaimKind = "tessera.dev/claim"

type claimSpecs struct {
	dir, vendor, class string
}

func newClaimSpecs(dir, kind string) (claimSpecs, error) {
	vendor, class := parser.ParseQualifier(kind)
	if err := parser.ValidateVendorName(vendor); err != nil {
		return claimSpecs{}, fmt.Errorf("dra: claim CDI kind %q: %w", kind, err)
	}
	if err := parser.ValidateClassName(class); err != nil {
		return claimSpecs{}, fmt.Errorf("dra: claim CDI kind %q: %w", kind, err)
	}
	return claimSpecs{dir: dir, vendor: vendor, class: class}, nil
}

func (s claimSpecs) qualifiedName(uid string) string {
	return parser.QualifiedName(s.vendor, s.class, uid)
}

// validName checks that a claim UID can name its CDI device.
func (s claimSpecs) validName(uid string) error {
	if err := parser.ValidateDeviceName(uid); err != nil {
		return fmt.Errorf("its UID %q cannot name a CDI device: %w", uid, err)
	}
	return nil
}

func (s claimSpecs) fileName(uid string) string {
	return cdiapi.GenerateTransientSpecName(s.vendor, s.class, uid) + ".json"
}

func (s claimSpecs) cache() (*cdiapi.Cache, error) {
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return nil, fmt.Errorf("claim CDI spec directory: %w", err)
	}
	c, err := cdiapi.NewCache(cdiapi.WithSpecDirs(s.dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("claim CDI spec directory: %w", err)
	}
	return c, nil
}

// claimSpec is the CDI spec of one claim's device from its binding's edits.
func (s claimSpecs) claimSpec(uid string, e *binding.Edits) (*specs.Spec, error) {
	edits := specs.ContainerEdits{}
	for _, kv := range e.Env {
		edits.Env = append(edits.Env, kv[0]+"="+kv[1])
	}
	// Without the node's spec (no --cdi-spec-dir) the binding names the device nodes
	// itself, and the claim's device carries them.
	for _, n := range e.Devices {
		mode := os.FileMode(n.FileMode)
		uid, gid := n.UID, n.GID
		edits.DeviceNodes = append(edits.DeviceNodes, &specs.DeviceNode{
			Path: n.Path, Type: n.Type, Major: n.Major, Minor: n.Minor, FileMode: &mode, UID: &uid, GID: &gid,
		})
	}
	for _, m := range e.Mounts {
		if m.Type != "" {
			return nil, fmt.Errorf("the binding asks for a %s file system at %s, which a claim's CDI device does not give", m.Type, m.Destination)
		}
		// As the NRI binding mounts them: nosuid and nodev always, rw said outright.
		opts := []string{"rbind", "nosuid", "nodev", "rw"}
		if m.ReadOnly {
			opts[3] = "ro"
		}
		edits.Mounts = append(edits.Mounts, &specs.Mount{HostPath: m.Source, ContainerPath: m.Destination, Type: "bind", Options: opts})
	}
	spec := &specs.Spec{
		Kind:    s.vendor + "/" + s.class,
		Devices: []specs.Device{{Name: uid, ContainerEdits: edits}},
	}
	v, err := cdiapi.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, err
	}
	spec.Version = v
	return spec, nil
}

// write writes (or replaces) the claim's spec; the cache validates it and renames it
// into place, so a runtime never reads half a spec.
func (s claimSpecs) write(uid string, e *binding.Edits) error {
	spec, err := s.claimSpec(uid, e)
	if err != nil {
		return fmt.Errorf("claim CDI spec: %w", err)
	}
	c, err := s.cache()
	if err != nil {
		return err
	}
	if err := c.WriteSpec(spec, s.fileName(uid)); err != nil {
		return fmt.Errorf("claim CDI spec: %w", err)
	}
	return nil
}

// remove removes the claim's spec; none is no error.
func (s claimSpecs) remove(uid string) error {
	c, err := s.cache()
	if err != nil {
		return err
	}
	if err := c.RemoveSpec(s.fileName(uid)); err != nil {
		return fmt.Errorf("claim CDI spec: %w", err)
	}
	return nil
}
