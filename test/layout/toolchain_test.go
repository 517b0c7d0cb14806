package layout

import (
	"go/version"
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// TestOneToolchain: every entry point builds with the Go version go.mod
// names, and with the http2legacy tag the tunnel pool needs (a machine's
// own Go ignores go.mod's go line under GOTOOLCHAIN=local, so each sets
// it), and no module of the repository asks for a newer Go than that.
func TestOneToolchain(t *testing.T) {
	root := filepath.Join("..", "..")
	want := goLine(t, filepath.Join(root, "go.mod"))
	tests := []struct {
		file string
		re   string
	}{
		{"Makefile", `(?m)^GO_TOOLCHAIN \?= go` + regexp.QuoteMeta(want) + `$`},
		{"Makefile", `(?m)^export GOTOOLCHAIN := \$\(GO_TOOLCHAIN\)$`},
		{"Makefile", `(?m)^export GOFLAGS := .*-tags=http2legacy\)?$`},
		{".ci/run", `(?m)^export GOTOOLCHAIN=go` + regexp.QuoteMeta(want) + `$`},
		{"Dockerfile", `(?m)^FROM golang:` + regexp.QuoteMeta(want) + ` AS build$`},
		{"Dockerfile", `(?m)^RUN CGO_ENABLED=0 go build -tags http2legacy `},
		{"README.md", `GOTOOLCHAIN=go` + regexp.QuoteMeta(want)},
	}
	for _, tt := range tests {
		b, err := os.ReadFile(filepath.Join(root, tt.file))
		if err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(tt.re).Match(b) {
			t.Errorf("%s does not match %s: every entry point builds with go%s and -tags http2legacy", tt.file, tt.re, want)
		}
	}
	mods, err := filepath.Glob(filepath.Join(root, "test", "*", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	tools, _ := filepath.Glob(filepath.Join(root, "test", "tools", "*", "go.mod"))
	for _, m := range append(mods, tools...) {
		if v := goLine(t, m); version.Compare("go"+want, "go"+v) < 0 {
			t.Errorf("%s asks for go %s, newer than the go%s every entry point builds with", m, v, want)
		}
	}
}

// goLine is the go directive of a go.mod file.
func goLine(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go ([0-9.]+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("%s has no go line", path)
	}
	return string(m[1])
}
