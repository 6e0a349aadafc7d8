// SPDX-License-Identifier: Apache-2.0

// Package integration runs the Tessera scheduler (kube-scheduler with the
// TesseraGPUShare plugin, loaded from the sample configs in config/scheduler) against a
// real kube-apiserver backed by etcd, both started in-process per test. Nodes carry
// inventory annotations written as the node agent writes them; pods opt in with
// schedulerName. TestDRAAgent runs the node agent itself, in DRA mode, on a simulated
// node (making its fake device nodes needs CAP_MKNOD).
//
// Requires an etcd binary on PATH (make test-integration builds one from the module).
package integration

import (
	"flag"
	"os"
	"testing"

	"k8s.io/klog/v2"

	"k8s.io/kubernetes/test/integration/framework"
)

func TestMain(m *testing.M) {
	// TESSERA_TEST_V=5 shows the scheduler's and the plugin's decisions.
	if v := os.Getenv("TESSERA_TEST_V"); v != "" {
		fs := flag.NewFlagSet("klog", flag.ContinueOnError)
		klog.InitFlags(fs)
		_ = fs.Set("v", v)
	}
	framework.EtcdMain(m.Run)
}
