// SPDX-License-Identifier: Apache-2.0

package dra

import (
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/api"
)

// ClaimConfig is the Tessera configuration (api.GPUConfig) that applies to the claim's
// results of this driver, from its allocation's configuration: class entries first,
// then the claim's, each over the ones before that name the same request (an entry
// without requests names all). A claim is bound as one container (one limits file),
// so every result must come out alike; an entry that does not decode, or results
// configured differently, are errors that say what to change.
func ClaimConfig(c *resourceapi.ResourceClaim, results []resourceapi.DeviceRequestAllocationResult) (api.GPUConfig, error) {
	who := fmt.Sprintf("claim %s/%s", c.Namespace, c.Name)
	var entries []api.GPUConfigEntry
	if c.Status.Allocation != nil {
		for _, source := range []resourceapi.AllocationConfigSource{resourceapi.AllocationConfigSourceClass, resourceapi.AllocationConfigSourceClaim} {
			for i := range c.Status.Allocation.Devices.Config {
				e := &c.Status.Allocation.Devices.Config[i]
				if e.Source == source && e.Opaque != nil && e.Opaque.Driver == DriverName {
					entries = append(entries, api.GPUConfigEntry{Requests: e.Requests, Parameters: e.Opaque.Parameters.Raw, Origin: configOrigin(e)})
				}
			}
		}
	}
	var out api.GPUConfig
	for i, r := range results {
		cfg, err := api.ResolveGPUConfig(entries, r.Request)
		if err != nil {
			return api.GPUConfig{}, fmt.Errorf("%s: %w", who, err)
		}
		if i == 0 {
			out = cfg
			continue
		}
		if cfg.IsWorkConserving() != out.IsWorkConserving() {
			return api.GPUConfig{}, fmt.Errorf("%s: request %q is configured workConserving: %t and request %q workConserving: %t; "+
				"a claim's devices share one limits file, so configure all its requests alike or put them in separate claims",
				who, results[0].Request, out.IsWorkConserving(), r.Request, cfg.IsWorkConserving())
		}
	}
	return out, nil
}

func configOrigin(e *resourceapi.DeviceAllocationConfiguration) string {
	from := "from the claim"
	if e.Source == resourceapi.AllocationConfigSourceClass {
		from = "from its DeviceClass"
	}
	if len(e.Requests) == 0 {
		return from
	}
	return fmt.Sprintf("%s for requests %s", from, strings.Join(e.Requests, ", "))
}
