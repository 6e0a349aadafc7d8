// SPDX-License-Identifier: Apache-2.0

package placement

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const pkgPath = "github.com/tessera-dev/tessera/plugins/gpushare/internal/placement"

// imports lists the packages the non-test Go files of dir import, by file.
func imports(t *testing.T, dir string) map[string][]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		out[f] = []string{}
		for _, imp := range af.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			out[f] = append(out[f], p)
		}
	}
	if len(out) == 0 {
		t.Fatalf("no source files in %s", dir)
	}
	return out
}

// Each policy imports the core but no other policy, so that a policy's types are
// named only in its own package and the core (which the compiler keeps from importing
// a policy: they import it) stays the one thing they share.
func TestPoliciesImportNoOtherPolicy(t *testing.T) {
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	policies := 0
	for _, e := range entries {
		if !e.IsDir() || e.Name() == "testdata" {
			continue
		}
		policies++
		for f, imps := range imports(t, e.Name()) {
			for _, p := range imps {
				if strings.HasPrefix(p, pkgPath+"/") {
					t.Errorf("%s imports %s: a policy imports the core, never another policy", f, p)
				}
			}
		}
	}
	if policies < 3 {
		t.Errorf("%d policy packages found, want binpack, spread and fragmentation at least", policies)
	}
}
