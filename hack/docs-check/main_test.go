// SPDX-License-Identifier: Apache-2.0

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRepositoryDocs runs the check on the repository's own Markdown.
func TestRepositoryDocs(t *testing.T) {
	problems, err := check(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

func TestTableRows(t *testing.T) {
	text := strings.Join([]string{
		"| a | b |",
		"| --- | --- |",
		"| `x | y` | 2 |", // a pipe in code is not a cell's edge
		`| x \| y | 2 |`,  // nor an escaped one
		"| 1 | 2 | 3 |",   // one cell too many
		"",
		"  | c |", // a new table, indented under a list item
		"  | --- |",
		"  | 1 | 2 |",
		"```",
		"| not | a | table |",
		"```",
	}, "\n")
	got := tableProblems(text)
	want := []string{"5: a table row of 3 cells under a header of 2", "9: a table row of 2 cells under a header of 1"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("tableProblems = %q, want %q", got, want)
	}
}

func TestHeadingAnchors(t *testing.T) {
	a := headingAnchors(strings.Join([]string{
		"# Benchmarks",
		"### 2026-12-07 (night, later): slot bursts let off a rarely held neighbour's turns (fake driver)",
		"## B7: co-located throughput",
		"### Results",
		"### Results",
		"## The [hook](cuda-hook.md) at 25 µs — `fast`",
		"```",
		"# not a heading",
		"```",
		"#hashtag",
	}, "\n"))
	for _, want := range []string{
		"benchmarks",
		"2026-12-07-night-later-slot-bursts-let-off-a-rarely-held-neighbours-turns-fake-driver",
		"b7-co-located-throughput",
		"results", "results-1",
		"the-hook-at-25-µs--fast",
	} {
		if !a[want] {
			t.Errorf("no anchor %q in %v", want, a)
		}
	}
	if a["not-a-heading"] || a["hashtag"] {
		t.Errorf("anchors of code or of a line without a space after #: %v", a)
	}
}

func TestLinks(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("docs/a.md", "# A\n## Part one\n")
	write("README.md", strings.Join([]string{
		"[ok](docs/a.md) [ok](docs/a.md#part-one) [ok](#readme) [web](https://example.com/x#y)",
		"[gone](docs/b.md) [no heading](docs/a.md#part-two) `[code](nowhere.md)`",
		"# Readme",
	}, "\n"))
	write(".git/x.md", "[ignored](nowhere.md)")
	problems, err := check(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"README.md:2: link to docs/b.md: no such file",
		"README.md:2: link to docs/a.md#part-two: no heading with that anchor",
	}
	if strings.Join(problems, "\n") != strings.Join(want, "\n") {
		t.Errorf("check = %q, want %q", problems, want)
	}
}
