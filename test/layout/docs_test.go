package layout

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestMetricsDocumented fails when a metric defined in product code is not
// in docs/operations.md's reference, or when the reference names a hubsync
// metric the code no longer defines, so the reference cannot drift.
func TestMetricsDocumented(t *testing.T) {
	documented := docMetricsIn(docFiles(t)["docs/operations.md"])
	defined := map[string]bool{}
	for _, d := range metricDefs(t) {
		defined[d.name] = true
		if !documented[d.name] {
			t.Errorf("metric %s (%s) is not in docs/operations.md", d.name, d.pos)
		}
	}
	var stale []string
	for m := range documented {
		if !defined[m] && !strings.HasSuffix(m, "_") {
			stale = append(stale, m)
		}
	}
	slices.Sort(stale)
	for _, m := range stale {
		t.Errorf("docs/operations.md names %s, which no product code defines", m)
	}
}

// docMetric is a metric name as the docs write it: hubsync_ and the rest,
// ending where a prefix ends ("hubsync_consumer_*") or a sample's suffix
// starts.
var docMetric = regexp.MustCompile(`hubsync_[a-z0-9_]*`)

// docMetricsIn returns the metric names a Markdown document names, leaving
// out the old column of a rename table ("| old | new |"): old names are
// history. A name ending in "_" is a prefix ("hubsync_consumer_*").
func docMetricsIn(doc string) map[string]bool {
	names := map[string]bool{}
	inRenames := false
	for _, line := range strings.Split(doc, "\n") {
		switch {
		case strings.HasPrefix(line, "| old | new |"):
			inRenames = true
			continue
		case !strings.HasPrefix(line, "|"):
			inRenames = false
		case inRenames:
			if cells := strings.Split(line, "|"); len(cells) > 2 {
				line = strings.Join(cells[2:], "|")
			}
		}
		for _, m := range docMetric.FindAllString(line, -1) {
			names[m] = true
		}
	}
	return names
}

// TestDocsNameMetrics fails when any document (the README, the changelog,
// docs/) names a metric no product code defines: a histogram's samples
// (_bucket, _sum, _count) count as their histogram, and a prefix such as
// hubsync_consumer_* must start at least one metric.
func TestDocsNameMetrics(t *testing.T) {
	defined := map[string]bool{}
	for _, d := range metricDefs(t) {
		defined[d.name] = true
	}
	exists := func(m string) bool {
		if strings.HasSuffix(m, "_") {
			for d := range defined {
				if strings.HasPrefix(d, m) && d != m {
					return true
				}
			}
			return false
		}
		for _, s := range []string{"", "_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(m, s); ok && defined[base] {
				return true
			}
		}
		return false
	}
	for name, doc := range docFiles(t) {
		for m := range docMetricsIn(doc) {
			if m != "hubsync_" && !exists(m) {
				t.Errorf("%s names the metric %s, which no product code defines", name, m)
			}
		}
	}
}

// mdLink is a Markdown link to a file of the repository, with an optional
// fragment: [text](path#fragment).
var mdLink = regexp.MustCompile(`\]\(([^)\s:]*?)(#[^)\s]*)?\)`)

// TestDocsLinks fails when a document links to a file that does not exist or
// to a heading its target does not have, so moving a section cannot leave a
// reader at the top of the wrong page.
func TestDocsLinks(t *testing.T) {
	headings := map[string]map[string]bool{}
	headingsOf := func(path string) map[string]bool {
		if h, ok := headings[path]; ok {
			return h
		}
		h := map[string]bool{}
		if b, err := os.ReadFile(path); err == nil {
			fenced := false
			for _, line := range strings.Split(string(b), "\n") {
				if strings.HasPrefix(line, "```") {
					fenced = !fenced
				}
				if fenced || !strings.HasPrefix(line, "#") {
					continue
				}
				base := anchor(strings.TrimLeft(line, "#"))
				a := base
				for n := 1; h[a]; n++ {
					a = fmt.Sprintf("%s-%d", base, n)
				}
				h[a] = true
			}
		}
		headings[path] = h
		return h
	}
	for name, text := range docFiles(t) {
		doc := "../../" + name
		for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
			target, fragment := m[1], strings.TrimPrefix(m[2], "#")
			path := doc
			if target != "" {
				path = filepath.Join(filepath.Dir(doc), target)
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s links to %s, which does not exist", name, target)
					continue
				}
			}
			if fragment != "" && strings.HasSuffix(path, ".md") && !headingsOf(path)[fragment] {
				t.Errorf("%s links to %s#%s, a heading %s does not have", name, target, fragment, strings.TrimPrefix(path, "../../"))
			}
		}
	}
}

// TestDocsNamePaths fails when a document names a file or directory of the
// repository that is not there (test/e2e/TestName counts when the directory
// holds that test), so a reader sent to a file finds it.
func TestDocsNamePaths(t *testing.T) {
	// Paths in other modules the documents name as theirs.
	elsewhere := map[string]bool{"cmd/indexdb": true}
	// A path of the repository in inline code: one of its top-level
	// directories, then the rest. Build outputs (.gitignore's /dir/) are
	// not the repository's.
	ignore, err := os.ReadFile("../../.gitignore")
	if err != nil {
		t.Fatal(err)
	}
	built := map[string]bool{}
	for _, line := range strings.Fields(string(ignore)) {
		if d, ok := strings.CutPrefix(line, "/"); ok && strings.HasSuffix(d, "/") {
			built[strings.TrimSuffix(d, "/")] = true
		}
	}
	top, err := os.ReadDir("../..")
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, e := range top {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") && !built[e.Name()] {
			dirs = append(dirs, regexp.QuoteMeta(e.Name()))
		}
	}
	docPath := regexp.MustCompile("`((?:" + strings.Join(dirs, "|") + ")/[^` :#]*)")
	for name, doc := range docFiles(t) {
		for _, m := range docPath.FindAllStringSubmatch(doc, -1) {
			p := m[1]
			if elsewhere[p] || strings.ContainsAny(p, "*<{$") || strings.Contains(p, "...") {
				continue
			}
			if _, err := os.Stat("../../" + p); err == nil {
				continue
			}
			if dir, test := filepath.Split(p); strings.HasPrefix(test, "Test") {
				if found, _ := definesTest("../../"+dir, test); found {
					continue
				}
			}
			t.Errorf("%s names %s, which is not in the repository", name, p)
		}
	}
}

// definesTest reports whether a test file in dir defines the function name.
func definesTest(dir, name string) (bool, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil {
		return false, err
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return false, err
		}
		if strings.Contains(string(b), "func "+name+"(") {
			return true, nil
		}
	}
	return false, nil
}
