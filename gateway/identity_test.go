package gateway

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
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

// TestSetAndCheckIdentity: setIdentity leaves exactly the decided
// identity whatever the request carried, and checkIdentity, the last
// check before a request leaves, refuses anything else.
func TestSetAndCheckIdentity(t *testing.T) {
	want := http.Header{"Authorization": {"Bearer msa"}, "Impersonate-User": {"cluster:hub:alice"},
		"Impersonate-Group": {"cluster:hub:a", "cluster:hub:b"}}
	carried := http.Header{"Accept": {"application/json"}, "Authorization": {"Bearer hub"}, "authorization": {"Bearer x"},
		"Impersonate-Uid": {"0"}, "impersonate-user": {"admin"}, "X-Remote-User": {"admin"}, "Proxy-Authorization": {"Basic x"}}
	setIdentity(carried, want)
	wantAll := want.Clone()
	wantAll["Accept"] = []string{"application/json"}
	if !reflect.DeepEqual(carried, wantAll) {
		t.Fatalf("after setIdentity\n got %v\nwant %v", carried, wantAll)
	}

	u, _ := url.Parse("https://c1/api")
	withUser, _ := url.Parse("https://admin:pw@c1/api")
	tests := []struct {
		name    string
		header  http.Header
		url     *url.URL
		trailer http.Header
		ok      bool
	}{
		{name: "exactly the identity", header: wantAll, ok: true},
		{name: "identity and other headers", header: with(wantAll, "Sec-Websocket-Protocol", "v5.channel.k8s.io"), ok: true},
		{name: "a second Authorization value", header: with(wantAll, "Authorization", "Bearer hub")},
		{name: "another spelling of Authorization", header: with(wantAll, "authorization", "Bearer msa")},
		{name: "a group too many", header: with(wantAll, "Impersonate-Group", "cluster:hub:c")},
		{name: "a group missing", header: set(wantAll, "Impersonate-Group", "cluster:hub:a")},
		{name: "groups in another order", header: set(wantAll, "Impersonate-Group", "cluster:hub:b", "cluster:hub:a")},
		{name: "the user missing", header: set(wantAll, "Impersonate-User")},
		{name: "an uid", header: with(wantAll, "Impersonate-Uid", "0")},
		{name: "an extra", header: with(wantAll, "Impersonate-Extra-Scopes", "x")},
		{name: "front-proxy user", header: with(wantAll, "X-Remote-User", "admin")},
		{name: "front-proxy extra", header: with(wantAll, "X-Remote-Extra-Scopes", "x")},
		{name: "proxy authorization", header: with(wantAll, "Proxy-Authorization", "Basic eDp5")},
		{name: "a token in a subprotocol", header: with(wantAll, "Sec-Websocket-Protocol", "base64url.bearer.authorization.k8s.io.eA")},
		{name: "user info in the URL", header: wantAll, url: withUser},
		{name: "trailers", header: wantAll, trailer: http.Header{"X-Anything": nil}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := &http.Request{URL: u, Header: tt.header, Trailer: tt.trailer}
			if tt.url != nil {
				req.URL = tt.url
			}
			err := checkIdentity(req, want)
			if (err == nil) != tt.ok || err != nil && !errors.Is(err, errIdentity) {
				t.Fatalf("checkIdentity = %v; want ok %v", err, tt.ok)
			}
			if err != nil && strings.Contains(err.Error(), "msa") {
				t.Fatalf("the error quotes a credential: %v", err)
			}
			// The guard sends nothing that fails the check.
			sent := false
			_, gerr := guard{next: roundTripFunc(func(*http.Request) (*http.Response, error) { sent = true; return nil, nil }), want: want}.RoundTrip(req)
			if sent == (gerr != nil) || sent != tt.ok {
				t.Fatalf("guard sent %v with error %v; want sent %v", sent, gerr, tt.ok)
			}
		})
	}
}

func with(h http.Header, k string, vs ...string) http.Header {
	out := h.Clone()
	out[k] = append(out[k], vs...)
	return out
}

func set(h http.Header, k string, vs ...string) http.Header {
	out := h.Clone()
	if len(vs) == 0 {
		delete(out, k)
	} else {
		out[k] = vs
	}
	return out
}

// TestGatewayIdentityMismatchIs500: a request the last check stops is
// answered with 500, logged, and never sent.
func TestGatewayIdentityMismatchIs500(t *testing.T) {
	w := newWorld(t)
	g, err := New(configured(Options{Pool: w.pool(), Reviewer: w.reviewer()}))
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	g.proxyError(rec, &request{}, fmt.Errorf("%w: header %q", errIdentity, "Authorization"))
	if rec.Code != 500 || !strings.Contains(rec.Body.String(), "it was not sent") {
		t.Fatalf("%d %s; want 500 saying it was not sent", rec.Code, rec.Body)
	}
}
