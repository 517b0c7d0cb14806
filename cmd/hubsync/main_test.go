package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeFile writes a file named name in dir for a test and returns its path.
func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestMainCommands(t *testing.T) {
	dir := t.TempDir()
	good := writeFile(t, dir, "good.yaml", "clusterManager: open-cluster-management\nworkers:\n  topology: 4\n")
	badBus := writeFile(t, dir, "badbus.yaml", "bus:\n  urls: [\"http://nats:4222\"]\n  credsFile: /nonexistent/user.creds\n  tls: {caFile: /nonexistent/ca.pem}\n")
	impersonatorSink := writeFile(t, dir, "impersonator.yaml", "tunnel: {enabled: true, transport: direct, managedServiceAccount: gateway-impersonator}\n"+
		"accessProviders: [{name: direct, type: direct}]\n"+
		"sinks:\n- {name: files, type: kubeconfig, kubeconfig: {directory: /var/lib/kubeconfigs, accessProvider: direct, managedServiceAccount: gateway-impersonator}}\n")
	providers := "accessProviders: [{name: proxy, server: 'https://cluster-proxy-addon-user.ocm:9092/{{.ClusterName}}'}]\n"
	kueueExec := writeFile(t, dir, "kueue-exec.yaml", providers+
		"sinks:\n- {name: files, type: kubeconfig, kubeconfig: {directory: /etc/multikueue/kubeconfigs, accessProvider: proxy, managedServiceAccount: kueue, consumer: kueue, auth: exec}}\n")
	multikueueExec := writeFile(t, dir, "multikueue-exec.yaml", providers+
		"sinks:\n- {name: multikueue, type: kubeconfig, filter: {namespaces: [kueue-system]}, kubeconfig: {directory: /var/lib/hubsync/kubeconfigs, accessProvider: proxy, managedServiceAccount: kueue}}\n")
	kueueOutside := writeFile(t, dir, "kueue-outside.yaml", providers+
		"sinks:\n- {name: multikueue, type: kubeconfig, kubeconfig: {directory: /var/lib/hubsync/kubeconfigs, accessProvider: proxy, managedServiceAccount: kueue, consumer: kueue}}\n")
	bad := writeFile(t, dir, "bad.yaml", "hub:\n  qps: -3\n  qsp: 3\nlogging:\n  level: loud\nserver:\n  address: nope\nresyncPeriod: 5s\n")
	for _, tc := range []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout []string
		wantStderr []string
	}{
		{name: "no command", args: nil, wantCode: 2, wantStderr: []string{"Usage:"}},
		{name: "unknown command", args: []string{"frobnicate"}, wantCode: 2, wantStderr: []string{`unknown command "frobnicate"`}},
		{name: "version", args: []string{"version"}, wantCode: 0, wantStdout: []string{"hubsync ", "commit:", "built:", "go:       go1.", "platform:"}},
		{name: "completion bash", args: []string{"completion", "bash"}, wantCode: 0, wantStdout: []string{"complete -o default -F _hubsync hubsync", "run check-config creds", "completion install version"}},
		{name: "completion fish", args: []string{"completion", "fish"}, wantCode: 0, wantStdout: []string{"complete -c hubsync", "bus-accounts status"}},
		{name: "completion of no shell", args: []string{"completion", "tcsh"}, wantCode: 2, wantStderr: []string{"usage: hubsync completion bash|zsh|fish"}},
		{name: "run with a bad log level", args: []string{"run", "--log-level", "loud"}, wantCode: 2, wantStderr: []string{`--log-level "loud": want one of debug, info, warn, error`}},
		{name: "run with an unknown flag", args: []string{"run", "--nope"}, wantCode: 2, wantStderr: []string{"flag provided but not defined: -nope"}},
		{name: "version json", args: []string{"version", "-o", "json"}, wantCode: 0, wantStdout: []string{`"gitVersion": "`, `"gitCommit": "`, `"buildDate": "`, `"goVersion": "go1.`, `"platform": "`}},
		{name: "version, bad output", args: []string{"version", "-o", "yaml"}, wantCode: 2, wantStderr: []string{"usage: hubsync version"}},
		{name: "status: unknown output format", args: []string{"status", "-o", "yaml"}, wantCode: 2, wantStderr: []string{"usage: hubsync status"}},
		{name: "status: nothing listens", args: []string{"status", "--address", "127.0.0.1:1"}, wantCode: 1,
			wantStderr: []string{"no answer from http://127.0.0.1:1/metrics", "kubectl port-forward"}},
		{name: "help", args: []string{"help"}, wantCode: 0, wantStdout: []string{"check-config"}},
		{name: "check-config ok", args: []string{"check-config", good}, wantCode: 0, wantStdout: []string{"good.yaml: ok"}},
		{name: "check-config prints defaults", args: []string{"check-config", "--print", good}, wantCode: 0,
			wantStdout: []string{"qps: -1", "topology: 4", "address: :8080"}},
		{name: "check-config reports every problem", args: []string{"check-config", bad}, wantCode: 1, wantStderr: []string{
			"5 problems", "hub.qps", "hub.qsp: Forbidden: unknown field", "logging.level", "server.address", "resyncPeriod",
		}},
		{name: "check-config reports bad NATS settings", args: []string{"check-config", badBus}, wantCode: 1, wantStderr: []string{
			"3 problems", "bus.urls[0]", "must be nats://", "bus.credsFile", "cannot read", "bus.tls.caFile",
		}},
		{name: "check-config refuses a sink handing out the gateway's impersonating credential", args: []string{"check-config", impersonatorSink}, wantCode: 1,
			wantStderr: []string{"impersonator.yaml", `sinks[0].kubeconfig.managedServiceAccount: Invalid value: "gateway-impersonator": is the gateway's impersonating credential`,
				"it may impersonate anyone on its clusters and is never handed to consumers; use another ManagedServiceAccount"}},
		{name: "check-config refuses exec auth for Kueue", args: []string{"check-config", kueueExec}, wantCode: 1,
			wantStderr: []string{`sinks[0].kubeconfig.auth: Invalid value: "exec": consumer kueue: Kueue refuses kubeconfigs that run an exec plugin`, "use auth: token"}},
		{name: "check-config warns of exec auth that looks meant for Kueue", args: []string{"check-config", multikueueExec}, wantCode: 0,
			wantStdout: []string{"multikueue-exec.yaml: ok"},
			wantStderr: []string{"multikueue-exec.yaml: warning: sinks[0] (multikueue) writes kubeconfigs with auth exec", "set kubeconfig.consumer: kueue"}},
		{name: "check-config warns of a Kueue directory Kueue may not read", args: []string{"check-config", kueueOutside}, wantCode: 0,
			wantStdout: []string{"kueue-outside.yaml: ok"},
			wantStderr: []string{"kueue-outside.yaml: warning: sinks[0] (multikueue).kubeconfig.directory /var/lib/hubsync/kubeconfigs is not under /etc/multikueue/kubeconfigs/"}},
		{name: "check-config missing file", args: []string{"check-config", filepath.Join(dir, "nope.yaml")}, wantCode: 1,
			wantStderr: []string{"nope.yaml", "no such file"}},
		{name: "check-config no file", args: []string{"check-config"}, wantCode: 2, wantStderr: []string{"Usage: hubsync check-config"}},
		{name: "check-config --connect on the embedded bus", args: []string{"check-config", "--connect", good}, wantCode: 1,
			wantStderr: []string{"--connect checks an external NATS (bus.urls)"}},
		{name: "bus-accounts for the embedded bus", args: []string{"bus-accounts", good}, wantCode: 1,
			wantStderr: []string{"bus.urls is empty: the embedded server makes its accounts itself"}},
		{name: "bus-accounts no file", args: []string{"bus-accounts"}, wantCode: 2, wantStderr: []string{"Usage: hubsync bus-accounts FILE"}},
		{name: "run with bad config", args: []string{"run", "--config", bad}, wantCode: 1, wantStderr: []string{"5 problems"}},
		{name: "run with stray argument", args: []string{"run", "extra"}, wantCode: 2, wantStderr: []string{"unexpected arguments"}},
		{name: "run outside a cluster without kubeconfig", args: []string{"run", "--config", good}, wantCode: 1,
			wantStderr: []string{"no hub.kubeconfig or --kubeconfig given and not running in a cluster"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("KUBERNETES_SERVICE_HOST", "")
			var stdout, stderr bytes.Buffer
			code := Main(context.Background(), tc.args, &stdout, &stderr)
			if code != tc.wantCode {
				t.Fatalf("exit code %d, want %d\nstdout: %s\nstderr: %s", code, tc.wantCode, stdout.String(), stderr.String())
			}
			for _, w := range tc.wantStdout {
				if !strings.Contains(stdout.String(), w) {
					t.Errorf("stdout lacks %q:\n%s", w, stdout.String())
				}
			}
			for _, w := range tc.wantStderr {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr.String())
				}
			}
		})
	}
}

// TestBuildInfo: the linker's values win; without them, what the Go
// toolchain recorded, and never an empty field.
func TestBuildInfo(t *testing.T) {
	defer func(v, c, d string) { version, commit, date = v, c, d }(version, commit, date)
	version, commit, date = "v1.2.3", "0123abc", "2026-11-29T00:00:00Z"
	if b := build(); b.Version != "v1.2.3" || b.Commit != "0123abc" || b.BuildDate != "2026-11-29T00:00:00Z" {
		t.Errorf("with the linker's values: %+v", b)
	}
	version, commit, date = "", "", ""
	b := build()
	for name, v := range map[string]string{"version": b.Version, "commit": b.Commit, "date": b.BuildDate, "go": b.GoVersion, "platform": b.Platform} {
		if v == "" {
			t.Errorf("%s is empty without the linker's values: %+v", name, b)
		}
	}
}
