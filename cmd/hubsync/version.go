package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// Set at build time by the Makefile (and `make release`) with -ldflags
// "-X main.version=... -X main.commit=... -X main.date=...": the version
// (a v-prefixed semantic version from the release tag, or git describe's
// form between releases), the commit and the commit's time, so that one
// commit builds one binary.
var version, commit, date = "", "", ""

// buildInfo is what `hubsync version` prints, named as `kubectl version`
// names its own.
type buildInfo struct {
	Version   string `json:"gitVersion"`
	Commit    string `json:"gitCommit"`
	BuildDate string `json:"buildDate"`
	GoVersion string `json:"goVersion"`
	Platform  string `json:"platform"`
}

// build is this binary's buildInfo: the linker's values, else what the Go
// toolchain recorded (a `go install` or `go build` with VCS stamping).
func build() buildInfo {
	b := buildInfo{Version: version, Commit: commit, BuildDate: date,
		GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if b.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			b.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch {
			case s.Key == "vcs.revision" && b.Commit == "":
				b.Commit = s.Value
			case s.Key == "vcs.time" && b.BuildDate == "":
				b.BuildDate = s.Value
			}
		}
	}
	if b.Version == "" {
		b.Version = "(devel)"
	}
	if b.Commit == "" {
		b.Commit = "unknown"
	}
	if b.BuildDate == "" {
		b.BuildDate = "unknown"
	}
	return b
}

func buildVersion() string { return build().Version }

func versionCommand(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	fs.SetOutput(stderr)
	output := fs.String("o", "text", "output format: text or json")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 || (*output != "text" && *output != "json") {
		fmt.Fprintln(stderr, "usage: hubsync version [-o text|json]")
		return errUsage
	}
	b := build()
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(b)
	}
	_, err := fmt.Fprintf(stdout, "hubsync %s\n  commit:   %s\n  built:    %s\n  go:       %s\n  platform: %s\n",
		b.Version, b.Commit, b.BuildDate, b.GoVersion, b.Platform)
	return err
}
