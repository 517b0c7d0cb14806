package hub

import (
	"encoding/json"
	"testing"
)

// TestExecClusterConfigJSON pins the extension's wire form, which
// cp-creds, `hubsync creds` and client-go's exec plugins read.
func TestExecClusterConfigJSON(t *testing.T) {
	for _, cluster := range []string{"c1", "edge-eu-1.example"} {
		raw := ExecClusterConfigJSON(cluster)
		if got, want := string(raw), `{"clusterName":"`+cluster+`"}`; got != want {
			t.Errorf("ExecClusterConfigJSON(%q) = %s, want %s", cluster, got, want)
		}
		var back ExecClusterConfig
		if err := json.Unmarshal(raw, &back); err != nil || back.ClusterName != cluster {
			t.Errorf("%s reads back as %+v, %v", raw, back, err)
		}
	}
}
