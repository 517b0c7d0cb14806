package gateway

import (
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
)

func TestBearerToken(t *testing.T) {
	tests := []struct {
		name    string
		values  []string
		want    string
		wantErr error
	}{
		{name: "bearer", values: []string{"Bearer abc.def"}, want: "abc.def"},
		{name: "scheme in any case", values: []string{"bearer abc"}, want: "abc"},
		{name: "none", wantErr: ErrNoToken},
		{name: "two headers", values: []string{"Bearer tok-one", "Bearer tok-two"}, wantErr: ErrTwoAuthHeaders},
		{name: "basic", values: []string{"Basic YTpi"}, wantErr: ErrNotBearer},
		{name: "empty token", values: []string{"Bearer "}, wantErr: ErrNotBearer},
		{name: "two tokens in one header", values: []string{"Bearer tok-one, Bearer tok-two"}, wantErr: ErrNotBearer},
		{name: "no scheme", values: []string{"abc"}, wantErr: ErrNotBearer},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			for _, v := range tt.values {
				h.Add("Authorization", v)
			}
			got, err := BearerToken(h)
			if !errors.Is(err, tt.wantErr) || got != tt.want {
				t.Fatalf("BearerToken = %q, %v; want %q, %v", got, err, tt.want, tt.wantErr)
			}
			if secret := strings.TrimPrefix(strings.TrimPrefix(strings.Join(tt.values, ""), "Bearer "), "Basic "); err != nil && len(secret) > 3 && strings.Contains(err.Error(), secret[:4]) {
				t.Fatal("the error quotes the header")
			}
		})
	}
}

func TestImpersonate(t *testing.T) {
	h := http.Header{}
	h.Set("Authorization", "Bearer hub-token")
	h.Set("Accept", "application/json")
	// Forged headers in every spelling a client might try.
	h["impersonate-user"] = []string{"system:admin"}
	h.Set("Impersonate-Group", "system:masters")
	h.Set("Impersonate-Uid", "0")
	h.Set("Impersonate-Extra-Scopes", "all")
	if !HasImpersonation(h) {
		t.Fatal("HasImpersonation missed the forged headers")
	}
	id := Identity{Username: "system:serviceaccount:team:app", UID: "u-1",
		Groups: []string{"system:masters", "system:serviceaccounts", "system:authenticated", ""},
		Extra:  map[string][]string{"scopes": {"x"}}}
	if err := Impersonate(h, id); err != nil {
		t.Fatal(err)
	}
	if h.Get("Authorization") != "" {
		t.Fatal("the hub token is still in the request")
	}
	if got := h.Get("Impersonate-User"); got != "cluster:hub:system:serviceaccount:team:app" {
		t.Fatalf("Impersonate-User %q", got)
	}
	groups := h.Values("Impersonate-Group")
	want := []string{"cluster:hub:system:masters", "cluster:hub:system:serviceaccounts", "cluster:hub:system:authenticated"}
	if !slices.Equal(groups, want) {
		t.Fatalf("Impersonate-Group %q, want %q", groups, want)
	}
	for k, v := range h {
		lk := strings.ToLower(k)
		if strings.HasPrefix(lk, "impersonate-") && lk != "impersonate-user" && lk != "impersonate-group" {
			t.Fatalf("header %s: %q forwarded", k, v)
		}
		for _, s := range v {
			if strings.HasPrefix(lk, "impersonate-") && !strings.HasPrefix(s, Prefix) {
				t.Fatalf("header %s carries an unprefixed name %q", k, s)
			}
		}
	}
	if h.Get("Accept") != "application/json" {
		t.Fatal("an ordinary header was dropped")
	}
	if err := Impersonate(http.Header{}, Identity{}); err == nil {
		t.Fatal("an identity without a username was accepted")
	}
	if HasImpersonation(http.Header{"Accept": {"x"}}) {
		t.Fatal("HasImpersonation without any")
	}
}
