package chart_test

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/test/chart"
	"github.com/hubsync/hubsync/test/testutil"
)

// The objects every rendering holds unless a value turns them off.
var baseObjects = []string{
	"ClusterRole/hubsync", "ClusterRoleBinding/hubsync",
	"ClusterRole/hubsync-credentials", "ClusterRoleBinding/hubsync-credentials",
	"ClusterRole/hubsync-kueue", "ClusterRoleBinding/hubsync-kueue",
	"ConfigMap/hubsync-config", "StatefulSet/hubsync", "NetworkPolicy/hubsync",
	"PodDisruptionBudget/hubsync", "Lease/hubsync", "Role/hubsync-leader-election", "RoleBinding/hubsync-leader-election",
	"ServiceAccount/hubsync", "ValidatingAdmissionPolicy/hubsync-secret-writes",
	"ValidatingAdmissionPolicyBinding/hubsync-secret-writes",
	"Service/hubsync-bus", "Service/hubsync-nats", "Secret/hubsync-bus-tls", "ConfigMap/hubsync-bus-ca",
}

// busObjects are what the embedded bus adds: its Services, TLS Secret and
// CA.
var busObjects = []string{"Service/hubsync-bus", "Service/hubsync-nats", "Secret/hubsync-bus-tls", "ConfigMap/hubsync-bus-ca"}

// gatewayObjects are what config.gateway.enabled adds.
var gatewayObjects = []string{
	"ClusterRole/hubsync-gateway", "ClusterRoleBinding/hubsync-gateway",
	"FlowSchema/hubsync-gateway", "PriorityLevelConfiguration/hubsync-gateway",
	"Role/hubsync-gateway-serving-cert", "RoleBinding/hubsync-gateway-serving-cert",
	"Service/hubsync-gateway",
}

// without returns list less the given entries.
func without(list []string, drop ...string) []string {
	return slices.DeleteFunc(slices.Clone(list), func(s string) bool { return slices.Contains(drop, s) })
}

// with returns list plus the given entries, sorted.
func with(list []string, add ...string) []string {
	out := append(slices.Clone(list), add...)
	slices.Sort(out)
	return out
}

// renderedConfig is hubsync's configuration as the rendered ConfigMap
// holds it, decoded strictly and defaulted as the daemon does.
func renderedConfig(t *testing.T, objs []object) (*config.Config, string) {
	t.Helper()
	cm := find[*corev1.ConfigMap](objs, "hubsync-config")
	if cm == nil {
		t.Fatal("no ConfigMap hubsync-config")
	}
	text, ok := cm.Data["config.yaml"]
	if !ok {
		t.Fatal("ConfigMap hubsync-config has no config.yaml")
	}
	cfg, err := config.Decode([]byte(text))
	if err != nil {
		t.Fatalf("the rendered configuration: %v\n%s", err, text)
	}
	return cfg, text
}

// subjectsIn checks that every RBAC binding names the ServiceAccount
// hubsync in ns.
func subjectsIn(t *testing.T, objs []object, ns string) {
	t.Helper()
	want := []rbacv1.Subject{{Kind: "ServiceAccount", Name: "hubsync", Namespace: ns}}
	n := 0
	for _, o := range objs {
		var got []rbacv1.Subject
		switch b := o.typed.(type) {
		case *rbacv1.ClusterRoleBinding:
			got = b.Subjects
		case *rbacv1.RoleBinding:
			got = b.Subjects
		default:
			continue
		}
		n++
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: subjects %+v, want %+v", o, got, want)
		}
	}
	if n == 0 {
		t.Error("no RBAC binding")
	}
}

func TestRender(t *testing.T) {
	ch := loadChart(t)
	tests := []struct {
		name      string
		values    string
		namespace string
		want      []string // every object, as Kind/name
		check     func(t *testing.T, objs []object)
	}{
		{
			name: "defaults", values: `{}`, want: baseObjects,
			check: func(t *testing.T, objs []object) {
				subjectsIn(t, objs, chart.Namespace)
				d := find[*appsv1.StatefulSet](objs, "hubsync")
				if *d.Spec.Replicas != 3 || d.Spec.ServiceName != "hubsync-bus" || d.Spec.PodManagementPolicy != appsv1.ParallelPodManagement ||
					d.Spec.UpdateStrategy.Type != appsv1.RollingUpdateStatefulSetStrategyType {
					t.Errorf("statefulset: replicas %d, service %s, pod management %s, update %+v; want 3, hubsync-bus, Parallel, RollingUpdate",
						*d.Spec.Replicas, d.Spec.ServiceName, d.Spec.PodManagementPolicy, d.Spec.UpdateStrategy)
				}
				checkClusteredBus(t, objs, chart.Namespace, 3)
				if c := d.Spec.Template.Spec.Containers[0]; c.Image != "ghcr.io/hubsync/hubsync:v0.1.0" || c.Resources.Limits.Memory().String() != "256Mi" {
					t.Errorf("container image %s, memory limit %s", c.Image, c.Resources.Limits.Memory())
				}
				if len(d.Spec.Template.Spec.TopologySpreadConstraints) != 2 {
					t.Errorf("topology spread %+v", d.Spec.Template.Spec.TopologySpreadConstraints)
				}
				cfg, _ := renderedConfig(t, objs)
				if cfg.LeaderElection.Namespace != chart.Namespace || !cfg.LeaderElection.Enabled {
					t.Errorf("leaderElection %+v", cfg.LeaderElection)
				}
				if cfg.Gateway.URL != "https://hubsync-gateway."+chart.Namespace+".svc:8443" {
					t.Errorf("gateway.url %q", cfg.Gateway.URL)
				}
				// Helm's labels are on every object, and the pods'
				// selector stays without them.
				for _, o := range objs {
					var m struct {
						Metadata metav1.ObjectMeta `json:"metadata"`
					}
					if err := yaml.Unmarshal(o.yaml, &m); err != nil {
						t.Fatal(err)
					}
					if m.Metadata.Labels["helm.sh/chart"] != "hubsync-0.1.0" || m.Metadata.Labels["app.kubernetes.io/managed-by"] != "Helm" {
						t.Errorf("%s: labels %v", o, m.Metadata.Labels)
					}
				}
				if len(d.Spec.Selector.MatchLabels) != 2 {
					t.Errorf("selector %v", d.Spec.Selector.MatchLabels)
				}
			},
		},
		{
			name: "another namespace", namespace: "hubsync-system",
			values: `config: {gateway: {enabled: true}, tunnel: {enabled: true, managedServiceAccount: hubsync-gateway}}`, want: with(baseObjects, gatewayObjects...),
			check: func(t *testing.T, objs []object) {
				subjectsIn(t, objs, "hubsync-system")
				for _, o := range objs {
					if o.ns != "" && o.ns != "hubsync-system" {
						t.Errorf("%s: namespace %s", o, o.ns)
					}
				}
				p := find[*admissionv1.ValidatingAdmissionPolicy](objs, "hubsync-secret-writes")
				if got := p.Spec.MatchConditions[0].Expression; !strings.Contains(got, `"system:serviceaccount:hubsync-system:hubsync"`) {
					t.Errorf("admission policy matches %s", got)
				}
				fs := find[*flowcontrolv1.FlowSchema](objs, "hubsync-gateway")
				if sa := fs.Spec.Rules[0].Subjects[0].ServiceAccount; sa.Namespace != "hubsync-system" || sa.Name != "hubsync" {
					t.Errorf("flow schema subject %+v", sa)
				}
				cfg, _ := renderedConfig(t, objs)
				if cfg.LeaderElection.Namespace != "hubsync-system" || cfg.Gateway.TLS.Secret.Namespace != "hubsync-system" ||
					cfg.Gateway.URL != "https://hubsync-gateway.hubsync-system.svc:8443" {
					t.Errorf("configuration: leaderElection %+v, gateway url %s tls %+v", cfg.LeaderElection, cfg.Gateway.URL, cfg.Gateway.TLS)
				}
			},
		},
		{
			name:   "gateway on another port",
			values: `config: {gateway: {enabled: true, listen: ":9443", url: https://gw.example.com}, tunnel: {enabled: true, managedServiceAccount: hubsync-gateway}}`, want: with(baseObjects, gatewayObjects...),
			check: func(t *testing.T, objs []object) {
				svc := find[*corev1.Service](objs, "hubsync-gateway")
				if p := svc.Spec.Ports[0]; p.Port != 9443 || p.TargetPort.String() != "gateway" {
					t.Errorf("service port %+v", p)
				}
				d := find[*appsv1.StatefulSet](objs, "hubsync")
				if !selectsPods(svc.Spec.Selector, d) {
					t.Errorf("service selector %v misses the pods", svc.Spec.Selector)
				}
				if p := d.Spec.Template.Spec.Containers[0].Ports[1]; p.Name != "gateway" || p.ContainerPort != 9443 {
					t.Errorf("container port %+v", p)
				}
				if cfg, _ := renderedConfig(t, objs); cfg.Gateway.URL != "https://gw.example.com" {
					t.Errorf("gateway.url %s: a set url must stay", cfg.Gateway.URL)
				}
				r := find[*rbacv1.Role](objs, "hubsync-gateway-serving-cert")
				if r.Namespace != chart.Namespace || !slices.Equal(r.Rules[0].ResourceNames, []string{"hubsync-gateway-tls"}) {
					t.Errorf("serving cert role %s/%s %+v", r.Namespace, r.Name, r.Rules)
				}
			},
		},
		{
			name:   "gateway with certificate files",
			values: `config: {gateway: {enabled: true, tls: {secret: null, certFile: /etc/tls/tls.crt, keyFile: /etc/tls/tls.key}}, tunnel: {enabled: true, managedServiceAccount: hubsync-gateway}}`,
			want:   with(baseObjects, without(gatewayObjects, "Role/hubsync-gateway-serving-cert", "RoleBinding/hubsync-gateway-serving-cert")...),
		},
		{
			name: "without credentials", values: `config: {credentials: {enabled: false}}`,
			want: with(without(baseObjects, "ClusterRole/hubsync-credentials", "ClusterRoleBinding/hubsync-credentials"),
				"Role/hubsync-ca-secret", "RoleBinding/hubsync-ca-secret"),
			check: func(t *testing.T, objs []object) {
				r := find[*rbacv1.Role](objs, "hubsync-ca-secret")
				if r.Namespace != "open-cluster-management-addon" || !slices.Equal(r.Rules[0].ResourceNames, []string{"cluster-proxy-user-serving-cert"}) ||
					!slices.Equal(r.Rules[0].Verbs, []string{"list", "watch"}) {
					t.Errorf("CA Secret role %s/%s %+v", r.Namespace, r.Name, r.Rules)
				}
				subjectsIn(t, objs, chart.Namespace)
			},
		},
		{
			name: "without credentials, two CA Secrets in one namespace",
			values: `
config:
  credentials: {enabled: false}
  accessProviders:
    - {name: a, type: server, server: "https://a/{{.ClusterName}}", caSecret: {namespace: certs, name: ca-a}}
    - {name: b, type: server, server: "https://b/{{.ClusterName}}", caSecret: {namespace: certs, name: ca-b}}
    - {name: c, type: direct}
`,
			want: with(without(baseObjects, "ClusterRole/hubsync-credentials", "ClusterRoleBinding/hubsync-credentials"),
				"Role/hubsync-ca-secret", "RoleBinding/hubsync-ca-secret"),
			check: func(t *testing.T, objs []object) {
				r := find[*rbacv1.Role](objs, "hubsync-ca-secret")
				if r.Namespace != "certs" || !slices.Equal(r.Rules[0].ResourceNames, []string{"ca-a", "ca-b"}) {
					t.Errorf("CA Secret role %s/%s %+v", r.Namespace, r.Name, r.Rules)
				}
			},
		},
		{
			name:   "without credentials or access providers",
			values: `config: {credentials: {enabled: false}, accessProviders: []}`,
			want:   without(baseObjects, "ClusterRole/hubsync-credentials", "ClusterRoleBinding/hubsync-credentials"),
		},
		{
			name:   "one replica",
			values: `{replicas: 1, topologySpread: false, podAnnotations: {a: b}, nodeSelector: {disk: ssd}}`,
			want:   without(baseObjects, "PodDisruptionBudget/hubsync"),
			check: func(t *testing.T, objs []object) {
				d := find[*appsv1.StatefulSet](objs, "hubsync")
				pod := d.Spec.Template
				if *d.Spec.Replicas != 1 || len(pod.Spec.TopologySpreadConstraints) != 0 || pod.Annotations["a"] != "b" || pod.Spec.NodeSelector["disk"] != "ssd" {
					t.Errorf("statefulset: replicas %d, spread %v, annotations %v, nodeSelector %v", *d.Spec.Replicas,
						pod.Spec.TopologySpreadConstraints, pod.Annotations, pod.Spec.NodeSelector)
				}
				// One node: reachable through hubsync-nats, no cluster.
				cfg, _ := renderedConfig(t, objs)
				if e := cfg.Bus.Embedded; e.Cluster.Name != "" || cfg.Bus.Stream.Replicas != 1 || e.Listen != "0.0.0.0:4222" || e.TLS.CertFile == "" {
					t.Errorf("bus: embedded %+v, stream replicas %d; want a single TLS node on 0.0.0.0:4222", e, cfg.Bus.Stream.Replicas)
				}
				if hasPort(d, "nats-route") || !hasPort(d, "nats") {
					t.Errorf("container ports %+v", d.Spec.Template.Spec.Containers[0].Ports)
				}
				np := find[*networkingv1.NetworkPolicy](objs, "hubsync")
				if len(np.Spec.Ingress) != 2 {
					t.Errorf("network policy rules %+v: want the metrics and the gateway's and bus's, no routes", np.Spec.Ingress)
				}
			},
		},
		{
			name:   "one replica, bus on loopback",
			values: `{replicas: 1, bus: {expose: false}}`,
			want:   with(without(baseObjects, append(busObjects, "PodDisruptionBudget/hubsync")...), "Service/hubsync-bus"),
			check: func(t *testing.T, objs []object) {
				cfg, _ := renderedConfig(t, objs)
				if e := cfg.Bus.Embedded; e.Listen != "127.0.0.1:4222" || e.TLS.CertFile != "" {
					t.Errorf("embedded %+v; want loopback without TLS", e)
				}
				for _, v := range find[*appsv1.StatefulSet](objs, "hubsync").Spec.Template.Spec.Volumes {
					if v.Name == "bus-tls" {
						t.Error("the bus's TLS Secret is mounted, though nothing uses it")
					}
				}
			},
		},
		{
			name:   "an external NATS",
			values: `config: {bus: {urls: ["tls://nats.nats.svc:4222"], tls: {caFile: /etc/nats/ca.crt}}}`,
			want:   without(baseObjects, busObjects...),
			check: func(t *testing.T, objs []object) {
				cfg, _ := renderedConfig(t, objs)
				if e := cfg.Bus.Embedded; e.Cluster.Name != "" || e.TLS.CertFile != "" || cfg.Bus.Stream.Replicas != 1 {
					t.Errorf("an external NATS, yet embedded %+v, stream replicas %d", e, cfg.Bus.Stream.Replicas)
				}
				if d := find[*appsv1.StatefulSet](objs, "hubsync"); hasPort(d, "nats") || hasPort(d, "nats-route") {
					t.Errorf("container ports %+v", d.Spec.Template.Spec.Containers[0].Ports)
				}
			},
		},
		{
			name:   "five replicas, persistent, the bus's TLS provided",
			values: `{replicas: 5, bus: {tls: {generate: false, secretName: bus-cert}, persistence: {enabled: true, size: 5Gi, storageClassName: fast}}}`,
			want:   without(baseObjects, "Secret/hubsync-bus-tls", "ConfigMap/hubsync-bus-ca"),
			check: func(t *testing.T, objs []object) {
				cfg, _ := renderedConfig(t, objs)
				if n := len(cfg.Bus.Embedded.Cluster.Routes); n != 5 || cfg.Bus.Stream.Replicas != 3 {
					t.Errorf("%d routes, stream replicas %d; want 5 and 3", n, cfg.Bus.Stream.Replicas)
				}
				d := find[*appsv1.StatefulSet](objs, "hubsync")
				for _, v := range d.Spec.Template.Spec.Volumes {
					if v.Name == "nats-data" {
						t.Error("nats-data is an emptyDir beside its claim")
					}
					if v.Name == "bus-tls" && v.Secret.SecretName != "bus-cert" {
						t.Errorf("bus-tls mounts %s", v.Secret.SecretName)
					}
				}
				if c := d.Spec.VolumeClaimTemplates; len(c) != 1 || c[0].Name != "nats-data" || *c[0].Spec.StorageClassName != "fast" ||
					c[0].Spec.Resources.Requests.Storage().String() != "5Gi" {
					t.Errorf("volume claims %+v", c)
				}
			},
		},
		{
			name:   "optional parts off",
			values: `{replicas: 1, rbac: {kueue: false}, admissionPolicy: {enabled: false}, networkPolicy: {enabled: false}, podDisruptionBudget: {enabled: false}, config: {leaderElection: {enabled: false}, bus: {enabled: false}}}`,
			want: without(baseObjects, "ClusterRole/hubsync-kueue", "ClusterRoleBinding/hubsync-kueue", "ValidatingAdmissionPolicy/hubsync-secret-writes",
				"ValidatingAdmissionPolicyBinding/hubsync-secret-writes", "NetworkPolicy/hubsync", "PodDisruptionBudget/hubsync",
				"Lease/hubsync", "Role/hubsync-leader-election", "RoleBinding/hubsync-leader-election", "Service/hubsync-bus", "Service/hubsync-nats",
				"Secret/hubsync-bus-tls", "ConfigMap/hubsync-bus-ca"),
		},
		{
			name:   "monitoring on",
			values: `{serviceMonitor: {enabled: true, labels: {release: prometheus}}, prometheusRule: {enabled: true}, dashboard: {enabled: true, annotations: {grafana_folder: hubsync}}}`,
			want:   with(baseObjects, "ConfigMap/hubsync-dashboard", "PrometheusRule/hubsync", "Service/hubsync-metrics", "ServiceMonitor/hubsync"),
			check:  checkMonitoring,
		},
		{
			name: "cluster permissions",
			values: `
clusterPermission: {clusters: [cluster-a, cluster-b]}
config:
  gateway: {enabled: true}
  tunnel: {enabled: true, managedServiceAccount: gw}
`,
			want: with(baseObjects, append(gatewayObjects, "ClusterPermission/hubsync-gateway-impersonator", "ClusterPermission/hubsync-gateway-impersonator",
				"ManagedServiceAccount/gw", "ManagedServiceAccount/gw")...),
			check: func(t *testing.T, objs []object) {
				var where []string
				for _, o := range objs {
					if o.gvk.Kind == "ClusterPermission" || o.gvk.Kind == "ManagedServiceAccount" {
						where = append(where, o.gvk.Kind+" "+o.ns)
						if !strings.Contains(string(o.yaml), "name: gw") {
							t.Errorf("%s does not name the ManagedServiceAccount gw:\n%s", o, o.yaml)
						}
					}
				}
				slices.Sort(where)
				if want := []string{"ClusterPermission cluster-a", "ClusterPermission cluster-b", "ManagedServiceAccount cluster-a", "ManagedServiceAccount cluster-b"}; !slices.Equal(where, want) {
					t.Errorf("got %v, want %v", where, want)
				}
			},
		},
		{
			name:   "configuration values as given",
			values: `config: {bus: {stream: {maxBytes: 10737418240}}, hub: {qps: 50, burst: 100}, logging: {level: debug}, resyncPeriod: 1h30m}`,
			want:   baseObjects,
			check: func(t *testing.T, objs []object) {
				cfg, text := renderedConfig(t, objs)
				if cfg.Bus.Stream.MaxBytes != 10737418240 || cfg.Hub.QPS != 50 || cfg.Hub.Burst != 100 || cfg.Logging.Level != "debug" ||
					cfg.ResyncPeriod.Duration.String() != "1h30m0s" {
					t.Errorf("the configuration did not keep the values:\n%s", text)
				}
				if !strings.HasPrefix(text, "apiVersion: hubsync.io/v1alpha1\nkind: Config\n") {
					t.Errorf("the configuration does not start with its apiVersion and kind:\n%s", text)
				}
			},
		},
		{
			name: "no chart labels", values: `chartLabels: false`, want: baseObjects,
			check: func(t *testing.T, objs []object) {
				for _, o := range objs {
					if strings.Contains(string(o.yaml), "helm.sh/chart") || strings.Contains(string(o.yaml), "Helm") {
						t.Errorf("%s carries Helm's labels:\n%s", o, o.yaml)
					}
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := tt.namespace
			if ns == "" {
				ns = chart.Namespace
			}
			objs := render(t, ch, tt.values, ns)
			want := slices.Sorted(slices.Values(tt.want))
			if got := kinds(objs); !slices.Equal(got, want) {
				t.Fatalf("rendered\n  %v\nwant\n  %v", got, want)
			}
			// Whatever else differs, the configuration is one hubsync
			// accepts, and the pods mount it.
			renderedConfig(t, objs)
			if tt.check != nil {
				tt.check(t, objs)
			}
		})
	}
}

// selectsPods reports whether a Service selector selects d's pods.
func selectsPods(sel map[string]string, d *appsv1.StatefulSet) bool {
	return len(sel) > 0 && labels.SelectorFromSet(sel).Matches(labels.Set(d.Spec.Template.Labels))
}

// checkMonitoring: the ServiceMonitor scrapes the metrics port of the
// pods through the metrics Service; the PrometheusRule holds the groups of
// files/alerts.yaml; the dashboard ConfigMap holds files/dashboard.json.
func checkMonitoring(t *testing.T, objs []object) {
	dir, err := chart.Dir()
	if err != nil {
		t.Fatal(err)
	}
	d := find[*appsv1.StatefulSet](objs, "hubsync")
	svc := find[*corev1.Service](objs, "hubsync-metrics")
	if !selectsPods(svc.Spec.Selector, d) || svc.Spec.Ports[0].Name != "metrics" || svc.Spec.Ports[0].TargetPort.String() != "metrics" {
		t.Errorf("metrics service %+v", svc.Spec)
	}
	sm := find[*monitoringv1.ServiceMonitor](objs, "hubsync")
	if !labels.SelectorFromSet(sm.Spec.Selector.MatchLabels).Matches(labels.Set(svc.Labels)) {
		t.Errorf("ServiceMonitor selector %v misses Service labels %v", sm.Spec.Selector.MatchLabels, svc.Labels)
	}
	if sm.Labels["release"] != "prometheus" || len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "metrics" {
		t.Errorf("ServiceMonitor labels %v endpoints %+v", sm.Labels, sm.Spec.Endpoints)
	}

	data, err := os.ReadFile(filepath.Join(dir, "files", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []monitoringv1.RuleGroup `json:"groups"`
	}
	if err := yaml.UnmarshalStrict(data, &file); err != nil {
		t.Fatalf("files/alerts.yaml: %v", err)
	}
	pr := find[*monitoringv1.PrometheusRule](objs, "hubsync")
	got, _ := json.Marshal(pr.Spec.Groups)
	want, _ := json.Marshal(file.Groups)
	if string(got) != string(want) {
		t.Errorf("PrometheusRule groups\n%s\nwant files/alerts.yaml's\n%s", got, want)
	}

	dash, err := os.ReadFile(filepath.Join(dir, "files", "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	cm := find[*corev1.ConfigMap](objs, "hubsync-dashboard")
	if cm.Labels["grafana_dashboard"] != "1" || cm.Annotations["grafana_folder"] != "hubsync" {
		t.Errorf("dashboard ConfigMap labels %v annotations %v", cm.Labels, cm.Annotations)
	}
	if strings.TrimSpace(cm.Data["hubsync.json"]) != strings.TrimSpace(string(dash)) {
		t.Errorf("dashboard ConfigMap holds\n%s\nwant files/dashboard.json", cm.Data["hubsync.json"])
	}
	if !json.Valid([]byte(cm.Data["hubsync.json"])) {
		t.Error("the dashboard is not JSON")
	}
}

// TestValuesRefused renders the chart with values that are wrong: each
// must fail, naming what is wrong, before anything is installed.
func TestValuesRefused(t *testing.T) {
	ch := loadChart(t)
	tests := []struct {
		name   string
		values string
		says   []string
	}{
		{"a misspelt top-level key", `replica: 3`, []string{"replica"}},
		{"a misspelt nested key", `serviceMonitor: {enable: true}`, []string{"serviceMonitor", "enable"}},
		{"replicas as a string", `replicas: "2"`, []string{"replicas", "integer"}},
		{"no replicas", `replicas: 0`, []string{"replicas", "minimum"}},
		{"a boolean that is not one", `dashboard: {enabled: "yes"}`, []string{"dashboard", "enabled", "boolean"}},
		{"an unknown pull policy", `image: {pullPolicy: Sometimes}`, []string{"pullPolicy"}},
		{"a budget that is neither a count nor a percentage", `podDisruptionBudget: {maxUnavailable: half}`, []string{"maxUnavailable"}},
		{"an empty monitoring namespace", `networkPolicy: {monitoringNamespace: ""}`, []string{"monitoringNamespace"}},
		{"a scrape interval that is no duration", `serviceMonitor: {interval: often}`, []string{"interval"}},
		{"pod annotations that are not strings", `podAnnotations: {a: {b: c}}`, []string{"podAnnotations"}},
		{"a configuration that is not an object", `config: [a]`, []string{"config", "object"}},
		{"cluster permissions without the gateway's ManagedServiceAccount",
			`{clusterPermission: {clusters: [a]}, config: {gateway: {enabled: true}}}`, []string{"config.tunnel.managedServiceAccount"}},
		{"a metrics address without a port", `config: {server: {address: disabled}}`, []string{`"disabled" has no port`}},
		{"several replicas without leader election", `config: {leaderElection: {enabled: false}}`, []string{"replicas is 3", "leaderElection.enabled false"}},
		{"two replicas with the embedded bus", `replicas: 2`, []string{"replicas is 2", "quorum", "config.bus.urls"}},
		{"an unknown bus Service type", `bus: {service: {type: Headless}}`, []string{"bus", "type"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := chart.Render(ch, parseValues(t, tt.values), chart.Namespace)
			if err == nil {
				t.Fatalf("values %s rendered", tt.values)
			}
			if !contains(err.Error(), tt.says...) {
				t.Errorf("error does not say %q:\n%v", tt.says, err)
			}
			t.Logf("refused: %v", err)
		})
	}
}

// TestConfigSchemaRefusesTypos checks that a typo inside config fails at
// render time, once values.schema.json holds the configuration's schema
// generated from its Go types (make schema).
func TestConfigSchemaRefusesTypos(t *testing.T) {
	ch := loadChart(t)
	var s struct {
		Properties struct {
			Config struct {
				Properties map[string]any `json:"properties"`
			} `json:"config"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(ch.Schema, &s); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	if len(s.Properties.Config.Properties) == 0 {
		t.Skip("values.schema.json has no schema of config yet: run make schema")
	}
	for _, v := range []string{`config: {hub: {qsp: 3}}`, `config: {logging: {level: 3}}`} {
		if _, err := chart.Render(ch, parseValues(t, v), chart.Namespace); err == nil {
			t.Errorf("values %s rendered", v)
		}
	}
}

// TestConfigChecksum: a change to sinks alone leaves the pods' checksum
// annotation as it is (hubsync applies it live); any other change to the
// configuration changes it, so that the pods roll.
func TestConfigChecksum(t *testing.T) {
	ch := loadChart(t)
	checksum := func(values string) string {
		d := find[*appsv1.StatefulSet](render(t, ch, values, chart.Namespace), "hubsync")
		sum := d.Spec.Template.Annotations["checksum/config"]
		if len(sum) != 64 {
			t.Fatalf("checksum/config = %q", sum)
		}
		return sum
	}
	base := checksum(`{}`)
	sinks := checksum(`config: {sinks: [{name: audit, type: webhook, webhook: {url: "https://hooks.example.com/h"}}]}`)
	if sinks != base {
		t.Error("a change to sinks alone changed the checksum: the pods would roll for what hubsync reloads")
	}
	for _, v := range []string{`config: {logging: {level: debug}}`, `config: {credentials: {workers: 4}}`} {
		if checksum(v) == base {
			t.Errorf("%s left the checksum as it is: the pods would keep the old configuration", v)
		}
	}
}

// TestReadmeValues renders the chart with the values example of
// README.md's install section, which must be accepted and give hubsync a
// configuration it accepts.
func TestReadmeValues(t *testing.T) {
	root, err := testutil.ModuleDir()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(data)
	i := strings.Index(readme, "helm install hubsync charts/hubsync")
	if i < 0 {
		t.Fatal("README.md has no `helm install hubsync charts/hubsync`")
	}
	rest := readme[i:]
	start := strings.Index(rest, "```yaml\n")
	if start < 0 {
		t.Fatal("README.md has no values example after its helm install")
	}
	rest = rest[start+len("```yaml\n"):]
	end := strings.Index(rest, "```")
	if end < 0 {
		t.Fatal("README.md's values example is not closed")
	}
	objs := render(t, loadChart(t), rest[:end], chart.Namespace)
	cfg, _ := renderedConfig(t, objs)
	if len(cfg.Bus.URLs) == 0 || len(cfg.Sinks) == 0 || find[*monitoringv1.ServiceMonitor](objs, "hubsync") == nil {
		t.Errorf("the README's values did not reach the rendering: bus.urls %v, sinks %d, objects %v", cfg.Bus.URLs, len(cfg.Sinks), kinds(objs))
	}
}

// TestBrokenFilesRefused: a files/alerts.yaml or files/dashboard.json that
// does not parse fails the rendering, naming the file, instead of
// installing no alerts or a dashboard Grafana cannot load.
func TestBrokenFilesRefused(t *testing.T) {
	tests := []struct {
		file, content, values string
	}{
		{"files/alerts.yaml", "groups: [\n", `prometheusRule: {enabled: true}`},
		{"files/dashboard.json", "{\"panels\": [\n", `dashboard: {enabled: true}`},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			ch := loadChart(t)
			found := false
			for _, f := range ch.Files {
				if f.Name == tt.file {
					f.Data, found = []byte(tt.content), true
				}
			}
			if !found {
				t.Fatalf("the chart has no %s", tt.file)
			}
			_, err := chart.Render(ch, parseValues(t, tt.values), chart.Namespace)
			if err == nil || !strings.Contains(err.Error(), tt.file) {
				t.Fatalf("rendering with a broken %s: %v; want an error naming it", tt.file, err)
			}
		})
	}
}

// TestStrictDecode: the decoding every rendering goes through refuses an
// unknown field, a wrong type and an unknown kind, in Kubernetes' types
// and the prometheus-operator's alike.
func TestStrictDecode(t *testing.T) {
	s := scheme(t)
	for name, doc := range map[string]string{
		"unknown field": "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replica: 2}\n",
		"wrong type":    "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {a: [1]}\n",
		"unknown field of a ServiceMonitor": "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: x}\n" +
			"spec: {selector: {}, endpoint: [{port: metrics}]}\n",
		"unknown field of a PrometheusRule": "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata: {name: x}\n" +
			"spec: {groups: [{name: g, rules: [{alert: A, expr: up, for: 1m, runbook: x}]}]}\n",
		"unknown kind": "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: x}\n",
	} {
		if _, err := decodeObjects(s, map[string]string{"t.yaml": doc}); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
	ok := "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: x}\nspec: {selector: {}, endpoints: [{port: metrics}]}\n"
	if _, err := decodeObjects(s, map[string]string{"t.yaml": ok}); err != nil {
		t.Errorf("a valid ServiceMonitor: %v", err)
	}
}

// hasPort reports whether d's container has a port of that name.
func hasPort(d *appsv1.StatefulSet, name string) bool {
	return slices.ContainsFunc(d.Spec.Template.Spec.Containers[0].Ports, func(p corev1.ContainerPort) bool { return p.Name == name })
}

// checkClusteredBus: the replicas' embedded NATS nodes form one cluster
// over the headless Service hubsync-bus with mutual TLS, the stream at
// min(3, n) replicas; applications reach them through hubsync-nats over
// TLS, with a certificate the chart made for both names and both uses.
func checkClusteredBus(t *testing.T, objs []object, ns string, n int) {
	t.Helper()
	cfg, _ := renderedConfig(t, objs)
	e := cfg.Bus.Embedded
	var routes []string
	for i := range n {
		routes = append(routes, fmt.Sprintf("nats://hubsync-%d.hubsync-bus.%s.svc:6222", i, ns))
	}
	const dir = "/etc/hubsync/bus-tls/"
	wantTLS := config.BusClusterTLS{CertFile: dir + "tls.crt", KeyFile: dir + "tls.key", CAFile: dir + "ca.crt"}
	if c := e.Cluster; c.Name != "hubsync" || c.Listen != "0.0.0.0:6222" || !slices.Equal(c.Routes, routes) || c.TLS != wantTLS || c.ServerName != "" {
		t.Errorf("bus.embedded.cluster %+v; want routes %v over mutual TLS, each node named by its host", c, routes)
	}
	if e.Listen != "0.0.0.0:4222" || e.TLS.CertFile != wantTLS.CertFile || e.TLS.KeyFile != wantTLS.KeyFile {
		t.Errorf("bus.embedded listen %s tls %+v; want 0.0.0.0:4222 with the Secret's certificate", e.Listen, e.TLS)
	}
	if want := min(3, n); cfg.Bus.Stream.Replicas != want {
		t.Errorf("bus.stream.replicas %d, want %d", cfg.Bus.Stream.Replicas, want)
	}

	d := find[*appsv1.StatefulSet](objs, "hubsync")
	if !hasPort(d, "nats") || !hasPort(d, "nats-route") {
		t.Errorf("container ports %+v", d.Spec.Template.Spec.Containers[0].Ports)
	}
	mounted := false
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Name == "bus-tls" && v.Secret != nil && v.Secret.SecretName == "hubsync-bus-tls" {
			for _, m := range d.Spec.Template.Spec.Containers[0].VolumeMounts {
				mounted = mounted || (m.Name == "bus-tls" && m.MountPath+"/" == dir)
			}
		}
	}
	if !mounted {
		t.Errorf("the Secret hubsync-bus-tls is not mounted at %s", dir)
	}
	headless := find[*corev1.Service](objs, "hubsync-bus")
	if headless.Spec.ClusterIP != corev1.ClusterIPNone || !headless.Spec.PublishNotReadyAddresses || !selectsPods(headless.Spec.Selector, d) ||
		headless.Spec.Ports[0].Port != 6222 {
		t.Errorf("hubsync-bus %+v: want headless, listing pods before they are ready, on 6222", headless.Spec)
	}
	svc := find[*corev1.Service](objs, "hubsync-nats")
	if !selectsPods(svc.Spec.Selector, d) || svc.Spec.Ports[0].Port != 4222 || svc.Spec.Ports[0].TargetPort.String() != "nats" || svc.Spec.PublishNotReadyAddresses {
		t.Errorf("hubsync-nats %+v", svc.Spec)
	}

	// The certificate: signed by the CA the ConfigMap publishes, for the
	// client Service and every node's route address, server and client.
	sec := find[*corev1.Secret](objs, "hubsync-bus-tls")
	if _, err := tls.X509KeyPair(sec.Data["tls.crt"], sec.Data["tls.key"]); err != nil {
		t.Fatalf("hubsync-bus-tls: %v", err)
	}
	if ca := find[*corev1.ConfigMap](objs, "hubsync-bus-ca"); ca.Data["ca.crt"] != string(sec.Data["ca.crt"]) {
		t.Errorf("hubsync-bus-ca holds\n%s\nwant the Secret's ca.crt\n%s", ca.Data["ca.crt"], sec.Data["ca.crt"])
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(sec.Data["ca.crt"]) {
		t.Fatal("hubsync-bus-tls: ca.crt holds no certificate")
	}
	block, _ := pem.Decode(sec.Data["tls.crt"])
	if block == nil {
		t.Fatal("hubsync-bus-tls: tls.crt is not PEM")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"hubsync-nats." + ns + ".svc", fmt.Sprintf("hubsync-%d.hubsync-bus.%s.svc", n-1, ns), "127.0.0.1"} {
		for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
			if _, err := cert.Verify(x509.VerifyOptions{DNSName: name, Roots: roots, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
				t.Errorf("the bus's certificate for %s (usage %v): %v", name, usage, err)
			}
		}
	}

	// The routes are open to hubsync's pods only; the bus to the cluster.
	np := find[*networkingv1.NetworkPolicy](objs, "hubsync")
	var routeRule, busOpen bool
	for _, r := range np.Spec.Ingress {
		for _, p := range r.Ports {
			switch p.Port.String() {
			case "nats-route":
				routeRule = len(r.From) == 1 && r.From[0].PodSelector != nil && r.From[0].NamespaceSelector == nil &&
					labels.SelectorFromSet(r.From[0].PodSelector.MatchLabels).Matches(labels.Set(d.Spec.Template.Labels))
			case "nats":
				busOpen = len(r.From) == 0
			}
		}
	}
	if !routeRule || !busOpen {
		t.Errorf("network policy %+v: want nats-route from hubsync's pods only and nats open", np.Spec.Ingress)
	}
}

// TestChartValues: the values a platform team sets to install on a real
// hub reach the objects: the image (by tag from appVersion, or by
// digest), the pods' priority, security contexts, environment and
// arguments, and the gateway's exposure (Service type, Route,
// cert-manager Certificate).
func TestChartValues(t *testing.T) {
	ch := loadChart(t)
	const gateway = `
config:
  gateway: {enabled: true, url: "https://gw.example.com:8443"}
  tunnel: {enabled: true, managedServiceAccount: hubsync-gateway}
`
	digest := "sha256:" + strings.Repeat("ab", 32)
	tests := []struct {
		name, values string
		check        func(t *testing.T, objs []object)
	}{
		{"defaults", `{}`, func(t *testing.T, objs []object) {
			c := find[*appsv1.StatefulSet](objs, "hubsync").Spec.Template.Spec
			if img := c.Containers[0].Image; img != "ghcr.io/hubsync/hubsync:v"+ch.Metadata.AppVersion {
				t.Errorf("image %s; want the chart's appVersion", img)
			}
			if sc := c.SecurityContext; sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 65532 || c.PriorityClassName != "" {
				t.Errorf("pod securityContext %+v, priorityClassName %q", sc, c.PriorityClassName)
			}
			if sc := c.Containers[0].SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
				t.Errorf("container securityContext %+v", sc)
			}
		}},
		{"image by digest", `image: {repository: registry.example.com/hubsync, tag: v9.9.9, digest: "` + digest + `"}`, func(t *testing.T, objs []object) {
			if img := find[*appsv1.StatefulSet](objs, "hubsync").Spec.Template.Spec.Containers[0].Image; img != "registry.example.com/hubsync:v9.9.9@"+digest {
				t.Errorf("image %s", img)
			}
		}},
		{"pod settings", `
priorityClassName: system-cluster-critical
podSecurityContext: {runAsUser: null, runAsGroup: null, fsGroup: null}
extraEnv: [{name: HTTPS_PROXY, value: "http://proxy:3128"}]
extraArgs: ["--log-level", "debug"]
`, func(t *testing.T, objs []object) {
			spec := find[*appsv1.StatefulSet](objs, "hubsync").Spec.Template.Spec
			c := spec.Containers[0]
			if spec.PriorityClassName != "system-cluster-critical" {
				t.Errorf("priorityClassName %q", spec.PriorityClassName)
			}
			if sc := spec.SecurityContext; sc == nil || sc.RunAsUser != nil || sc.FSGroup != nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
				t.Errorf("pod securityContext %+v: want runAsUser, runAsGroup and fsGroup removed, runAsNonRoot kept", sc)
			}
			if !slices.Equal(c.Args, []string{"run", "--config", "/etc/hubsync/config.yaml", "--log-level", "debug"}) {
				t.Errorf("args %v", c.Args)
			}
			if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "HTTPS_PROXY" }) ||
				!slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "GOMEMLIMIT" }) {
				t.Errorf("env %v", c.Env)
			}
		}},
		{"gateway behind a load balancer", gateway + `
gatewayService: {type: LoadBalancer, annotations: {service.beta.kubernetes.io/aws-load-balancer-type: nlb}, externalTrafficPolicy: Local, loadBalancerSourceRanges: [10.0.0.0/8]}
`, func(t *testing.T, objs []object) {
			svc := find[*corev1.Service](objs, "hubsync-gateway")
			if svc.Spec.Type != corev1.ServiceTypeLoadBalancer || svc.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal ||
				!slices.Equal(svc.Spec.LoadBalancerSourceRanges, []string{"10.0.0.0/8"}) || svc.Annotations["service.beta.kubernetes.io/aws-load-balancer-type"] != "nlb" {
				t.Errorf("Service %+v %v", svc.Spec, svc.Annotations)
			}
		}},
		{"gateway on OpenShift with cert-manager", gateway + `
gatewayRoute: {enabled: true, host: gw.apps.example.com}
gatewayCertificate: {enabled: true, issuerRef: {name: hub-ca, kind: ClusterIssuer}, dnsNames: [gw.apps.example.com]}
`, func(t *testing.T, objs []object) {
			route, cert := untypedYAML(t, objs, "Route"), untypedYAML(t, objs, "Certificate")
			for _, want := range []string{"host: gw.apps.example.com", "termination: passthrough", "name: hubsync-gateway"} {
				if !strings.Contains(route, want) {
					t.Errorf("Route lacks %q:\n%s", want, route)
				}
			}
			for _, want := range []string{"secretName: hubsync-gateway-tls", "kind: ClusterIssuer", "name: hub-ca",
				"- hubsync-gateway." + chart.Namespace + ".svc", "- gw.example.com", "- gw.apps.example.com", "server auth"} {
				if !strings.Contains(cert, want) {
					t.Errorf("Certificate lacks %q:\n%s", want, cert)
				}
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.check(t, render(t, ch, tt.values, chart.Namespace))
		})
	}
}

// untypedYAML is the rendered YAML of the one object of kind.
func untypedYAML(t *testing.T, objs []object, kind string) string {
	t.Helper()
	for _, o := range objs {
		if o.gvk.Kind == kind {
			return string(o.yaml)
		}
	}
	t.Fatalf("no %s rendered (%v)", kind, kinds(objs))
	return ""
}
