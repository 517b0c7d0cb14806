package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"

	"github.com/hubsync/hubsync/config"
)

// TestNkey: the seed is written 0600 and never over a file; the printed
// entry of bus.consumers is valid configuration and admits the seed's key.
func TestNkey(t *testing.T) {
	dir := t.TempDir()
	seedFile := filepath.Join(dir, "app.nk")
	var stdout, stderr bytes.Buffer
	if code := Main(context.Background(), []string{"nkey", "--seed-file", seedFile, "--name", "kueue"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	fi, err := os.Stat(seedFile)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("seed file mode %v, want 0600", fi.Mode().Perm())
	}
	seed, _ := os.ReadFile(seedFile)
	kp, err := nkeys.FromSeed(bytes.TrimSpace(seed))
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	out := stdout.String()
	if !strings.HasPrefix(out, pub+"\n") || strings.Contains(out, string(bytes.TrimSpace(seed))) {
		t.Fatalf("output:\n%s\nwant the public key first and never the seed", out)
	}
	cfg, err := config.Parse([]byte(out[strings.Index(out, "bus:"):]))
	if err != nil {
		t.Fatalf("the printed entry is not valid configuration: %v", err)
	}
	if c := cfg.Bus.Consumers; len(c) != 1 || c[0].Name != "kueue" || len(c[0].NKeys) != 1 || c[0].NKeys[0] != pub {
		t.Errorf("consumers %+v, want kueue with %s", c, pub)
	}

	stdout.Reset()
	if code := Main(context.Background(), []string{"nkey", "--seed-file", seedFile}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "not overwritten") {
		t.Errorf("over an existing file: exit %d, %s", code, stderr.String())
	}
	if again, _ := os.ReadFile(seedFile); !bytes.Equal(again, seed) {
		t.Error("the seed file changed")
	}
	if code := Main(context.Background(), []string{"nkey"}, &stdout, &stderr); code != 2 {
		t.Errorf("without --seed-file: exit %d, want 2", code)
	}
}
