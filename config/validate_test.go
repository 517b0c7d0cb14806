package config

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// TestLeaderElectionTimings: a lock client-go would refuse (and RunOrDie
// panic on) is refused when the file is loaded, with the field's path.
// Each case is also put to client-go's own check, so that the two agree.
func TestLeaderElectionTimings(t *testing.T) {
	if LeaderElectionJitterFactor != leaderelection.JitterFactor {
		t.Fatalf("LeaderElectionJitterFactor = %v; client-go's leaderelection.JitterFactor is %v", LeaderElectionJitterFactor, leaderelection.JitterFactor)
	}
	tests := []struct {
		name                string
		lease, renew, retry time.Duration
		disabled            bool
		wantPaths           []string
	}{
		{name: "defaults", lease: 15 * time.Second, renew: 10 * time.Second, retry: 2 * time.Second},
		{name: "renew just above retry × 1.2", lease: 15 * time.Second, renew: 10*time.Second + time.Millisecond, retry: 25 * time.Second / 3},
		{name: "renew above retry but within its jitter", lease: 15 * time.Second, renew: 10 * time.Second, retry: 9 * time.Second,
			wantPaths: []string{"leaderElection.renewDeadline"}},
		{name: "renew exactly retry × 1.2", lease: 15 * time.Second, renew: 12 * time.Second, retry: 10 * time.Second,
			wantPaths: []string{"leaderElection.renewDeadline"}},
		{name: "renew equal to retry", lease: 15 * time.Second, renew: 5 * time.Second, retry: 5 * time.Second,
			wantPaths: []string{"leaderElection.renewDeadline"}},
		{name: "lease equal to renew", lease: 10 * time.Second, renew: 10 * time.Second, retry: 2 * time.Second,
			wantPaths: []string{"leaderElection.leaseDuration"}},
		{name: "both wrong", lease: 8 * time.Second, renew: 10 * time.Second, retry: 9 * time.Second,
			wantPaths: []string{"leaderElection.leaseDuration", "leaderElection.renewDeadline"}},
		{name: "not checked while disabled", disabled: true, lease: 15 * time.Second, renew: 10 * time.Second, retry: 9 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc := fmt.Sprintf("leaderElection: {enabled: %t, leaseDuration: %s, renewDeadline: %s, retryPeriod: %s}\n",
				!tt.disabled, tt.lease, tt.renew, tt.retry)
			_, err := Parse([]byte(doc))
			for _, p := range tt.wantPaths {
				if err == nil || !strings.Contains(err.Error(), p) {
					t.Errorf("Parse() error = %v; want one naming %s", err, p)
				}
			}
			if len(tt.wantPaths) == 0 && err != nil {
				t.Errorf("Parse() error = %v; want none", err)
			}
			if tt.disabled {
				return
			}
			_, clientGoErr := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
				Lock:          &resourcelock.LeaseLock{LockConfig: resourcelock.ResourceLockConfig{Identity: "replica-1"}},
				LeaseDuration: tt.lease, RenewDeadline: tt.renew, RetryPeriod: tt.retry,
				Callbacks: leaderelection.LeaderCallbacks{OnStartedLeading: func(context.Context) {}, OnStoppedLeading: func() {}},
			})
			if (clientGoErr == nil) != (err == nil) {
				t.Errorf("config says %v, client-go says %v: they must agree", err, clientGoErr)
			}
		})
	}
}

// TestValidateReadsNoFile: Validate and Decode judge the struct alone, so
// a command run away from the daemon's files (hubsync kubeconfig) can use
// them; Parse, which the daemon runs, reports each file it cannot read.
func TestValidateReadsNoFile(t *testing.T) {
	dir := t.TempDir()
	missing := dir + "/missing"
	empty := writeFile(t, "empty-token", " \n")
	tests := []struct {
		name, doc, wantPath, wantMsg string
	}{
		{name: "hub kubeconfig", doc: "hub: {kubeconfig: " + missing + "}\n", wantPath: "hub.kubeconfig"},
		{name: "provider CA", doc: "accessProviders: [{name: p, server: 'https://proxy/{{.ClusterName}}', caFile: " + missing + "}]\n",
			wantPath: "accessProviders[0].caFile"},
		{name: "bus credentials", doc: "bus: {urls: ['nats://nats:4222'], credsFile: " + missing + "}\n", wantPath: "bus.credsFile"},
		{name: "embedded token empty", doc: "bus: {embedded: {authTokenFile: " + empty + "}}\n",
			wantPath: "bus.embedded.authTokenFile", wantMsg: "is empty"},
		{name: "gateway certificate", doc: "tunnel: {enabled: true, transport: direct, managedServiceAccount: gw}\n" +
			"gateway: {enabled: true, tls: {certFile: " + missing + ", keyFile: " + missing + "}}\n", wantPath: "gateway.tls.certFile"},
		{name: "webhook secrets", doc: "sinks: [{name: hook, type: webhook, webhook: {url: 'https://hook.example', secretsFile: " + missing + "}}]\n",
			wantPath: "sinks[0].webhook.secretsFile"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Decode([]byte(tt.doc))
			if err != nil {
				t.Fatalf("Decode() error = %v; want none: the struct is valid", err)
			}
			if err := c.Validate(); err != nil {
				t.Errorf("Validate() = %v; want nil: it must not read files", err)
			}
			_, err = Parse([]byte(tt.doc))
			msg := cmp.Or(tt.wantMsg, "cannot read")
			if err == nil || !strings.Contains(err.Error(), tt.wantPath) || !strings.Contains(err.Error(), msg) {
				t.Errorf("Parse() error = %v; want %s: %s", err, tt.wantPath, msg)
			}
		})
	}
}

// TestDecodeErrorsAll: values of the wrong type and durations Go cannot
// parse are all reported, each at its field path and saying what is
// allowed, not only the first, and never with the decoder's bare words.
func TestDecodeErrorsAll(t *testing.T) {
	doc := `
hub: {qps: "fast", burst: 3}
resyncPeriod: 5 minutes
workers: {topology: [1]}
sinks:
- {name: h, type: webhook, webhook: {url: 'https://x/', timeout: forever}}
tunnel: {bogus: 1}
`
	_, err := Decode([]byte(doc))
	if err == nil {
		t.Fatal("Decode accepted it")
	}
	for _, want := range []string{
		`hub.qps: Invalid value: "fast": must be number, not string`,
		`resyncPeriod: Invalid value: "5 minutes": must be a duration such as 30s, 1m30s or 2h`,
		`sinks[0].webhook.timeout: Invalid value: "forever": must be a duration`,
		`workers.topology: Invalid value: [1]: must be integer, not array`,
		`tunnel.bogus: Forbidden: unknown field`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q:\n%v", want, err)
		}
	}
}
