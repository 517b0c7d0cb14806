package gateway

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/hubsync/hubsync/test/testutil"
)

// TestStrangersCostLittle floods the running gateway with forged tokens
// (half opaque, half self-signed JWTs) from one address while a client
// with a good token reads the same cluster from another: the flood costs
// few hub TokenReviews, none of it reaches the cluster, and the client
// sees no error.
func TestStrangersCostLittle(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := start(t, ctx)
	const conns, perConn = 20, 20
	const flood = conns * perConn
	reviews := func() float64 {
		return s.metric(t, "hubsync_gateway_token_reviews_total", testutil.Labels{"result": "authenticated"}) +
			s.metric(t, "hubsync_gateway_token_reviews_total", testutil.Labels{"result": "unauthenticated"}) +
			s.metric(t, "hubsync_gateway_token_reviews_total", testutil.Labels{"result": "error"})
	}
	before := reviews()
	jwts := make([]string, flood)
	for i := range jwts {
		jwts[i] = selfSignedJWT(t, "https://"+env.managed.Address, fmt.Sprintf("system:serviceaccount:kube-system:admin-%d", i))
	}

	// The legitimate client: its own connection, its own address.
	var legitErrs []string
	var legitN int
	stop := make(chan struct{})
	var legit sync.WaitGroup
	legit.Add(1)
	go func() {
		defer legit.Done()
		client := s.client()
		for {
			select {
			case <-stop:
				return
			default:
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.url+"/"+cluster+"/api/v1/namespaces/apps/configmaps/cm-1", nil)
			req.Header.Set("Authorization", "Bearer "+s.userToken)
			resp, err := client.Do(req)
			legitN++
			if err != nil {
				legitErrs = append(legitErrs, err.Error())
				continue
			}
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				legitErrs = append(legitErrs, resp.Status)
			}
		}
	}()

	// The flood, from 127.0.0.2.
	codes := map[int]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	floodStart := time.Now()
	for c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: s.ca}, MaxConnsPerHost: 1,
				DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}).DialContext}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
			for i := range perConn {
				// Every token a new one: no refusal is answered from memory.
				token := rand.Text()
				if (c+i)%2 == 1 {
					token = jwts[c*perConn+i]
				}
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.url+"/"+cluster+"/api/v1/namespaces/apps/configmaps/flood", nil)
				req.Header.Set("Authorization", "Bearer "+token)
				req.Header.Set("User-Agent", "hubsync-flood")
				resp, err := client.Do(req)
				code := 0
				if err == nil {
					code = resp.StatusCode
					_ = resp.Body.Close()
				}
				mu.Lock()
				codes[code]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	took := time.Since(floodStart)
	close(stop)
	legit.Wait()

	spent := reviews() - before
	t.Logf("%d forged requests in %s: answers %v; %v hub TokenReviews; the legitimate client made %d requests", flood, took.Round(time.Millisecond), codes, spent, legitN)
	cfgBurst, cfgRate := 50.0, 5.0 // the defaults
	if bound := cfgBurst + cfgRate*took.Seconds() + 2; spent > bound {
		t.Errorf("%v TokenReviews for %d forged requests in %s; want at most the refusal bucket's %v (and the legitimate client's)", spent, flood, took, bound)
	}
	if codes[http.StatusTooManyRequests] == 0 || codes[0] > 0 {
		t.Errorf("answers %v: want 429s, and no request failing", codes)
	}
	if len(legitErrs) > 0 {
		t.Errorf("the legitimate client saw %d errors of %d: %v", len(legitErrs), legitN, legitErrs[:min(5, len(legitErrs))])
	}
	// Nothing of the flood reached the cluster.
	events, err := env.managed.AuditEvents("/configmaps/flood")
	if err != nil {
		t.Fatal(err)
	}
	if len(events) > 0 {
		t.Errorf("%d forged requests reached the cluster (first as %q)", len(events), events[0].User.Username)
	}
}
