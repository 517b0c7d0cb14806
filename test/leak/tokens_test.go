package leak

import (
	"encoding/base64"
	"encoding/json"
	"testing"
)

func TestTokens(t *testing.T) {
	const jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJlLW9mLXRoZS10b2tlbi0xMjM0NTY3OA"
	const opaque = `s3cr3t/"quoted"+token`
	kubeconfig := "users:\n- name: u\n  user:\n    token: " + jwt + "\n"
	secretJSON, _ := json.Marshal(map[string]any{"data": map[string][]byte{"config": []byte(kubeconfig)}})
	tests := []struct {
		name string
		text string
		want bool
	}{
		{"plain", "Authorization: Bearer " + jwt, true},
		{"base64", base64.StdEncoding.EncodeToString([]byte(jwt)), true},
		{"base64url unpadded", base64.RawURLEncoding.EncodeToString([]byte(jwt)), true},
		{"JWT signature alone", "sig=" + "c2lnbmF0dXJlLW9mLXRoZS10b2tlbi0xMjM0NTY3OA", true},
		{"JSON-escaped", string(mustJSON(opaque)), true},
		{"inside a Secret's base64 data", string(secretJSON), true},
		{"fingerprint only", "sha256:0123456789abcdef", false},
		{"header and claims only", "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0", false},
		{"nothing", "a perfectly ordinary log line", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Tokens(tt.text, []string{jwt, opaque, ""})
			if (len(got) > 0) != tt.want {
				t.Fatalf("Tokens = %v, want found: %v", got, tt.want)
			}
			for _, f := range got {
				if f == jwt || f == opaque {
					t.Fatalf("a finding holds the token: %q", f)
				}
			}
		})
	}
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}
