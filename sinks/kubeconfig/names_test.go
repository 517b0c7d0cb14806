package kubeconfig

import (
	"strings"
	"testing"
)

func TestFileName(t *testing.T) {
	long63 := strings.Repeat("n", 63)
	long253 := strings.Repeat("c", 60) + "." + strings.Repeat("d", 60) + "." + strings.Repeat("e", 60) + "." + strings.Repeat("f", 70)
	if len(long253) != 253 {
		t.Fatalf("test setup: cluster name has %d bytes", len(long253))
	}
	tests := []struct {
		name, ns, cluster string
		want              string // "" checks only the shape
		truncated         bool
	}{
		{name: "plain", ns: "team-a", cluster: "cluster1", want: "team-a_cluster1.kubeconfig"},
		{name: "dots in cluster", ns: "team-a", cluster: "eu.west.prod", want: "team-a_eu.west.prod.kubeconfig"},
		{name: "longest full name", ns: "ns", cluster: strings.Repeat("x", maxFileName-len("ns_")-len(suffix)),
			want: "ns_" + strings.Repeat("x", maxFileName-len("ns_")-len(suffix)) + suffix},
		{name: "one byte too long", ns: "ns", cluster: strings.Repeat("x", maxFileName-len("ns_")-len(suffix)+1), truncated: true},
		{name: "longest names", ns: long63, cluster: long253, truncated: true},
		// The kept prefix, 195 bytes (63+1+131), ends on the dot.
		{name: "cut on a dot", ns: long63, cluster: strings.Repeat("c", 130) + "." + strings.Repeat("d", 100), truncated: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := FileName(tt.ns, tt.cluster)
			if tt.want != "" && got != tt.want {
				t.Errorf("FileName(%q, %q) = %q, want %q", tt.ns, tt.cluster, got, tt.want)
			}
			if len(got) > maxFileName {
				t.Errorf("FileName has %d bytes, more than %d", len(got), maxFileName)
			}
			// The temporary file of an atomic write must fit NAME_MAX too.
			if tmp := "." + got + ".tmp-4294967295"; len(tmp) > 255 {
				t.Errorf("temporary name has %d bytes", len(tmp))
			}
			if !isOwnName(got) {
				t.Errorf("isOwnName(%q) = false", got)
			}
			if isTrunc := strings.Count(got, "_") == 2; isTrunc != tt.truncated {
				t.Errorf("FileName(%q, %q) = %q: truncated %v, want %v", tt.ns, tt.cluster, got, isTrunc, tt.truncated)
			}
			if !strings.HasPrefix(got, tt.ns+"_") {
				t.Errorf("FileName(%q, ...) = %q does not start with the namespace", tt.ns, got)
			}
		})
	}
}

func TestFileNameNoCollisions(t *testing.T) {
	long := strings.Repeat("c", 240)
	keys := [][2]string{
		// Joined with "-" or "." these would collide; the underscore keeps
		// them apart.
		{"a-b", "c"}, {"a", "b-c"},
		{"a", "b.c"}, {"a", "bc"}, {"ab", "c"},
		{"a-b", "c.d"}, {"a", "b-c.d"},
		// Two long names with the same first 195 bytes.
		{"ns", long + "1"}, {"ns", long + "2"}, {"ns", long + ".x"},
		{"ns-", long}, {"n", "s-" + long},
	}
	seen := map[string][2]string{}
	for _, k := range keys {
		name := FileName(k[0], k[1])
		if other, ok := seen[name]; ok {
			t.Errorf("%v and %v both map to %q", other, k, name)
		}
		seen[name] = k
	}
}

func TestOwnNames(t *testing.T) {
	tests := []struct {
		name      string
		own, temp bool
	}{
		{name: "ns_cluster.kubeconfig", own: true},
		{name: "ns_a.b.c.kubeconfig", own: true},
		{name: FileName("ns", strings.Repeat("x", 250)), own: true},
		{name: "cluster.kubeconfig"},
		{name: "config"},
		{name: "ns_cluster.yaml"},
		{name: "NS_cluster.kubeconfig"},
		{name: "ns_cluster_x.kubeconfig"},
		{name: "a_b_c.kubeconfig"},
		{name: ".ns_cluster.kubeconfig.tmp-123", temp: true},
		{name: ".ns_cluster.kubeconfig.tmp-abc"},
		{name: ".config.tmp-123"},
		{name: ".ns_cluster.kubeconfig.swp"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := isOwnName(tt.name); got != tt.own {
				t.Errorf("isOwnName(%q) = %v, want %v", tt.name, got, tt.own)
			}
			if got := isOwnTemp(tt.name); got != tt.temp {
				t.Errorf("isOwnTemp(%q) = %v, want %v", tt.name, got, tt.temp)
			}
		})
	}
}

func TestValidKey(t *testing.T) {
	tests := []struct {
		ns, cluster string
		ok          bool
	}{
		{"ns", "cluster", true},
		{"ns", "a.b.c", true},
		{"ns", "../etc", false},
		{"ns", "a/b", false},
		{"ns", "a_b", false},
		{"n.s", "cluster", false},
		{"", "cluster", false},
		{"ns", "", false},
	}
	for _, tt := range tests {
		if err := validKey(tt.ns, tt.cluster); (err == nil) != tt.ok {
			t.Errorf("validKey(%q, %q) = %v, want ok %v", tt.ns, tt.cluster, err, tt.ok)
		}
	}
}
