package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"testing"
)

func TestJWTID(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sign := func(claims map[string]any) string {
		t.Helper()
		tok, err := SignJWT(key, "", claims)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	for _, tc := range []struct {
		name, token, want string
		wantErr           bool
	}{
		{name: "jti", token: sign(map[string]any{"sub": "a", "jti": "id-1"}), want: "id-1"},
		{name: "no jti", token: sign(map[string]any{"sub": "a"}), wantErr: true},
		{name: "not a JWT", token: "opaque-token", wantErr: true},
		{name: "payload not base64", token: "a.!!.c", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := JWTID(tc.token)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("JWTID = %q, %v; want %q, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}
