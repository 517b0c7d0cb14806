package layout

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

const (
	alertsFile   = "../../charts/hubsync/files/alerts.yaml"
	runbooksFile = "../../docs/runbooks.md"
	alertTests   = "../../test/alerts/*_test.yaml"
	runbookURL   = "https://github.com/hubsync/hubsync/blob/main/docs/runbooks.md#"
)

// ruleFile is the part of a Prometheus rule file this test reads.
type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Record      string            `json:"record"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

// promtoolTests is the part of a promtool test file this test reads.
type promtoolTests struct {
	Tests []struct {
		AlertRuleTest []struct {
			Alertname string `json:"alertname"`
			ExpAlerts []any  `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// TestAlertsDocumentedAndTested fails when an alert of the chart's rule
// file lacks a severity, a summary, a description or the agreed
// runbook_url, when docs/runbooks.md has no section for it (or a section
// for an alert that no longer exists), or when the promtool tests have no
// case where it fires and none where it must not.
func TestAlertsDocumentedAndTested(t *testing.T) {
	var rules ruleFile
	readYAML(t, alertsFile, &rules)
	alerts := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts[r.Alert] = true
			checkAlertRule(t, r.Alert, r.Labels, r.Annotations)
		}
	}
	if len(alerts) == 0 {
		t.Fatalf("%s holds no alert", alertsFile)
	}

	sections := runbookSections(t)
	for name := range alerts {
		if !sections[name] {
			t.Errorf("alert %s has no section `## %s` in docs/runbooks.md", name, name)
		}
	}
	for name := range sections {
		if !alerts[name] {
			t.Errorf("docs/runbooks.md has a section for %s, which alerts.yaml does not define", name)
		}
	}

	fires, silent := promtoolCases(t)
	for name := range alerts {
		if !fires[name] {
			t.Errorf("alert %s has no promtool case where it fires (exp_alerts not empty) in test/alerts", name)
		}
		if !silent[name] {
			t.Errorf("alert %s has no promtool case where it must not fire (exp_alerts empty) in test/alerts", name)
		}
	}
	for name := range fires {
		if !alerts[name] {
			t.Errorf("test/alerts tests %s, which alerts.yaml does not define", name)
		}
	}
}

// checkAlertRule checks one rule's labels and annotations.
func checkAlertRule(t *testing.T, name string, labels, annotations map[string]string) {
	t.Helper()
	if sev := labels["severity"]; sev != "critical" && sev != "warning" {
		t.Errorf("alert %s: severity %q; want critical or warning", name, sev)
	}
	for _, a := range []string{"summary", "description"} {
		if strings.TrimSpace(annotations[a]) == "" {
			t.Errorf("alert %s has no %s annotation", name, a)
		}
	}
	if got, want := annotations["runbook_url"], runbookURL+anchor(name); got != want {
		t.Errorf("alert %s: runbook_url %q; want %q", name, got, want)
	}
}

// anchor is the fragment GitHub gives a heading: lower case, punctuation
// dropped, spaces as hyphens.
func anchor(heading string) string {
	h := strings.ToLower(strings.TrimSpace(heading))
	h = regexp.MustCompile(`[^a-z0-9 _-]`).ReplaceAllString(h, "")
	return strings.ReplaceAll(h, " ", "-")
}

// runbookSections returns the second-level headings of docs/runbooks.md
// that name an alert (every one but the introduction's), requiring each
// to be unique.
func runbookSections(t *testing.T) map[string]bool {
	t.Helper()
	doc, err := os.ReadFile(runbooksFile)
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]bool{}
	for _, line := range strings.Split(string(doc), "\n") {
		h, ok := strings.CutPrefix(line, "## ")
		if !ok || h == "Before you start" {
			continue
		}
		if sections[h] {
			t.Errorf("docs/runbooks.md has two sections %q", h)
		}
		sections[h] = true
	}
	return sections
}

// promtoolCases returns the alerts that some promtool case expects to
// fire, and those that some case expects to stay silent.
func promtoolCases(t *testing.T) (fires, silent map[string]bool) {
	t.Helper()
	files, err := filepath.Glob(alertTests)
	if err != nil || len(files) == 0 {
		t.Fatalf("no promtool tests match %s (%v)", alertTests, err)
	}
	slices.Sort(files)
	fires, silent = map[string]bool{}, map[string]bool{}
	for _, f := range files {
		var tests promtoolTests
		readYAML(t, f, &tests)
		for _, tc := range tests.Tests {
			for _, a := range tc.AlertRuleTest {
				if len(a.ExpAlerts) > 0 {
					fires[a.Alertname] = true
				} else {
					silent[a.Alertname] = true
				}
			}
		}
	}
	return fires, silent
}

// readYAML decodes path into v.
func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
