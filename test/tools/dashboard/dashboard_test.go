package main

import (
	"bytes"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
)

// TestCheckedInIsGenerated fails when charts/hubsync/files/dashboard.json
// is not what this command writes: edit dashboard.go and run
// `make dashboard`, never the JSON.
func TestCheckedInIsGenerated(t *testing.T) {
	want, err := build()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(defaultOutput)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is not what dashboard.go generates: run `make dashboard` and commit the result", defaultOutput)
	}
}

// panelJSON is what the structure checks read of a panel.
type panelJSON struct {
	ID      int    `json:"id"`
	Type    string `json:"type"`
	Title   string `json:"title"`
	GridPos struct {
		X, Y, W, H int
	} `json:"gridPos"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		Expr       string `json:"expr"`
		RefID      string `json:"refId"`
		Datasource *struct {
			Type string `json:"type"`
			UID  string `json:"uid"`
		} `json:"datasource"`
	} `json:"targets"`
	Panels []panelJSON `json:"panels"`
}

// TestStructure checks what Grafana needs of the generated dashboard and
// the SDK does not enforce: unique panel ids, every query with an
// expression and the dashboard's data source variable, a non-empty
// title, panels inside the 24-column grid without overlaps, the
// variables the queries use, and $__rate_interval as every rate's window.
func TestStructure(t *testing.T) {
	data, err := build()
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID        string      `json:"uid"`
		Panels     []panelJSON `json:"panels"`
		Templating struct {
			List []struct {
				Name, Type string
				Query      any
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	if d.UID != uid {
		t.Errorf("uid %q; want %q", d.UID, uid)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
	}
	for name, typ := range map[string]string{"datasource": "datasource", "job": "query", "namespace": "query", "pod": "query"} {
		if vars[name] != typ {
			t.Errorf("variable %s is %q; want %q", name, vars[name], typ)
		}
	}
	ids := map[int]string{}
	var cells [][24]string
	queries := 0
	var walk func(ps []panelJSON)
	walk = func(ps []panelJSON) {
		for _, p := range ps {
			if p.ID <= 0 {
				t.Errorf("panel %q has no id", p.Title)
			} else if other, dup := ids[p.ID]; dup {
				t.Errorf("panels %q and %q share id %d", other, p.Title, p.ID)
			}
			ids[p.ID] = p.Title
			if strings.TrimSpace(p.Title) == "" {
				t.Errorf("panel %d has no title", p.ID)
			}
			g := p.GridPos
			if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
				t.Errorf("panel %q at %+v is outside the grid", p.Title, g)
			}
			for y := g.Y; y < g.Y+g.H; y++ {
				for len(cells) <= y {
					cells = append(cells, [24]string{})
				}
				for x := g.X; x < min(g.X+g.W, 24); x++ {
					if cells[y][x] != "" {
						t.Errorf("panels %q and %q overlap at (%d, %d)", cells[y][x], p.Title, x, y)
					}
					cells[y][x] = p.Title
				}
			}
			if p.Type != "row" {
				if len(p.Targets) == 0 {
					t.Errorf("panel %q has no query", p.Title)
				}
				if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
					t.Errorf("panel %q data source %+v; want ${datasource}", p.Title, p.Datasource)
				}
			}
			refs := map[string]bool{}
			for _, tg := range p.Targets {
				queries++
				if strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("panel %q has a query without an expression", p.Title)
				}
				if tg.Datasource == nil || tg.Datasource.Type != "prometheus" || tg.Datasource.UID != "${datasource}" {
					t.Errorf("panel %q query %q data source %+v; want prometheus ${datasource}", p.Title, tg.Expr, tg.Datasource)
				}
				if tg.RefID == "" || refs[tg.RefID] {
					t.Errorf("panel %q query %q refId %q is empty or repeated", p.Title, tg.Expr, tg.RefID)
				}
				refs[tg.RefID] = true
				for _, v := range []string{"$job", "$namespace", "$pod"} {
					if !strings.Contains(tg.Expr, v) {
						t.Errorf("panel %q query %q does not select %s", p.Title, tg.Expr, v)
					}
				}
				if strings.Contains(tg.Expr, "rate(") && !strings.Contains(tg.Expr, "[$__rate_interval]") {
					t.Errorf("panel %q query %q: a rate over another window than $__rate_interval", p.Title, tg.Expr)
				}
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	if queries < 40 {
		t.Fatalf("only %d queries: the dashboard or this walk is broken", queries)
	}
}

// grafanaVariable is a dashboard variable in a query: $name or ${name...}.
var grafanaVariable = regexp.MustCompile(`\$(\{[^}]*\}|[A-Za-z_][A-Za-z0-9_]*)`)

// TestQueriesParse parses every query with Prometheus's own PromQL
// parser, the dashboard's variables replaced by what Grafana puts there
// (a window for $__rate_interval, a value for the others).
func TestQueriesParse(t *testing.T) {
	data, err := build()
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []panelJSON `json:"panels"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	p := parser.NewParser(parser.Options{})
	n := 0
	for _, panel := range d.Panels {
		for _, tg := range panel.Targets {
			n++
			expr := strings.ReplaceAll(tg.Expr, "$__rate_interval", "2m")
			expr = grafanaVariable.ReplaceAllString(expr, "value")
			if _, err := p.ParseExpr(expr); err != nil {
				t.Errorf("panel %q: %s: %v", panel.Title, tg.Expr, err)
			}
		}
	}
	if n == 0 {
		t.Fatal("no query found")
	}
}
