// SPDX-License-Identifier: Apache-2.0

// Package app is the tessera-node-agent command, shared by its binary and by the
// real-node suite's all-in-one test binary (test/node).
package app

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/tessera-dev/tessera/node-agent/agent"
	"github.com/tessera-dev/tessera/node-agent/hookinstall"
)

// Run is the node agent's command line: it parses args (os.Args[1:]), runs the
// agent or one of its one-shot modes, and returns the process's exit code. version and
// revision are what --version prints.
func Run(args []string, version, revision string) int {
	// The DaemonSet's init container copies the CUDA hook to the host with this: the
	// image has no shell.
	if len(args) > 0 && args[0] == "install-hook" {
		return hookinstall.Main(args[1:], os.Stdout, os.Stderr)
	}
	fs := flag.NewFlagSet("tessera-node-agent", flag.ContinueOnError)
	var cfg agent.Config
	var printInventory, printCDI, printVersion bool
	agent.BindFlags(fs, &cfg)
	logging := agent.AddLoggingFlags(fs)
	fs.BoolVar(&printInventory, "print-inventory", false, "print the GPU inventory the agent would publish, as JSON, and exit (needs no API server)")
	fs.BoolVar(&printCDI, "print-cdi-spec", false, "write the node's CDI spec into --cdi-spec-dir, print what it holds as JSON, and exit (needs no API server)")
	fs.BoolVar(&printVersion, "version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if printVersion {
		fmt.Printf("tessera-node-agent %s (revision %s)\n", version, revision)
		return 0
	}
	agent.ApplySimulateDefaults(fs, &cfg)
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "unexpected arguments: %v\n", fs.Args())
		return 2
	}
	log, flush, err := agent.ApplyLogging(logging)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer flush()
	if printInventory {
		if err := agent.PrintInventory(os.Stdout, &cfg, log); err != nil {
			log.Error(err, "reading the GPU inventory")
			return 1
		}
		return 0
	}
	if printCDI {
		if err := agent.PrintCDISpec(os.Stdout, &cfg, log); err != nil {
			log.Error(err, "writing the CDI spec")
			return 1
		}
		return 0
	}
	if err := cfg.Validate(); err != nil {
		log.Error(err, "invalid configuration")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := agent.Main(ctx, cfg, log); err != nil {
		log.Error(err, "node agent failed")
		return 1
	}
	return 0
}
