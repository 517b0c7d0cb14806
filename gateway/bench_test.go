package gateway

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// BenchmarkGatewayHotPath is one request of a hub identity whose review is
// cached, from the client's headers to the pool's round tripper: the
// gateway's own share of a small GET.
func BenchmarkGatewayHotPath(b *testing.B) {
	w := newWorld(b)
	pool := w.pool()
	g, err := New(configured(Options{Pool: fixedPool{fakePool: pool, rt: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}}, Body: http.NoBody, Request: r}, nil
	})}, Reviewer: w.reviewer(), HubKeys: w.hubKeys(), PassThrough: true}))
	if err != nil {
		b.Fatal(err)
	}
	token := w.hubToken + w.c1Token // a token as long as a real one
	rev := w.reviewer()
	rev.ids[token] = w.alice
	g.reviewer.next = rev
	req := httptest.NewRequest(http.MethodGet, "https://gw/c1/api/v1/namespaces/a/configmaps/small", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "kubectl/v1.35.4 (linux/amd64) kubernetes/abcdef0")
	b.ReportAllocs()
	for b.Loop() {
		rec := httptest.NewRecorder()
		g.ServeHTTP(rec, req)
		if rec.Code != 200 {
			b.Fatal(rec.Code)
		}
	}
}
