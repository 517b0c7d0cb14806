package events

import (
	"regexp"
	"strings"
	"testing"
)

var (
	tokenRe = regexp.MustCompile(`^[A-Za-z0-9_%-]+$`)
	kvKeyRe = regexp.MustCompile(`^[-/_=.a-zA-Z0-9]+$`) // what nats.go accepts as a KV key
)

func TestEscapeToken(t *testing.T) {
	for _, tc := range []struct {
		in, want string
	}{
		{"plain", "plain"},
		{"team-a_1", "team-a_1"},
		{"a.b", "a%2Eb"},
		{"c1.eu-west.example.com", "c1%2Eeu-west%2Eexample%2Ecom"},
		{"*", "%2A"},
		{">", "%3E"},
		{"a*b>", "a%2Ab%3E"},
		{"%", "%25"},
		{"a%2Eb", "a%252Eb"}, // an escape-looking name stays distinct from "a.b"
		{"with space", "with%20space"},
		{"tab\tnl\n", "tab%09nl%0A"},
		{"ünï", "%C3%BCn%C3%AF"},
		{"日本", "%E6%97%A5%E6%9C%AC"},
		{"$SYS", "%24SYS"},
		{"a/b=c", "a%2Fb%3Dc"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got := EscapeToken(tc.in)
			if got != tc.want {
				t.Fatalf("EscapeToken(%q) = %q, want %q", tc.in, got, tc.want)
			}
			if !tokenRe.MatchString(got) {
				t.Errorf("EscapeToken(%q) = %q is not a safe subject token", tc.in, got)
			}
			back, err := UnescapeToken(got)
			if err != nil || back != tc.in {
				t.Errorf("UnescapeToken(%q) = %q, %v; want %q", got, back, err, tc.in)
			}
			subject := Subject("hubsync.acme", tc.in, tc.in, "profile")
			if n := len(strings.Split(subject, ".")); n != 5 {
				t.Errorf("Subject(...%q...) = %q has %d tokens, want 5", tc.in, subject, n)
			}
			key := KVKey(tc.in, tc.in)
			if !kvKeyRe.MatchString(key) {
				t.Errorf("KVKey(%q, %q) = %q is not a valid KV key", tc.in, tc.in, key)
			}
			ns, cl, err := ParseKVKey(key)
			if err != nil || ns != tc.in || cl != tc.in {
				t.Errorf("ParseKVKey(%q) = %q, %q, %v; want %q twice", key, ns, cl, err, tc.in)
			}
		})
	}
}

func TestSubjectAndKVKey(t *testing.T) {
	if got, want := Subject("hubsync", "team-a", "c1.eu", "credential"), "hubsync.team-a.c1%2Eeu.credential"; got != want {
		t.Errorf("Subject = %q, want %q", got, want)
	}
	if got, want := KVKey("team-a", "c1.eu"), "team-a.c1=2Eeu"; got != want {
		t.Errorf("KVKey = %q, want %q", got, want)
	}
	// Distinct pairs never share a key or subject.
	if KVKey("a.b", "c") == KVKey("a", "b.c") || Subject("p", "a.b", "c", "k") == Subject("p", "a", "b.c", "k") {
		t.Error("pairs that differ only in where the dot is collide")
	}
}

func TestUnescapeTokenRejects(t *testing.T) {
	for _, in := range []string{"%", "%2", "a%2", "%2e", "%zz", "%41", "a.b", "a b", "*", ">", "ü"} {
		if got, err := UnescapeToken(in); err == nil {
			t.Errorf("UnescapeToken(%q) = %q, want an error", in, got)
		}
	}
	for _, in := range []string{"a", "a.b.c", "a=2", "a.b=41"} {
		if ns, cl, err := ParseKVKey(in); err == nil {
			t.Errorf("ParseKVKey(%q) = %q, %q, want an error", in, ns, cl)
		}
	}
}

func TestKind(t *testing.T) {
	for in, want := range map[string]string{
		"io.hubsync.profile.created":        "profile",
		"io.hubsync.credential.rotated":     "credential",
		"io.hubsync.accessprovider.updated": "accessprovider",
		"io.hubsync.tunnel.down":            "tunnel",
	} {
		if got, err := Kind(in); err != nil || got != want {
			t.Errorf("Kind(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "io.hubsync.", "io.hubsync.profile", "io.hubsync..x", "com.other.profile.created", "io.hubsync.a b.c"} {
		if got, err := Kind(in); err == nil {
			t.Errorf("Kind(%q) = %q, want an error", in, got)
		}
	}
}
