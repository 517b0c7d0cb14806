package layout

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// figuresHeading opens docs/performance.md's one table of current figures.
const figuresHeading = "## Current figures"

// figureRow is one row of that table.
type figureRow struct {
	figure, result, goal, measured, command string
}

// currentFigures reads the table under figuresHeading: | figure | result |
// goal | measured | command |.
func currentFigures(t *testing.T, doc string) []figureRow {
	t.Helper()
	_, rest, ok := strings.Cut(doc, "\n"+figuresHeading+"\n")
	if !ok {
		t.Fatalf("docs/performance.md has no %q section", figuresHeading)
	}
	if end := strings.Index(rest, "\n## "); end >= 0 {
		rest = rest[:end]
	}
	var rows []figureRow
	inTable, ended := false, false
	for _, line := range strings.Split(rest, "\n") {
		if !strings.HasPrefix(line, "|") {
			ended = ended || inTable
			continue
		}
		if ended {
			t.Fatalf("%s holds more than one table (or a line splits it): %q", figuresHeading, line)
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		if !inTable {
			inTable = true
			if got := strings.Join(cells, "|"); got != "figure|result|goal|measured|command" {
				t.Fatalf("the current figures' header is %q; want figure | result | goal | measured | command", got)
			}
			continue
		}
		if strings.Trim(cells[0], "-") == "" {
			continue
		}
		if len(cells) != 5 {
			t.Errorf("current figures: row %q has %d cells; want 5", line, len(cells))
			continue
		}
		rows = append(rows, figureRow{cells[0], cells[1], cells[2], cells[3], cells[4]})
	}
	return rows
}

// TestPerformanceFigures keeps docs/performance.md guidance: one table of
// current figures, each with one result, the date and commit it was
// measured at (a commit of this repository, not after the date) and the
// command that reproduces it; nothing called "latest"; the goals stated there
// and nowhere else.
func TestPerformanceFigures(t *testing.T) {
	b, err := os.ReadFile("../../docs/performance.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	rows := currentFigures(t, doc)
	if len(rows) < 20 {
		t.Fatalf("current figures: %d rows; the table or its parsing is broken", len(rows))
	}
	measured := regexp.MustCompile("^(\\d{4}-\\d{2}-\\d{2}), `([0-9a-f]{7,40})`$")
	command := regexp.MustCompile("`(make bench[^`]*|go test [^`]*)`")
	seen := map[string]bool{}
	days := commitDays{}
	for _, r := range rows {
		if seen[r.figure] {
			t.Errorf("current figures: %q appears twice; one current value per figure", r.figure)
		}
		seen[r.figure] = true
		if !strings.ContainsAny(r.result, "0123456789") {
			t.Errorf("current figures: %q has no result", r.figure)
		}
		if !command.MatchString(r.command) {
			t.Errorf("current figures: %q has no command (`make bench ...` or `go test ...`): %q", r.figure, r.command)
		}
		m := measured.FindStringSubmatch(r.measured)
		if m == nil {
			t.Errorf("current figures: %q: measured %q; want \"YYYY-MM-DD, `commit`\"", r.figure, r.measured)
			continue
		}
		day, err := time.Parse(time.DateOnly, m[1])
		if err != nil {
			t.Errorf("current figures: %q: %v", r.figure, err)
			continue
		}
		days.check(t, r.figure, m[2], day)
	}
	if strings.Contains(strings.ToLower(doc), "latest") {
		t.Error("docs/performance.md calls something \"latest\": a figure there is current by being in the table, with its date")
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if regexp.MustCompile(`(?i)goal:?\s*[≤≥<>]|[≤≥]\s*[0-9]`).Match(readme) {
		t.Error("README.md states a performance goal: the goals are stated once, in docs/performance.md")
	}
}

// commitDays looks up, once per commit, the day each commit of this
// repository was made. Outside a git checkout nothing can be looked up, and
// only a commit's form is checked.
type commitDays map[string]*time.Time

// check fails unless commit is one of this repository's, made on or before
// the day a figure says it was measured.
func (c commitDays) check(t *testing.T, figure, commit string, day time.Time) {
	t.Helper()
	if _, err := os.Stat("../../.git"); err != nil {
		return
	}
	made, seen := c[commit]
	if !seen {
		if out, err := exec.Command("git", "-C", "../..", "show", "-s", "--format=%cI", commit+"^{commit}").Output(); err == nil {
			if at, err := time.Parse(time.RFC3339, strings.TrimSpace(string(out))); err == nil {
				d := at.UTC().Truncate(24 * time.Hour)
				made = &d
			}
		}
		c[commit] = made
	}
	if made == nil {
		t.Errorf("current figures: %q: commit %s is not in this repository", figure, commit)
		return
	}
	if made.After(day) {
		t.Errorf("current figures: %q: measured on %s at commit %s, made later (%s)", figure, day.Format(time.DateOnly), commit, made.Format(time.DateOnly))
	}
}
