package layout

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestChartCRDs: the ClusterProfile CRD the chart installs is the one the
// cluster-inventory-api version go.mod pins ships, byte for byte (`make
// crds` copies it), and nothing else is in charts/hubsync/crds/.
func TestChartCRDs(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/cluster-inventory-api").Output()
	if err != nil {
		t.Fatal(err)
	}
	const name = "multicluster.x-k8s.io_clusterprofiles.yaml"
	want, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "config", "crd", "bases", name))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join("..", "..", "charts", "hubsync", "crds")
	got, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("charts/hubsync/crds/%s differs from the pinned cluster-inventory-api's: run make crds", name)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != name {
			t.Errorf("charts/hubsync/crds/%s: only the ClusterProfile CRD belongs there", e.Name())
		}
	}
}
