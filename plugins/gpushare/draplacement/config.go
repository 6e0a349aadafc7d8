// SPDX-License-Identifier: Apache-2.0

package draplacement

import (
	"fmt"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/api"
)

// configProblem is why pod cannot run for a Tessera configuration (api.GPUConfig,
// opaque parameters of DriverName) that does not decode, in one of its claims not yet
// allocated or in the DeviceClass of one of their requests, or "". The node agent would
// refuse such a claim at prepare, after the scheduler had given it a share; here the
// pod stays pending with the reason instead.
func (o *orderer) configProblem(pod *v1.Pod) string {
	mgr := o.h.SharedDRAManager()
	for _, claim := range o.claimsOf(pod) {
		if claim.Status.Allocation != nil {
			continue
		}
		for j := range claim.Spec.Devices.Config {
			if why := opaqueProblem(claim.Spec.Devices.Config[j].Opaque); why != "" {
				return fmt.Sprintf("ResourceClaim %s/%s, spec.devices.config[%d]: %s; a claim's spec cannot change: "+
					"create the claim (or the pod whose template made it) again with the configuration fixed", claim.Namespace, claim.Name, j, why)
			}
		}
		for j := range claim.Spec.Devices.Requests {
			r := &claim.Spec.Devices.Requests[j]
			var classes []string
			if r.Exactly != nil {
				classes = append(classes, r.Exactly.DeviceClassName)
			}
			for k := range r.FirstAvailable {
				classes = append(classes, r.FirstAvailable[k].DeviceClassName)
			}
			for _, cn := range classes {
				if !o.isTessera(cn) {
					continue
				}
				class, err := mgr.DeviceClasses().Get(cn)
				if err != nil || class == nil {
					continue
				}
				for k := range class.Spec.Config {
					if why := opaqueProblem(class.Spec.Config[k].Opaque); why != "" {
						return fmt.Sprintf("DeviceClass %s, spec.config[%d] (the cluster's, for request %q of ResourceClaim %s/%s): %s",
							cn, k, r.Name, claim.Namespace, claim.Name, why)
					}
				}
			}
		}
	}
	return ""
}

// opaqueProblem is what is wrong with a configuration entry of DriverName, or "" (also
// for another driver's).
func opaqueProblem(o *resourceapi.OpaqueDeviceConfiguration) string {
	if o == nil || o.Driver != DriverName {
		return ""
	}
	if _, err := api.DecodeGPUConfig(o.Parameters.Raw); err != nil {
		return err.Error()
	}
	return ""
}
