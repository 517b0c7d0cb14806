package layout

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestMetricsDocumented fails when a metric defined in product code is not
// in docs/operations.md's reference, or when the reference names a hubsync
// metric the code no longer defines, so the reference cannot drift.
func TestMetricsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	name := regexp.MustCompile(`hubsync_[a-z0-9_]+`)
	documented := map[string]bool{}
	inRenames := false
	for _, line := range strings.Split(string(doc), "\n") {
		switch {
		case strings.HasPrefix(line, "| old | new |"):
			inRenames = true
			continue
		case !strings.HasPrefix(line, "|"):
			inRenames = false
		case inRenames:
			// The old names of a rename table are history, not metrics:
			// only the new column counts.
			if cells := strings.Split(line, "|"); len(cells) > 2 {
				line = strings.Join(cells[2:], "|")
			}
		}
		for _, m := range name.FindAllString(line, -1) {
			documented[m] = true
		}
	}
	defined := map[string]bool{}
	for _, d := range metricDefs(t) {
		defined[d.name] = true
		if !documented[d.name] {
			t.Errorf("metric %s (%s) is not in docs/operations.md", d.name, d.pos)
		}
	}
	var stale []string
	for m := range documented {
		if !defined[m] {
			stale = append(stale, m)
		}
	}
	slices.Sort(stale)
	for _, m := range stale {
		t.Errorf("docs/operations.md names %s, which no product code defines", m)
	}
}
