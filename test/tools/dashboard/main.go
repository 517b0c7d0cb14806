// Command dashboard writes hubsync's Grafana dashboard, built with the
// Grafana Foundation SDK, to charts/hubsync/files/dashboard.json (or -o).
// `make dashboard` runs it; its test fails when the checked-in file is not
// what it writes.
package main

import (
	"flag"
	"fmt"
	"os"
)

// defaultOutput is the chart's dashboard, from this directory.
const defaultOutput = "../../../charts/hubsync/files/dashboard.json"

func main() {
	out := flag.String("o", defaultOutput, "file to write")
	flag.Parse()
	data, err := build()
	if err != nil {
		fmt.Fprintf(os.Stderr, "dashboard: %v\n", err)
		os.Exit(1)
	}
	if err := os.WriteFile(*out, data, 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "dashboard: %v\n", err)
		os.Exit(1)
	}
}
