// SPDX-License-Identifier: Apache-2.0

// Command chart-readme writes the values table of the chart's README
// (config/deploy/tessera/README.md) from values.yaml's comments and
// values.schema.json; with -verify it only checks that the table is up to date.
//
//	go run ./hack/chart-readme [-chart config/deploy/tessera] [-verify]
//
// The project keeps its own generator (config/deploy's valuesdoc.go) rather than
// helm-docs: helm-docs (github.com/norwoodj/helm-docs) is not in the Go module
// graph, so it would be the one tool of make verify not built from go.mod, and
// the staleness check would leave go test ./config/deploy
// (TestChartReadmeUpToDate, TestChartReadmeCoversEveryValue) for a separate
// binary's run.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tessera-dev/tessera/config/deploy"
)

func main() {
	chart := flag.String("chart", "config/deploy/tessera", "chart directory")
	verify := flag.Bool("verify", false, "fail if the README's values table is out of date instead of writing it")
	flag.Parse()
	if err := run(*chart, *verify); err != nil {
		fmt.Fprintln(os.Stderr, "chart-readme:", err)
		os.Exit(1)
	}
}

func run(chart string, verify bool) error {
	path := filepath.Join(chart, "README.md")
	current, want, err := deploy.ChartReadme(chart)
	if err != nil {
		return err
	}
	if string(current) == string(want) {
		fmt.Printf("%s: the values table matches values.yaml\n", path)
		return nil
	}
	if verify {
		return fmt.Errorf("%s: the values table is out of date with values.yaml: run make chart-readme", path)
	}
	if err := os.WriteFile(path, want, 0o644); err != nil {
		return err
	}
	fmt.Printf("%s: values table written\n", path)
	return nil
}
