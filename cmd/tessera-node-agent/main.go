// SPDX-License-Identifier: Apache-2.0

// Command tessera-node-agent is Tessera's node agent: it publishes the node's GPU
// inventory, connects GPU containers to the GPUs and limits the scheduler assigned
// them, and watches real GPU usage. See docs/node-agent.md.
package main

import (
	"os"

	"github.com/tessera-dev/tessera/cmd/tessera-node-agent/app"
	"github.com/tessera-dev/tessera/node-agent/mps"
)

// version and revision are set at link time (make agent, make images).
var (
	version  = "dev"
	revision = "unknown"
)

func main() {
	// The agent's binary also starts each MPS control daemon in its mount namespace.
	mps.RunExecHelper()
	os.Exit(app.Run(os.Args[1:], version, revision))
}
