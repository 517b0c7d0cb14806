package tunnel

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestKonnectivityDialerChecksItsFiles(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t)
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, ca.pem, 0o600); err != nil {
		t.Fatal(err)
	}
	junk := filepath.Join(dir, "junk")
	if err := os.WriteFile(junk, []byte("not pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		cfg     KonnectivityConfig
		wantErr string
	}{
		{name: "CA only", cfg: KonnectivityConfig{Address: "proxy:8090", CAFile: caFile}},
		{name: "no port", cfg: KonnectivityConfig{Address: "proxy", CAFile: caFile}, wantErr: "konnectivity address"},
		{name: "missing CA file", cfg: KonnectivityConfig{Address: "proxy:8090", CAFile: filepath.Join(dir, "nope")}, wantErr: "konnectivity CA file"},
		{name: "CA file without PEM", cfg: KonnectivityConfig{Address: "proxy:8090", CAFile: junk}, wantErr: "holds no PEM certificate"},
		{name: "bad key pair", cfg: KonnectivityConfig{Address: "proxy:8090", CAFile: caFile, CertFile: junk, KeyFile: junk}, wantErr: "client certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewKonnectivityDialer(tt.cfg)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err %v, want %q", err, tt.wantErr)
			}
			if strings.Contains(err.Error(), "not pem") {
				t.Fatal("the error quotes a file's content")
			}
		})
	}
}
