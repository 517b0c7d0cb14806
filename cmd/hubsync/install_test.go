package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestInstall(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "a-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		args     []string
		wantCode int
		wantFile string // installed file, "" for none
		wantErr  string
	}{
		{name: "into a directory", args: []string{"install", dir}, wantFile: filepath.Join(dir, "hubsync")},
		{name: "again, over the first", args: []string{"install", dir}, wantFile: filepath.Join(dir, "hubsync")},
		{name: "another name", args: []string{"install", "--name", "kubectl-hubsync", dir}, wantFile: filepath.Join(dir, "kubectl-hubsync")},
		{name: "no directory", args: []string{"install"}, wantCode: 2, wantErr: "usage: hubsync install"},
		{name: "a name with a slash", args: []string{"install", "--name", "../x", dir}, wantCode: 2, wantErr: "usage: hubsync install"},
		{name: "a directory that does not exist", args: []string{"install", filepath.Join(dir, "missing")}, wantCode: 1, wantErr: "mount a volume there"},
		{name: "a file, not a directory", args: []string{"install", file}, wantCode: 1, wantErr: "not a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := Main(context.Background(), tc.args, &stdout, &stderr); code != tc.wantCode {
				t.Fatalf("exit %d; want %d (stderr %s)", code, tc.wantCode, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.wantErr) {
				t.Errorf("stderr %q; want %q", stderr.String(), tc.wantErr)
			}
			if tc.wantFile == "" {
				return
			}
			fi, err := os.Stat(tc.wantFile)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != 0o755 {
				t.Errorf("mode %v; want 0755", fi.Mode().Perm())
			}
			if got, _ := os.ReadFile(tc.wantFile); !bytes.Equal(got, want) {
				t.Errorf("%s is not a copy of the running binary", tc.wantFile)
			}
			if !strings.Contains(stdout.String(), "as "+tc.wantFile) {
				t.Errorf("stdout %q; want the installed path", stdout.String())
			}
		})
	}
	left, _ := filepath.Glob(filepath.Join(dir, ".*"))
	if len(left) != 0 {
		t.Errorf("temporary files left behind: %v", left)
	}
}
