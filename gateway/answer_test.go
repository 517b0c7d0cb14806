package gateway

import (
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// TestGatewayAnswers: what of a cluster's answer the client gets, at each
// proxy edge apimachinery's UpgradeAwareHandler names.
func TestGatewayAnswers(t *testing.T) {
	w := newWorld(t)
	upgrade := http.Header{"Connection": {"Upgrade"}, "Upgrade": {"websocket"}, "Sec-Websocket-Version": {"13"}, "Sec-Websocket-Key": {"dGhlIHNhbXBsZSBub25jZQ=="}}
	tests := []struct {
		name     string
		header   http.Header
		code     int
		location string
		answer   int
		header2  http.Header // the cluster's answer headers
		wantCode int
		says     string
		absent   []string
		present  http.Header // headers the client gets, each with exactly these values
	}{
		{name: "a redirect is not forwarded", answer: 302, header2: http.Header{"Location": {"https://10.0.0.9:6443/api"}},
			wantCode: 502, says: "answered with a redirect", absent: []string{"Location"}},
		{name: "a permanent redirect neither", answer: 308, header2: http.Header{"Location": {"/elsewhere"}}, wantCode: 502},
		{name: "304 without Location is an answer", answer: 304, wantCode: 304},
		{name: "CORS headers are removed", answer: 200,
			header2:  http.Header{"Access-Control-Allow-Origin": {"*"}, "Access-Control-Allow-Credentials": {"true"}, "Access-Control-Expose-Headers": {"Date"}, "Audit-Id": {"x"}},
			wantCode: 200, absent: []string{"Access-Control-Allow-Origin", "Access-Control-Allow-Credentials", "Access-Control-Expose-Headers"}},
		{name: "the cluster's headers reach the client whole, hop-by-hop ones removed", answer: 200,
			header2: http.Header{"Audit-Id": {"a-1"}, "Warning": {`299 - "one"`, `299 - "two"`}, "X-Kubernetes-Pf-Flowschema-Uid": {"f"},
				"Connection": {"X-Secret"}, "X-Secret": {"s"}, "Keep-Alive": {"timeout=5"}},
			wantCode: 200, absent: []string{"Connection", "X-Secret", "Keep-Alive"},
			present: http.Header{"Audit-Id": {"a-1"}, "Warning": {`299 - "one"`, `299 - "two"`}, "X-Kubernetes-Pf-Flowschema-Uid": {"f"}, "Content-Type": {"application/json"}}},
		{name: "an upgrade answered 200", header: upgrade, answer: 200, wantCode: 502, says: "instead of switching protocols"},
		{name: "an upgrade answered with a redirect", header: upgrade, answer: 302, header2: http.Header{"Location": {"/x"}}, wantCode: 502},
		{name: "an upgrade refused by the cluster: its Status is passed on", header: upgrade, answer: 403, wantCode: 403, says: "cluster says no"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pool := w.pool()
			pool.answer = func(r *http.Request) *http.Response {
				h := tt.header2.Clone()
				if h == nil {
					h = http.Header{}
				}
				h.Set("Content-Type", "application/json")
				return &http.Response{StatusCode: tt.answer, Header: h, Body: io.NopCloser(strings.NewReader(`{"kind":"Status","message":"cluster says no"}`)), Request: r}
			}
			g, err := New(configured(Options{Pool: pool, Reviewer: w.reviewer()}))
			if err != nil {
				t.Fatal(err)
			}
			h := bearer(w.hubToken)
			for k, v := range tt.header {
				h[k] = v
			}
			rec := serve(g, "GET", "/c1/api/v1/namespaces/a/pods/p/exec", h)
			if rec.Code != tt.wantCode || !strings.Contains(rec.Body.String(), tt.says) {
				t.Fatalf("%d %s; want %d saying %q", rec.Code, rec.Body, tt.wantCode, tt.says)
			}
			for _, k := range tt.absent {
				if v := rec.Header().Get(k); v != "" {
					t.Errorf("%s: %q passed to the client", k, v)
				}
			}
			for k, want := range tt.present {
				if got := rec.Header()[k]; !slices.Equal(got, want) {
					t.Errorf("%s: the client got %q, want %q", k, got, want)
				}
			}
		})
	}
}

// TestMoveHeader: the cluster's headers are moved to the client's answer
// with the values it already has kept in front, as httputil's copyHeader
// would add them, and nothing is left to copy.
func TestMoveHeader(t *testing.T) {
	tests := []struct {
		name          string
		dst, src, out http.Header
	}{
		{name: "into an empty answer", dst: http.Header{}, src: http.Header{"A": {"1"}, "B": {"2", "3"}}, out: http.Header{"A": {"1"}, "B": {"2", "3"}}},
		{name: "beside values already set", dst: http.Header{"A": {"0"}, "C": {"c"}}, src: http.Header{"A": {"1", "2"}},
			out: http.Header{"A": {"0", "1", "2"}, "C": {"c"}}},
		{name: "nothing to move", dst: http.Header{"C": {"c"}}, src: http.Header{}, out: http.Header{"C": {"c"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			moveHeader(tt.dst, tt.src)
			if len(tt.src) != 0 {
				t.Errorf("left behind: %v", tt.src)
			}
			if len(tt.dst) != len(tt.out) {
				t.Fatalf("got %v, want %v", tt.dst, tt.out)
			}
			for k, want := range tt.out {
				if !slices.Equal(tt.dst[k], want) {
					t.Errorf("%s: got %q, want %q", k, tt.dst[k], want)
				}
			}
		})
	}
}
