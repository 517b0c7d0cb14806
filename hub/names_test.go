package hub

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	cpv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
)

// --- IsOwned ----------------------------------------------------------------

func TestIsOwned(t *testing.T) {
	tests := []struct {
		name   string
		labels map[string]string
		want   bool
	}{
		{name: "manager label matches", labels: map[string]string{LabelClusterManager: "hubsync"}, want: true},
		{name: "manager label matches among others", labels: map[string]string{LabelClusterManager: "hubsync", "a": "b"}, want: true},
		{name: "other manager", labels: map[string]string{LabelClusterManager: "karmada"}, want: false},
		{name: "manager value in another key", labels: map[string]string{"manager": "hubsync"}, want: false},
		{name: "no labels", labels: nil, want: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := &cpv1alpha1.ClusterProfile{ObjectMeta: metav1.ObjectMeta{Name: "c1", Labels: tc.labels}}
			if got := IsOwned(p, "hubsync"); got != tc.want {
				t.Errorf("IsOwned() = %v, want %v", got, tc.want)
			}
		})
	}
}

// --- ClusterNameLabelValue --------------------------------------------------

func TestClusterNameLabelValue(t *testing.T) {
	// 253 characters: "abcdefghi." x25 is 250, plus "xyz".
	dotted253 := strings.Repeat("abcdefghi.", 25) + "xyz"
	// The cut at 52 characters ends in '.', which must be trimmed.
	dotAt52 := strings.Repeat("a", 51) + "." + strings.Repeat("b", 60)
	// The cut at 52 characters ends in '-', which must be trimmed.
	dashAt52 := strings.Repeat("a", 51) + "-" + strings.Repeat("b", 60)
	shared := strings.Repeat("c", 60)

	tests := []struct {
		name      string
		in        string
		unchanged bool
	}{
		{name: "short name", in: "cluster1", unchanged: true},
		{name: "dotted short name", in: "cluster-1.example.com", unchanged: true},
		{name: "exactly 63 characters", in: strings.Repeat("a", 63), unchanged: true},
		{name: "64 characters", in: strings.Repeat("a", 64)},
		{name: "253-character dotted name", in: dotted253},
		{name: "cut ends in a dot", in: dotAt52},
		{name: "cut ends in a dash", in: dashAt52},
		{name: "long name sharing a 60-character prefix (1)", in: shared + ".alpha.example.com"},
		{name: "long name sharing a 60-character prefix (2)", in: shared + ".beta.example.com"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if errs := validation.IsDNS1123Subdomain(tc.in); len(errs) != 0 {
				t.Fatalf("test input is not a valid cluster name: %v", errs)
			}
			got := ClusterNameLabelValue(tc.in)
			if tc.unchanged {
				if got != tc.in {
					t.Fatalf("ClusterNameLabelValue(%q) = %q, want it unchanged", tc.in, got)
				}
				return
			}
			if errs := validation.IsValidLabelValue(got); len(errs) != 0 {
				t.Errorf("ClusterNameLabelValue(%q) = %q is not a valid label value: %v", tc.in, got, errs)
			}
			if len(got) > 63 {
				t.Errorf("len(ClusterNameLabelValue(%q)) = %d, want <= 63", tc.in, len(got))
			}
			if again := ClusterNameLabelValue(tc.in); again != got {
				t.Errorf("ClusterNameLabelValue is not deterministic: %q then %q", got, again)
			}
			// The value keeps a readable prefix of the name.
			if !strings.HasPrefix(tc.in, got[:40]) {
				t.Errorf("ClusterNameLabelValue(%q) = %q does not start with the name's prefix", tc.in, got)
			}
		})
	}

	t.Run("long names sharing a 60-character prefix differ", func(t *testing.T) {
		a := ClusterNameLabelValue(shared + ".alpha.example.com")
		b := ClusterNameLabelValue(shared + ".beta.example.com")
		if a == b {
			t.Errorf("both names map to %q", a)
		}
	})
}

func TestSyncedFromValue(t *testing.T) {
	long := strings.Repeat("c", 40)
	tests := []struct {
		name, cluster, msa string
		want               string // "" when only validity and shape are checked
	}{
		{name: "short pair keeps the copy name", cluster: "c1", msa: "app", want: "c1-app"},
		{name: "63 characters kept", cluster: strings.Repeat("a", 59), msa: "app", want: strings.Repeat("a", 59) + "-app"},
		{name: "over 63 characters hashed", cluster: long, msa: long},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := SyncedFromValue(tc.cluster, tc.msa)
			if tc.want != "" && got != tc.want {
				t.Fatalf("SyncedFromValue(%q, %q) = %q, want %q", tc.cluster, tc.msa, got, tc.want)
			}
			if errs := validation.IsValidLabelValue(got); len(errs) != 0 {
				t.Errorf("SyncedFromValue(%q, %q) = %q is not a label value: %v", tc.cluster, tc.msa, got, errs)
			}
		})
	}
	// Pairs whose plain values collide ("a-b"+"c" and "a"+"b-c") stay apart
	// once hashed.
	x := SyncedFromValue(long+"-b", long)
	y := SyncedFromValue(long, "b-"+long)
	if CopyName(long+"-b", long) != CopyName(long, "b-"+long) || x == y {
		t.Errorf("colliding pairs: %q and %q", x, y)
	}
}

func TestTokenFingerprint(t *testing.T) {
	a, b := TokenFingerprint([]byte("token-a")), TokenFingerprint([]byte("token-b"))
	if !strings.HasPrefix(a, "sha256:") || len(a) != len("sha256:")+16 {
		t.Fatalf("TokenFingerprint = %q, want sha256: and 16 hex digits", a)
	}
	if a == b || a != TokenFingerprint([]byte("token-a")) {
		t.Errorf("fingerprints %q, %q: want distinct and stable", a, b)
	}
	if strings.Contains(a, "token-a") {
		t.Errorf("fingerprint %q holds the token", a)
	}
}

func TestJWTExpiry(t *testing.T) {
	jwt := func(payload string) []byte {
		enc := func(s string) string { return strings.TrimRight(base64URL(s), "=") }
		return []byte(enc(`{"alg":"none"}`) + "." + enc(payload) + ".sig")
	}
	tests := []struct {
		name   string
		token  []byte
		want   time.Time
		wantOK bool
	}{
		{"exp claim", jwt(`{"exp":1700000000}`), time.Unix(1700000000, 0).UTC(), true},
		{"float exp", jwt(`{"exp":1700000000.5}`), time.Unix(1700000000, 0).UTC(), true},
		{"no exp", jwt(`{"sub":"x"}`), time.Time{}, false},
		{"zero exp", jwt(`{"exp":0}`), time.Time{}, false},
		{"padded payload", []byte(base64URL(`{"alg":"none"}`) + "." + base64URL(`{"exp":1700000000}`) + ".sig"), time.Unix(1700000000, 0).UTC(), true},
		{"string exp", jwt(`{"exp":"soon"}`), time.Time{}, false},
		{"payload not JSON", jwt(`nope`), time.Time{}, false},
		{"not a JWT", []byte("opaque-token"), time.Time{}, false},
		{"bad payload", []byte("a.!!!.c"), time.Time{}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := JWTExpiry(tc.token)
			if ok != tc.wantOK || !got.Equal(tc.want) {
				t.Errorf("JWTExpiry = %v, %v; want %v, %v", got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

func base64URL(s string) string { return base64.URLEncoding.EncodeToString([]byte(s)) }

func TestCopyExpiry(t *testing.T) {
	exp := time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC)
	token := []byte(strings.TrimRight(base64URL(`{"alg":"none"}`), "=") + "." + strings.TrimRight(base64URL(`{"exp":1700000000}`), "=") + ".sig")
	claim := time.Unix(1700000000, 0).UTC()
	tests := []struct {
		name        string
		annotations map[string]string
		token       []byte
		want        time.Time
		wantErr     bool
	}{
		{"annotation wins", map[string]string{AnnotationTokenExpiration: exp.Format(time.RFC3339)}, token, exp, false},
		{"no annotation: the JWT's claim", nil, token, claim, false},
		{"bad annotation: the JWT's claim and an error", map[string]string{AnnotationTokenExpiration: "tomorrow"}, token, claim, true},
		{"neither: unknown", nil, []byte("opaque"), time.Time{}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := CopyExpiry(tc.annotations, tc.token)
			if !got.Equal(tc.want) || (err != nil) != tc.wantErr {
				t.Errorf("CopyExpiry = %v, %v; want %v, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

// --- KubeconfigSecretName ---------------------------------------------------

// TestKubeconfigSecretName: the name is a valid Secret name for every
// profile name, the same on every run, and different for different
// profiles, including long ones that share a prefix and a full name shaped
// like a shortened one.
func TestKubeconfigSecretName(t *testing.T) {
	long := func(prefix string, n int) string {
		var b strings.Builder
		b.WriteString(prefix)
		for b.Len() < n {
			b.WriteString(".abcdefghij")
		}
		return b.String()[:n]
	}
	short := KubeconfigSecretName(long("eu-1", 253))
	// A profile whose full name has the shape of a shortened name.
	lookalike := strings.TrimPrefix(short, "hubsync-kubeconfig.")
	tests := []struct {
		name, profile, want string
	}{
		{name: "short", profile: "eu-prod-1", want: "hubsync-kubeconfig-eu-prod-1"},
		{name: "dotted", profile: "eu.prod.1", want: "hubsync-kubeconfig-eu.prod.1"},
		{name: "longest kept whole", profile: long("a", 253-len("hubsync-kubeconfig-")), want: "hubsync-kubeconfig-" + long("a", 253-len("hubsync-kubeconfig-"))},
		{name: "one longer", profile: long("a", 254-len("hubsync-kubeconfig-"))},
		{name: "longest profile", profile: long("eu-1", 253)},
		{name: "same prefix", profile: long("eu-1", 252)},
		{name: "lookalike", profile: lookalike, want: "hubsync-kubeconfig-" + lookalike},
	}
	seen := map[string]string{}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := KubeconfigSecretName(tc.profile)
			if tc.want != "" && got != tc.want {
				t.Errorf("KubeconfigSecretName(%q) = %q, want %q", tc.profile, got, tc.want)
			}
			if msgs := validation.IsDNS1123Subdomain(got); len(msgs) > 0 {
				t.Errorf("%q is not a valid Secret name: %v", got, msgs)
			}
			if !strings.HasPrefix(got, "hubsync-kubeconfig") {
				t.Errorf("%q lacks the prefix", got)
			}
			if got != KubeconfigSecretName(tc.profile) {
				t.Error("not deterministic")
			}
			if other, ok := seen[got]; ok {
				t.Errorf("%q is the name of profile %q too", got, other)
			}
			seen[got] = tc.profile
		})
	}
}
