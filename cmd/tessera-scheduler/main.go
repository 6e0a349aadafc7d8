// SPDX-License-Identifier: Apache-2.0

// Command tessera-scheduler is kube-scheduler with Tessera's GPU-sharing plugin
// compiled in. It runs as a secondary scheduler: pods opt in with spec.schedulerName.
// Everything else (flags, config, logging, metrics, leader election) is kube-scheduler's.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"

	"github.com/tessera-dev/tessera/cmd/tessera-scheduler/app"
)

func main() {
	os.Exit(cli.Run(app.NewCommand()))
}
