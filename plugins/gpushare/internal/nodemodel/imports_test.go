// SPDX-License-Identifier: Apache-2.0

package nodemodel

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The node model sits under the allocator: it may import the standard library and
// the wire contract, never placement, the adapter or the scheduler framework.
func TestImportsOnlyAPI(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	seen := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		seen++
		for _, imp := range af.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			std := !strings.Contains(strings.SplitN(path, "/", 2)[0], ".")
			if !std && path != "github.com/tessera-dev/tessera/api" {
				t.Errorf("%s imports %s: nodemodel imports only the standard library and api", f, path)
			}
		}
	}
	if seen == 0 {
		t.Fatal("no source files found")
	}
}
