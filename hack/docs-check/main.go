// SPDX-License-Identifier: Apache-2.0

// Command docs-check checks the repository's Markdown: every row of a table has as
// many cells as its header (a row with one cell too many renders shifted, its verdict
// under the wrong column), and every relative link names a file that exists and, where
// it names a heading (#anchor), a heading of that file.
//
//	go run ./hack/docs-check [-root .]
//
// make verify runs it; go test ./hack/docs-check runs the same check on the
// repository, so make test catches a broken table or link too.
package main

import (
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"unicode"
)

func main() {
	root := flag.String("root", ".", "repository root")
	flag.Parse()
	problems, err := check(*root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "docs-check:", err)
		os.Exit(1)
	}
	for _, p := range problems {
		fmt.Fprintln(os.Stderr, p)
	}
	if len(problems) > 0 {
		fmt.Fprintf(os.Stderr, "docs-check: %d problems\n", len(problems))
		os.Exit(1)
	}
}

// skipDir names the folders that hold no documentation of their own where git does
// not say which files are tracked: build outputs, downloaded modules, tools' state.
func skipDir(name string) bool {
	switch name {
	case "bin", "build", "_output", "node_modules", "testdata", "vendor":
		return true
	}
	return strings.HasPrefix(name, ".") && name != "."
}

// markdown lists the Markdown files under root: those git tracks where root is a git
// work tree, else every one outside skipDir's folders.
func markdown(root string) ([]string, error) {
	if out, err := exec.Command("git", "-C", root, "ls-files", "-z", "--", "*.md").Output(); err == nil {
		var files []string
		for _, f := range strings.Split(string(out), "\x00") {
			if f != "" {
				files = append(files, filepath.Join(root, filepath.FromSlash(f)))
			}
		}
		return files, nil
	}
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && skipDir(d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".md") {
			files = append(files, path)
		}
		return nil
	})
	return files, err
}

// check returns one line per problem in the Markdown files under root.
func check(root string) ([]string, error) {
	files, err := markdown(root)
	if err != nil {
		return nil, err
	}
	anchors := map[string]map[string]bool{}
	anchorsOf := func(path string) (map[string]bool, error) {
		if a, ok := anchors[path]; ok {
			return a, nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		a := headingAnchors(string(b))
		anchors[path] = a
		return a, nil
	}
	var problems []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		rel, _ := filepath.Rel(root, f)
		for _, p := range tableProblems(string(b)) {
			problems = append(problems, rel+":"+p)
		}
		for _, l := range links(string(b)) {
			file, anchor, _ := strings.Cut(l.target, "#")
			target := f
			if file != "" {
				target = filepath.Join(filepath.Dir(f), filepath.FromSlash(file))
				if _, err := os.Stat(target); err != nil {
					problems = append(problems, fmt.Sprintf("%s:%d: link to %s: no such file", rel, l.line, l.target))
					continue
				}
			}
			if anchor == "" || !strings.HasSuffix(target, ".md") {
				continue
			}
			a, err := anchorsOf(target)
			if err != nil {
				return nil, err
			}
			if !a[anchor] {
				problems = append(problems, fmt.Sprintf("%s:%d: link to %s: no heading with that anchor", rel, l.line, l.target))
			}
		}
	}
	return problems, nil
}

// unfenced yields each line of a Markdown text with its number, blank inside fenced
// code blocks and for their fences.
func unfenced(text string, yield func(n int, line string)) {
	fenced := false
	for i, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			line = ""
		}
		if fenced {
			line = ""
		}
		yield(i+1, line)
	}
}

// prose is unfenced with inline code spans blanked too (their pipes and brackets are
// not a table's or a link's).
func prose(text string, yield func(n int, line string)) {
	unfenced(text, func(n int, line string) { yield(n, codeSpan.ReplaceAllString(line, "``")) })
}

var codeSpan = regexp.MustCompile("`[^`]*`")

// tableProblems lists the table rows whose cell count differs from their header's.
func tableProblems(text string) []string {
	var out []string
	header := 0
	prose(text, func(n int, line string) {
		line = strings.TrimSpace(line) // a table may stand indented under a list item
		if !strings.HasPrefix(line, "|") {
			header = 0
			return
		}
		cells := strings.Count(strings.ReplaceAll(strings.Trim(line, "|"), `\|`, ""), "|") + 1
		switch {
		case header == 0:
			header = cells
		case cells != header:
			out = append(out, fmt.Sprintf("%d: a table row of %d cells under a header of %d", n, cells, header))
		}
	})
	return out
}

type link struct {
	line   int
	target string
}

var linkRE = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// links lists the relative link targets of a Markdown text (not those with a scheme).
func links(text string) []link {
	var out []link
	prose(text, func(n int, line string) {
		for _, m := range linkRE.FindAllStringSubmatch(line, -1) {
			if t := m[1]; !hasScheme(t) {
				out = append(out, link{n, t})
			}
		}
	})
	return out
}

var scheme = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)

func hasScheme(target string) bool { return scheme.MatchString(target) }

var inlineLink = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)

// headingAnchors is the set of anchors a Markdown renderer in GitHub's manner gives
// the text's headings: the heading's text (a link's text for the link) in lower
// case, without punctuation but hyphens and underscores, spaces made hyphens; the
// second heading of one anchor gets "-1", the third "-2".
func headingAnchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	unfenced(text, func(_ int, line string) {
		level := len(line) - len(strings.TrimLeft(line, "#"))
		if level == 0 || level > 6 || !strings.HasPrefix(line[level:], " ") {
			return
		}
		h := inlineLink.ReplaceAllString(strings.TrimSpace(line[level:]), "$1")
		var b strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case r == ' ':
				b.WriteByte('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	})
	return out
}
