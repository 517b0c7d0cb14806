package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
)

// level says how far hubsync's code reaches a vulnerability, as govulncheck
// reports it: a vulnerable function called, a vulnerable package imported
// but none of its vulnerable functions called, or only a vulnerable module
// required.
type level int

const (
	required level = iota
	imported
	called
)

func (l level) String() string {
	return [...]string{"required", "imported", "called"}[l]
}

// frame is one step of a govulncheck trace (its JSON, protocol 1.0.0).
type frame struct {
	Module   string `json:"module"`
	Version  string `json:"version"`
	Package  string `json:"package"`
	Function string `json:"function"`
	Receiver string `json:"receiver"`
	Position *struct {
		Filename string `json:"filename"`
		Line     int    `json:"line"`
	} `json:"position"`
}

func (f frame) String() string {
	name := f.Function
	if f.Receiver != "" {
		name = strings.TrimPrefix(f.Receiver, "*") + "." + name
	}
	s := f.Package + "." + name
	if f.Position != nil && f.Position.Filename != "" {
		s += fmt.Sprintf(" (%s:%d)", f.Position.Filename, f.Position.Line)
	}
	return s
}

// message is one value of govulncheck's JSON stream; only the parts the
// gate reads are decoded.
type message struct {
	Config *struct {
		ScannerVersion string `json:"scanner_version"`
		DB             string `json:"db"`
		GoVersion      string `json:"go_version"`
	} `json:"config"`
	OSV *struct {
		ID      string `json:"id"`
		Summary string `json:"summary"`
	} `json:"osv"`
	Finding *struct {
		OSV          string   `json:"osv"`
		FixedVersion string   `json:"fixed_version"`
		Trace        []*frame `json:"trace"`
	} `json:"finding"`
}

// vuln is what the scan found of one vulnerability: the deepest level it is
// reached at, and a call path when a vulnerable function is called.
type vuln struct {
	ID      string
	Summary string
	Module  string
	Version string
	Fixed   string
	Level   level
	Path    []frame // from the vulnerable function up to hubsync's code
}

// scanResult is a whole scan: its settings and every vulnerability found.
type scanResult struct {
	Scanner   string
	GoVersion string
	Vulns     []vuln // sorted by id
}

// readFindings folds govulncheck's JSON stream into one vuln per id.
func readFindings(r io.Reader) (scanResult, error) {
	var res scanResult
	byID := map[string]*vuln{}
	summaries := map[string]string{}
	dec := json.NewDecoder(r)
	for {
		var m message
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return res, fmt.Errorf("read govulncheck output: %w", err)
		}
		switch {
		case m.Config != nil:
			res.Scanner, res.GoVersion = m.Config.ScannerVersion, m.Config.GoVersion
		case m.OSV != nil:
			summaries[m.OSV.ID] = m.OSV.Summary
		case m.Finding != nil && len(m.Finding.Trace) > 0:
			addFinding(byID, m.Finding.OSV, m.Finding.FixedVersion, m.Finding.Trace)
		}
	}
	for _, v := range byID {
		v.Summary = summaries[v.ID]
		res.Vulns = append(res.Vulns, *v)
	}
	sort.Slice(res.Vulns, func(i, j int) bool { return res.Vulns[i].ID < res.Vulns[j].ID })
	return res, nil
}

func addFinding(byID map[string]*vuln, id, fixed string, trace []*frame) {
	top := trace[0]
	lvl := required
	switch {
	case top.Function != "":
		lvl = called
	case top.Package != "":
		lvl = imported
	}
	v, ok := byID[id]
	if !ok {
		v = &vuln{ID: id, Module: top.Module, Version: top.Version, Fixed: fixed, Level: lvl}
		byID[id] = v
	}
	if lvl > v.Level {
		v.Level = lvl
	}
	if lvl == called && v.Path == nil {
		for _, f := range trace {
			v.Path = append(v.Path, *f)
		}
	}
}
