// SPDX-License-Identifier: Apache-2.0

// Command nvmlprobe links go-nvml, as the node agent does: the SBOM test reads its
// modules back from the binary's build information.
package main

import "github.com/NVIDIA/go-nvml/pkg/nvml"

func main() { _ = nvml.New() }
