package argocd

import (
	"context"
	"encoding/base64"
	"testing"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/stream"
)

// TestExecPluginConfig checks the exec stanza byte for byte, in Argo CD's
// field order: by default the cluster is in the arguments and no field
// Argo CD 3.2 lacks is written; with provideClusterInfo the cluster comes
// from the cluster config Argo CD 3.5 hands the plugin, for hubsync creds
// and cp-creds alike.
func TestExecPluginConfig(t *testing.T) {
	ctx := context.Background()
	ca := base64.StdEncoding.EncodeToString(testCA)
	const head = `{"tlsClientConfig":{"insecure":false,"caData":"`
	for _, tc := range []struct {
		name   string
		mutate func(*config.ArgoCDSink)
		want   string
	}{{
		name: "Argo CD 3.2: the cluster in the arguments",
		want: head + ca + `"},"execProviderConfig":{"command":"/usr/local/bin/hubsync",` +
			`"args":["creds","--managed-serviceaccount=argocd","--cluster=c1","--namespace=team-a"],` +
			`"apiVersion":"client.authentication.k8s.io/v1","installHint":"hubsync must be in the image"}}`,
	}, {
		name:   "Argo CD 3.5: hubsync creds with the cluster info",
		mutate: func(a *config.ArgoCDSink) { a.ProvideClusterInfo = true },
		want: head + ca + `"},"execProviderConfig":{"command":"/usr/local/bin/hubsync",` +
			`"args":["creds","--managed-serviceaccount=argocd","--namespace=team-a"],` +
			`"apiVersion":"client.authentication.k8s.io/v1","installHint":"hubsync must be in the image",` +
			`"provideClusterInfo":true,"config":{"clusterName":"c1"}}}`,
	}, {
		name: "Argo CD 3.5: cp-creds",
		mutate: func(a *config.ArgoCDSink) {
			a.ProvideClusterInfo, a.ExecPlugin = true, config.ExecPluginCPCreds
			a.Exec = config.ExecAuth{Command: "/plugins/cp-creds"}
		},
		want: head + ca + `"},"execProviderConfig":{"command":"/plugins/cp-creds",` +
			`"args":["--managed-serviceaccount=argocd"],"env":{"NAMESPACE":"team-a"},` +
			`"apiVersion":"client.authentication.k8s.io/v1","provideClusterInfo":true,"config":{"clusterName":"c1"}}}`,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.mutate)
			if err := e.sink.Resync(ctx, []stream.Change{profile(stream.ProfileUpdated, consumer, "c1", server("c1"))}); err != nil {
				t.Fatal(err)
			}
			if got := string(e.get(t, "hubsync-prod-c1").Data["config"]); got != tc.want {
				t.Errorf("config\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

// TestSwitchingClusterInfoRewritesOnce: turning provideClusterInfo on
// rewrites each Secret once (Argo CD then re-lists that cluster once), and
// later resyncs write nothing.
func TestSwitchingClusterInfoRewritesOnce(t *testing.T) {
	ctx := context.Background()
	snap := []stream.Change{profile(stream.ProfileUpdated, consumer, "c1", server("c1"))}
	before := newEnv(t, nil)
	if err := before.sink.Resync(ctx, snap); err != nil {
		t.Fatal(err)
	}
	// A new sink on the same hub, as a configuration reload makes it.
	sec := before.get(t, "hubsync-prod-c1")
	after := newEnv(t, func(a *config.ArgoCDSink) { a.ProvideClusterInfo = true }, sec)
	for range 2 {
		if err := after.sink.Resync(ctx, snap); err != nil {
			t.Fatal(err)
		}
	}
	if w := after.writes(); w["update"] != 1 || len(w) != 1 {
		t.Errorf("writes %v, want one update", w)
	}
	exec := decodeConfig(t, after.get(t, "hubsync-prod-c1"))["execProviderConfig"].(map[string]any)
	if exec["provideClusterInfo"] != true {
		t.Errorf("exec config after the switch: %v", exec)
	}
}
