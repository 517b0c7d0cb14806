package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
)

// listedModule is the part of `go list -m -u -json` the report reads.
type listedModule struct {
	Path     string
	Version  string
	Main     bool
	Indirect bool
	Update   *struct{ Version string }
	Error    *struct{ Err string }
}

// deps prints each direct requirement of the module in o.dir with the
// newest version the module proxy offers (where it lists one) and the ids
// of the vulnerabilities known in the version required.
func deps(ctx context.Context, o options, w io.Writer) error {
	out, err := goOutput(ctx, o.dir, "list", "-m", "-u", "-e", "-json", "all")
	if err != nil {
		return err
	}
	var direct, indirect []listedModule
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var m listedModule
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return fmt.Errorf("read go list: %w", err)
		}
		switch {
		case m.Main:
		case m.Indirect:
			indirect = append(indirect, m)
		default:
			direct = append(direct, m)
		}
	}
	known, err := knownVulns(ctx, o)
	if err != nil {
		return err
	}
	goVersion, _ := goOutput(ctx, o.dir, "env", "GOVERSION")
	fmt.Fprintf(w, "toolchain %s\n", strings.TrimSpace(string(goVersion)))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODULE\tREQUIRED\tNEWEST SERVED\tKNOWN VULNERABILITIES")
	for _, m := range direct {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", m.Path, m.Version, newest(m), orDash(known[m.Path]))
	}
	for _, m := range indirect {
		if ids := known[m.Path]; len(ids) > 0 {
			fmt.Fprintf(tw, "%s (indirect)\t%s\t%s\t%s\n", m.Path, m.Version, newest(m), strings.Join(ids, " "))
		}
	}
	if ids := known["stdlib"]; len(ids) > 0 {
		fmt.Fprintf(tw, "stdlib\t%s\t\t%s\n", strings.TrimSpace(string(goVersion)), strings.Join(ids, " "))
	}
	return tw.Flush()
}

// newest says what the proxy offers beyond the required version.
func newest(m listedModule) string {
	switch {
	case m.Update != nil:
		return m.Update.Version
	case m.Error != nil && strings.Contains(m.Error.Err, "/@v/list"):
		return "unknown: the proxy lists none"
	case m.Error != nil:
		first, _, _ := strings.Cut(m.Error.Err, "\n")
		return "unknown: " + first
	}
	return "(this one)"
}

func orDash(ids []string) string {
	if len(ids) == 0 {
		return "-"
	}
	return strings.Join(ids, " ")
}

// knownVulns lists, by module path, the vulnerabilities the database knows
// in the versions the module's packages use, called or not.
func knownVulns(ctx context.Context, o options) (map[string][]string, error) {
	db, err := ensureDB(ctx, o.toolDir, o.cacheRoot)
	if err != nil {
		return nil, err
	}
	res, err := govulncheck(ctx, db, o.dir, "package", []string{"./..."})
	if err != nil {
		return nil, err
	}
	known := map[string][]string{}
	for _, v := range res.Vulns {
		known[v.Module] = append(known[v.Module], v.ID)
	}
	for _, ids := range known {
		sort.Strings(ids)
	}
	return known, nil
}
