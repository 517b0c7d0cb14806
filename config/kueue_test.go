package config

import (
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// validated decodes doc, defaults it and returns the field paths of every
// validation error, sorted.
func validated(t *testing.T, doc string) (*Config, []string) {
	t.Helper()
	c := &Config{}
	if err := yaml.UnmarshalStrict([]byte(doc), c); err != nil {
		t.Fatal(err)
	}
	c.SetDefaults()
	var paths []string
	for _, e := range c.validate() {
		paths = append(paths, e.Field)
	}
	slices.Sort(paths)
	return c, paths
}

const kueueProviders = "accessProviders:\n- {name: proxy, server: 'https://cluster-proxy-addon-user.ocm-addon:9092/{{.ClusterName}}'}\n"

func TestKueueSinkValidation(t *testing.T) {
	sink := func(section string, extra string) string {
		return kueueProviders + "sinks:\n- name: multikueue\n  type: kueue\n  kueue: " + section + "\n" + extra
	}
	secret := "{accessProvider: proxy, managedServiceAccount: kueue}"
	for _, tc := range []struct {
		name, doc string
		want      []string
	}{
		{name: "source secret", doc: sink(secret, "")},
		{name: "source secret with a config, labels and Kueue's namespace named in the filter",
			doc: sink("{accessProvider: proxy, managedServiceAccount: kueue, multiKueueConfig: hubsync, labels: {team: ml}}", "  filter: {namespaces: [kueue-system]}\n")},
		{name: "source clusterProfile", doc: sink("{source: clusterProfile}", "")},
		{name: "source clusterProfile needs no credential copies", doc: "credentials: {enabled: false}\n" + sink("{source: clusterProfile}", "")},
		{name: "source clusterProfile with secret-only fields", doc: sink("{source: clusterProfile, accessProvider: proxy, managedServiceAccount: kueue}", ""),
			want: []string{"sinks[0].kueue.accessProvider", "sinks[0].kueue.managedServiceAccount"}},
		{name: "source secret without provider or credential", doc: sink("{}", ""),
			want: []string{"sinks[0].kueue.accessProvider", "sinks[0].kueue.managedServiceAccount"}},
		{name: "source secret needs credential copies", doc: "credentials: {enabled: false}\n" + sink(secret, ""), want: []string{"sinks[0].kueue"}},
		{name: "unknown provider", doc: sink("{accessProvider: nope, managedServiceAccount: kueue}", ""), want: []string{"sinks[0].kueue.accessProvider"}},
		{name: "unknown source", doc: sink("{source: path}", ""), want: []string{"sinks[0].kueue.source"}},
		{name: "bad namespace, config name and label", doc: sink("{namespace: Kueue, multiKueueConfig: 'A B', labels: {'a b': c}, accessProvider: proxy, managedServiceAccount: kueue}", ""),
			want: []string{"sinks[0].kueue.labels[a b]", "sinks[0].kueue.multiKueueConfig", "sinks[0].kueue.namespace"}},
		{name: "filter naming another namespace", doc: sink(secret, "  filter: {namespaces: [kueue-system, team-a]}\n"), want: []string{"sinks[0].filter.namespaces[1]"}},
		{name: "filter on event types", doc: sink(secret, "  filter: {eventTypes: [io.hubsync.profile.created]}\n"), want: []string{"sinks[0].filter.eventTypes"}},
		{name: "two kueue sinks", doc: sink(secret, "- {name: other, type: kueue, kueue: {namespace: kueue-two, source: clusterProfile}}\n"), want: []string{"sinks[1].kueue"}},
		{name: "section missing", doc: "sinks:\n- {name: k, type: kueue}\n", want: []string{"sinks[0].kueue"}},
		{name: "section of another type", doc: sink(secret, "  kubeconfig: {directory: /x}\n"), want: []string{"sinks[0].kubeconfig"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, got := validated(t, tc.doc)
			if !slices.Equal(got, tc.want) {
				t.Errorf("errors at %v, want %v", got, tc.want)
			}
		})
	}
}

func TestKubeconfigConsumerKueue(t *testing.T) {
	files := func(fields string) string {
		return kueueProviders + "sinks:\n- {name: files, type: kubeconfig, kubeconfig: {directory: /etc/multikueue/kubeconfigs, accessProvider: proxy, managedServiceAccount: kueue" + fields + "}}\n"
	}
	for _, tc := range []struct {
		name, doc string
		want      []string
		wantAuth  string
	}{
		{name: "consumer kueue defaults to token auth", doc: files(", consumer: kueue"), wantAuth: AuthToken},
		{name: "consumer kueue with token auth", doc: files(", consumer: kueue, auth: token"), wantAuth: AuthToken},
		{name: "consumer kueue refuses exec auth", doc: files(", consumer: kueue, auth: exec"), want: []string{"sinks[0].kubeconfig.auth"}, wantAuth: AuthExec},
		{name: "no consumer keeps the exec default", doc: files(""), wantAuth: AuthExec},
		{name: "unknown consumer", doc: files(", consumer: argo"), want: []string{"sinks[0].kubeconfig.consumer"}, wantAuth: AuthExec},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, got := validated(t, tc.doc)
			if !slices.Equal(got, tc.want) {
				t.Errorf("errors at %v, want %v", got, tc.want)
			}
			if a := c.Sinks[0].Kubeconfig.Auth; a != tc.wantAuth {
				t.Errorf("auth %q, want %q", a, tc.wantAuth)
			}
		})
	}
}

func TestKueueWarnings(t *testing.T) {
	files := func(name, dir, fields string) string {
		return "sinks:\n- {name: " + name + ", type: kubeconfig, kubeconfig: {directory: " + dir + ", accessProvider: proxy, managedServiceAccount: kueue" + fields + "}}\n"
	}
	badHost := "accessProviders:\n- {name: proxy, server: 'https://proxy_user.ocm:9092/{{.ClusterName}}'}\n"
	for _, tc := range []struct {
		name, doc string
		// want are substrings of the one warning expected; none when empty.
		want []string
	}{
		{name: "consumer kueue under Kueue's directory", doc: kueueProviders + files("files", "/etc/multikueue/kubeconfigs/hub-a", ", consumer: kueue")},
		{name: "consumer kueue elsewhere", doc: kueueProviders + files("files", "/var/lib/hubsync/kubeconfigs", ", consumer: kueue"),
			want: []string{"sinks[0] (files).kubeconfig.directory /var/lib/hubsync/kubeconfigs is not under /etc/multikueue/kubeconfigs/", "MultiKueueKubeConfigPathValidation"}},
		{name: "consumer kueue in a sibling of Kueue's directory", doc: kueueProviders + files("files", "/etc/multikueue/kubeconfigs-old", ", consumer: kueue"),
			want: []string{"is not under /etc/multikueue/kubeconfigs/"}},
		{name: "exec sink named for Kueue", doc: kueueProviders + files("multikueue", "/var/lib/files", ""),
			want: []string{"sinks[0] (multikueue) writes kubeconfigs with auth exec", "set kubeconfig.consumer: kueue", "type kueue"}},
		{name: "exec sink writing a Kueue directory", doc: kueueProviders + files("files", "/var/lib/kueue", ""), want: []string{"auth exec"}},
		{name: "exec sink for Kueue's namespace", doc: kueueProviders + "sinks:\n- {name: files, type: kubeconfig, filter: {namespaces: [kueue-system]}, kubeconfig: {directory: /var/lib/files, accessProvider: proxy, managedServiceAccount: kueue}}\n",
			want: []string{"auth exec"}},
		{name: "exec sink for something else", doc: kueueProviders + files("ci", "/var/lib/ci", "")},
		{name: "token sink named for Kueue", doc: kueueProviders + files("multikueue", "/var/lib/files", ", auth: token")},
		{name: "kueue sink with a host Kueue refuses", doc: badHost + "sinks:\n- {name: mk, type: kueue, kueue: {accessProvider: proxy, managedServiceAccount: kueue}}\n",
			want: []string{"sinks[0] (mk).kueue: access provider proxy", `"proxy_user.ocm"`, "this sink would write no kubeconfig"}},
		{name: "kueue sink with clusterProfile source", doc: badHost + "sinks:\n- {name: mk, type: kueue, kueue: {source: clusterProfile}}\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, errs := validated(t, tc.doc)
			if len(errs) > 0 {
				t.Fatalf("invalid: %v", errs)
			}
			var got []string
			for _, w := range c.Warnings() {
				if strings.Contains(w, "sinks[") {
					got = append(got, w)
				}
			}
			switch {
			case len(tc.want) == 0 && len(got) > 0:
				t.Errorf("warnings %q, want none", got)
			case len(tc.want) > 0 && len(got) != 1:
				t.Errorf("warnings %q, want one", got)
			case len(tc.want) > 0:
				for _, w := range tc.want {
					if !strings.Contains(got[0], w) {
						t.Errorf("warning %q lacks %q", got[0], w)
					}
				}
			}
		})
	}
}

// TestCheckKueueServer: Kueue accepts a server whose host is an IP
// address or a DNS-1123 name, whatever the port, path or case.
func TestCheckKueueServer(t *testing.T) {
	for _, tc := range []struct {
		server string
		ok     bool
	}{
		{"https://cluster-proxy-addon-user.open-cluster-management-addon:9092/eu-1", true},
		{"https://10.0.0.1:6443", true},
		{"https://127.0.0.1", true},
		{"https://[fd00::1]:6443", true},
		{"https://API.Example.COM", true},
		{"https://gw.example:8443/prod-eu-1", true},
		{"", false},
		{"api.example.com:6443", false},
		{"https://", false},
		{"https://proxy_user.example:9092/x", false},
		{"https://-bad.example", false},
		{"https://[fd00::1]", false},
		{"https://a..b", false},
	} {
		err := CheckKueueServer(tc.server)
		if (err == nil) != tc.ok {
			t.Errorf("CheckKueueServer(%q) = %v, want ok %v", tc.server, err, tc.ok)
		}
	}
}
