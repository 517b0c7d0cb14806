package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// vulndbModule is the Go vulnerability database as the module proxy serves
// it; this module's go.mod pins its version.
const vulndbModule = "golang.org/x/vulndb"

// ensureDB returns the directory of an offline vulnerability database built
// from the pinned vulndb module by its own indexdb command, building it
// into cacheRoot the first time. toolDir is this module's directory, where
// the go command finds the pin and the tool.
func ensureDB(ctx context.Context, toolDir, cacheRoot string) (string, error) {
	dl, err := goOutput(ctx, toolDir, "mod", "download", "-json", vulndbModule)
	if err != nil {
		return "", err
	}
	var mod struct{ Version, Dir string }
	if err := json.Unmarshal(dl, &mod); err != nil || mod.Dir == "" {
		return "", fmt.Errorf("download %s: no module directory in %q", vulndbModule, dl)
	}
	out := filepath.Join(cacheRoot, "vulndb-"+mod.Version)
	if _, err := os.Stat(filepath.Join(out, "index", "db.json")); err == nil {
		return out, nil
	}
	if err := os.MkdirAll(cacheRoot, 0o755); err != nil {
		return "", fmt.Errorf("create %s: %w", cacheRoot, err)
	}
	tmp, err := os.MkdirTemp(cacheRoot, ".tmp-vulndb-")
	if err != nil {
		return "", fmt.Errorf("create a directory for the database: %w", err)
	}
	defer os.RemoveAll(tmp)
	fmt.Fprintf(os.Stderr, "vulncheck: building the vulnerability database from %s@%s\n", vulndbModule, mod.Version)
	if _, err := goOutput(ctx, toolDir, "tool", "indexdb", "-vulns", filepath.Join(mod.Dir, "data", "osv"), "-out", filepath.Join(tmp, "db")); err != nil {
		return "", err
	}
	// The database lands whole, in one rename; a concurrent build at worst
	// makes it twice.
	if err := os.Rename(filepath.Join(tmp, "db"), out); err != nil {
		if _, statErr := os.Stat(filepath.Join(out, "index", "db.json")); statErr != nil {
			return "", fmt.Errorf("install the database in %s: %w", out, err)
		}
	}
	return out, nil
}

// goOutput runs the go command in dir and returns its standard output, or
// an error carrying what it printed on standard error.
func goOutput(ctx context.Context, dir string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go %s (in %s): %w: %s", strings.Join(args, " "), dir, err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}
