package status

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// now is the time of the fixture readings.
var now = time.Unix(1_800_000_000, 0).UTC()

// unix is a time before now as the metrics write it.
func unix(ago time.Duration) string { return fmt.Sprint(now.Add(-ago).Unix()) }

// leaderMetrics is a leader's exposition: two consumer namespaces (one
// with a stale copy), a webhook sink down with a backlog and a healthy
// nats sink, failingTunnels failing tunnels and one ready, and gateway
// traffic with requests counted by code.
func leaderMetrics(failingTunnels int, requests200, refused float64) string {
	var b strings.Builder
	fmt.Fprintf(&b, `# TYPE hubsync_leader gauge
hubsync_leader 1
# TYPE hubsync_leader_info gauge
hubsync_leader_info{identity="hubsync-7c9d-x2x_5f0c"} 1
# TYPE hubsync_hub_reachable gauge
hubsync_hub_reachable 1
# TYPE hubsync_config_last_reload_successful gauge
hubsync_config_last_reload_successful 0
# TYPE hubsync_config_last_reload_success_timestamp_seconds gauge
hubsync_config_last_reload_success_timestamp_seconds %s
# TYPE hubsync_config_reloads_total counter
hubsync_config_reloads_total{result="applied"} 2
hubsync_config_reloads_total{result="rejected"} 1
hubsync_config_reloads_total{result="unchanged"} 5
# TYPE hubsync_config_restart_required gauge
hubsync_config_restart_required 0
# TYPE hubsync_consumer_profiles gauge
hubsync_consumer_profiles{consumer_namespace="team-a"} 3
hubsync_consumer_profiles{consumer_namespace="team-b"} 2
# TYPE hubsync_consumer_credential_copies gauge
hubsync_consumer_credential_copies{consumer_namespace="team-a"} 3
hubsync_consumer_credential_copies{consumer_namespace="team-b"} 2
# TYPE hubsync_consumer_credential_copies_stale gauge
hubsync_consumer_credential_copies_stale{consumer_namespace="team-a"} 0
hubsync_consumer_credential_copies_stale{consumer_namespace="team-b"} 1
# TYPE hubsync_consumer_credential_copy_oldest_timestamp_seconds gauge
hubsync_consumer_credential_copy_oldest_timestamp_seconds{consumer_namespace="team-a"} %s
hubsync_consumer_credential_copy_oldest_timestamp_seconds{consumer_namespace="team-b"} %s
# TYPE hubsync_sink_up gauge
hubsync_sink_up{sink="events",type="nats"} 1
hubsync_sink_up{sink="hook",type="webhook"} 0
# TYPE hubsync_sink_queue_depth gauge
hubsync_sink_queue_depth{sink="events",type="nats"} 0
hubsync_sink_queue_depth{sink="hook",type="webhook"} 65
# TYPE hubsync_sink_oldest_waiting_timestamp_seconds gauge
hubsync_sink_oldest_waiting_timestamp_seconds{sink="events",type="nats"} 0
hubsync_sink_oldest_waiting_timestamp_seconds{sink="hook",type="webhook"} %s
# TYPE hubsync_sink_last_success_timestamp_seconds gauge
hubsync_sink_last_success_timestamp_seconds{sink="events",type="nats"} %s
hubsync_sink_last_success_timestamp_seconds{sink="hook",type="webhook"} %s
`, unix(time.Hour), unix(3*time.Hour), unix(2*time.Hour), unix(66*time.Second), unix(time.Second), unix(3*time.Minute))
	b.WriteString("# TYPE hubsync_tunnel_state gauge\n")
	b.WriteString(`hubsync_tunnel_state{cluster="ok-1",state="ready"} 1` + "\n")
	for i := range failingTunnels {
		fmt.Fprintf(&b, "hubsync_tunnel_state{cluster=\"edge-%02d\",state=\"failing\"} 1\n", i)
	}
	b.WriteString("# TYPE hubsync_tunnel_state_since_timestamp_seconds gauge\n")
	b.WriteString(`hubsync_tunnel_state_since_timestamp_seconds{cluster="ok-1"} ` + unix(time.Hour) + "\n")
	for i := range failingTunnels {
		// edge-00 has failed longest.
		fmt.Fprintf(&b, "hubsync_tunnel_state_since_timestamp_seconds{cluster=\"edge-%02d\"} %s\n", i, unix(time.Duration(100-i)*time.Minute))
	}
	fmt.Fprintf(&b, `# TYPE hubsync_gateway_requests_total counter
hubsync_gateway_requests_total{cluster="ok-1",cluster_set="prod",code="200",mode="impersonate"} %v
hubsync_gateway_requests_total{cluster="ok-2",cluster_set="",code="201",mode="impersonate"} 10
hubsync_gateway_requests_total{cluster="edge-00",cluster_set="edge",code="502",mode="impersonate"} 7
hubsync_gateway_requests_total{cluster="ok-1",cluster_set="prod",code="403",mode="impersonate"} 3
# TYPE hubsync_gateway_refused_total counter
hubsync_gateway_refused_total{reason="unauthenticated"} %v
# TYPE hubsync_gateway_token_reviews_total counter
hubsync_gateway_token_reviews_total{result="authenticated"} 50
hubsync_gateway_token_reviews_total{result="error"} 2
# TYPE hubsync_gateway_upgraded_connections gauge
hubsync_gateway_upgraded_connections 3
# TYPE hubsync_bus_stream_replicas gauge
hubsync_bus_stream_replicas{state="current"} 2
hubsync_bus_stream_replicas{state="behind"} 0
hubsync_bus_stream_replicas{state="offline"} 1
# TYPE hubsync_bus_copy_failing gauge
hubsync_bus_copy_failing{consumer="local"} 0
hubsync_bus_copy_failing{consumer="kueue"} 1
# TYPE hubsync_bus_copy_lag gauge
hubsync_bus_copy_lag{consumer="local",copy="events"} 0
hubsync_bus_copy_lag{consumer="local",copy="records"} 0
hubsync_bus_copy_lag{consumer="kueue",copy="events"} 12
hubsync_bus_copy_lag{consumer="kueue",copy="records"} 3
`, requests200, refused)
	return b.String()
}

const leaderReadyz = `ok
sink events (nats): ok, 0 queued
sink hook (webhook): failing for 1m5s (14 attempts): POST https://h/: endpoint answered 503 Service Unavailable, 65 queued, oldest 1m6s, last attempt 2s ago: 503 Service Unavailable
tunnels: 1 ready, 25 failing, 0 connecting
tunnel edge-00: failing for 1h40m0s: dial tcp 10.0.0.1:443: connection refused
tunnel edge-01: failing for 1h39m0s: probe: context deadline exceeded
[+]contested ok: no object is written by another controller
`

// followerMetrics is a standby's exposition: no consumer or sink figures
// of its own (its syncer never ran), its own tunnels and gateway.
const followerMetrics = `# TYPE hubsync_leader gauge
hubsync_leader 0
# TYPE hubsync_leader_info gauge
hubsync_leader_info{identity="hubsync-7c9d-x2x_5f0c"} 1
# TYPE hubsync_hub_reachable gauge
hubsync_hub_reachable 1
# TYPE hubsync_sink_up gauge
hubsync_sink_up{sink="hook",type="webhook"} 1
# TYPE hubsync_tunnel_state gauge
hubsync_tunnel_state{cluster="ok-1",state="ready"} 1
# TYPE hubsync_gateway_upgraded_connections gauge
hubsync_gateway_upgraded_connections 0
`

func scrape(t *testing.T, at time.Time, metrics, readyz string, ready bool) *Scrape {
	t.Helper()
	srv := httptest.NewServer(daemonHandler(metrics, readyz, ready))
	defer srv.Close()
	s, err := Read(context.Background(), srv.Client(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	s.At = at
	return s
}

// daemonHandler serves /metrics and /readyz as the daemon does.
func daemonHandler(metrics, readyz string, ready bool) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, metrics) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if !ready {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		body := readyz
		if !r.URL.Query().Has("verbose") {
			body, _, _ = strings.Cut(readyz, "\n")
		}
		_, _ = io.WriteString(w, body)
	})
	return mux
}

func TestSummarize(t *testing.T) {
	leader := scrape(t, now, leaderMetrics(25, 1000, 5), leaderReadyz, true)
	earlier := scrape(t, now.Add(-10*time.Second), leaderMetrics(25, 900, 4), leaderReadyz, true)
	follower := scrape(t, now, followerMetrics, "standby\ntunnels: 1 ready, 0 failing, 0 connecting\n", true)
	restarted := scrape(t, now.Add(-10*time.Second), leaderMetrics(25, 5000, 4), leaderReadyz, true)
	starting := scrape(t, now, "# TYPE hubsync_leader gauge\nhubsync_leader 1\n", "caches not synced yet\n", false)

	tests := []struct {
		name      string
		cur, prev *Scrape
		// wantText are lines (or parts of lines) the text must hold;
		// notText what it must not.
		wantText, notText []string
		check             func(t *testing.T, st Status)
	}{
		{
			name: "leader", cur: leader,
			wantText: []string{
				"hubsync at http://d:8080: ready (ok)",
				"leader:    this replica leads (hubsync-7c9d-x2x_5f0c)",
				"hub:       reachable",
				"config:    last reload REJECTED (the running configuration stays; see the log); last good load 1h0m0s ago; 3 reloads, 1 rejected",
				"consumers: 2 namespaces, 5 profiles, 5 credential copies (1 stale), oldest copy synced 3h0m0s ago",
				// The namespace with a stale copy comes first.
				"  NAMESPACE  PROFILES  COPIES  STALE  OLDEST COPY\n  team-b     2         2       1      2h0m0s\n  team-a     3         3       0      3h0m0s\n",
				"sinks:     1 up, 1 down",
				"  hook    webhook  DOWN   65      1m6s            3m0s ago      POST https://h/: endpoint answered 503 Service Unavailable",
				"  events  nats     up     0       -               1s ago        -",
				"tunnels:   1 ready, 25 failing, 0 connecting",
				"  failing: edge-00 since 1h40m0s ago: dial tcp 10.0.0.1:443: connection refused",
				"  failing: edge-01 since 1h39m0s ago: probe: context deadline exceeded",
				"  failing: edge-09 since 1h31m0s ago\n",
				"  and 15 more failing (-o json names 20; the hubsync_tunnel_state metric every one)",
				"gateway:   1020 requests (2xx 1010, 4xx 3, 5xx 7), 5 refused, 2 TokenReview errors, 3 upgraded connections open",
				"bus:       event stream replicas 2 current, 0 behind, 1 offline; copies (events/records behind): kueue lag 12/3 FAILING, local lag 0/0",
			},
			notText: []string{"edge-10", "over "},
			check: func(t *testing.T, st Status) {
				if st.Consumers == nil || st.Consumers.StaleCopies != 1 || len(st.Consumers.Namespaces) != 2 || st.Consumers.Namespaces[0].Name != "team-a" {
					t.Errorf("consumers %+v", st.Consumers)
				}
				if a := st.Consumers.OldestCopyAgeSeconds; a == nil || *a != 3*3600 {
					t.Errorf("oldest copy age %v, want 10800", a)
				}
				if len(st.Sinks) != 2 || st.Sinks[1].Name != "hook" || st.Sinks[1].Up || st.Sinks[1].Queued != 65 ||
					st.Sinks[1].OldestWaitingAgeSeconds == nil || *st.Sinks[1].OldestWaitingAgeSeconds != 66 {
					t.Errorf("sinks %+v", st.Sinks)
				}
				if b := st.Bus; b == nil || b.StreamReplicas == nil || b.StreamReplicas.Offline != 1 || len(b.Copies) != 2 ||
					b.Copies[0] != (Copy{Consumer: "kueue", EventsLag: 12, RecordsLag: 3, Failing: true}) {
					t.Errorf("bus %+v", st.Bus)
				}
				if tn := st.Tunnels; tn.Failing != 25 || len(tn.FailingTunnels) != MaxFailingTunnels || tn.FailingNotListed != 5 {
					t.Errorf("tunnels: %d failing, %d listed, %d not listed", tn.Failing, len(tn.FailingTunnels), tn.FailingNotListed)
				}
				if st.Gateway.Rates != nil {
					t.Errorf("rates from one reading: %+v", st.Gateway.Rates)
				}
			},
		},
		{
			name: "leader, two readings 10s apart", cur: leader, prev: earlier,
			wantText: []string{"           over 10s: 10 requests/s (2xx 10/s, 4xx 0/s, 5xx 0/s), 0.10 refused/s, 0 TokenReview errors/s"},
			check: func(t *testing.T, st Status) {
				if r := st.Gateway.Rates; r == nil || r.IntervalSeconds != 10 || r.Requests["2xx"] != 10 || r.Refused != 0.1 {
					t.Errorf("rates %+v", r)
				}
			},
		},
		{
			name: "counters went back between the readings: no rates", cur: leader, prev: restarted,
			notText: []string{"over "},
			check: func(t *testing.T, st Status) {
				if st.Gateway.Rates != nil {
					t.Errorf("rates %+v across a restart", st.Gateway.Rates)
				}
			},
		},
		{
			name: "leader whose syncer is starting", cur: starting,
			wantText: []string{
				"hubsync at http://d:8080: not ready (caches not synced yet)",
				"leader:    this replica leads (identity not known yet)",
				"consumers: not known yet: the syncer reports them once its caches have synced",
				"sinks:     none",
			},
			notText: []string{"tunnels:", "gateway:", "hub:"},
			check: func(t *testing.T, st Status) {
				if st.Ready || !st.Leader.Leading || st.Tunnels != nil || st.Gateway != nil || st.Hub != nil {
					t.Errorf("status %+v", st)
				}
			},
		},
		{
			name: "follower", cur: follower,
			wantText: []string{
				"hubsync at http://d:8080: ready (standby)",
				"leader:    another replica leads: hubsync-7c9d-x2x_5f0c (pod hubsync-7c9d-x2x); this replica stands by",
				"consumers: only the leader runs the syncer and the sinks; run hubsync status against pod hubsync-7c9d-x2x",
				"tunnels:   1 ready, 0 failing, 0 connecting",
				"gateway:   0 requests, 0 refused, 0 TokenReview errors, 0 upgraded connections open",
			},
			notText: []string{"sinks:", "NAMESPACE", "config:"},
			check: func(t *testing.T, st Status) {
				if st.Leader.Leading || st.Leader.Identity != "hubsync-7c9d-x2x_5f0c" || st.Consumers != nil || st.Sinks != nil || st.Config != nil {
					t.Errorf("follower status %+v", st)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := Summarize("http://d:8080", tt.cur, tt.prev)
			var text bytes.Buffer
			if err := WriteText(&text, st); err != nil {
				t.Fatal(err)
			}
			for _, want := range tt.wantText {
				if !strings.Contains(text.String(), want) {
					t.Errorf("text lacks %q:\n%s", want, text.String())
				}
			}
			for _, not := range tt.notText {
				if strings.Contains(text.String(), not) {
					t.Errorf("text holds %q:\n%s", not, text.String())
				}
			}
			// The JSON form says the same and reads back.
			var js bytes.Buffer
			if err := WriteJSON(&js, st); err != nil {
				t.Fatal(err)
			}
			var back Status
			if err := json.Unmarshal(js.Bytes(), &back); err != nil {
				t.Fatalf("%v:\n%s", err, js.String())
			}
			tt.check(t, back)
		})
	}
}

// TestJSONShape pins the field names of -o json, a documented interface.
func TestJSONShape(t *testing.T) {
	leader := scrape(t, now, leaderMetrics(1, 1, 1), leaderReadyz, true)
	var js bytes.Buffer
	if err := WriteJSON(&js, Summarize("http://d:8080", leader, scrape(t, now.Add(-time.Second), leaderMetrics(1, 0, 0), leaderReadyz, true))); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{
		`"address"`, `"at"`, `"ready"`, `"reason"`, `"leader"`, `"leading"`, `"identity"`, `"hub"`, `"reachable"`,
		`"config"`, `"lastReloadSuccessful"`, `"lastSuccess"`, `"reloads"`, `"rejectedReloads"`, `"restartRequired"`,
		`"consumers"`, `"profiles"`, `"copies"`, `"staleCopies"`, `"oldestCopySyncedAt"`, `"oldestCopyAgeSeconds"`, `"namespaces"`, `"name"`,
		`"sinks"`, `"type"`, `"up"`, `"error"`, `"queued"`, `"oldestWaitingSince"`, `"oldestWaitingAgeSeconds"`,
		`"tunnels"`, `"failing"`, `"connecting"`, `"failingTunnels"`, `"cluster"`, `"since"`, `"failingNotListed"`,
		`"gateway"`, `"requests"`, `"refused"`, `"tokenReviewErrors"`, `"upgradedConnections"`, `"rates"`, `"intervalSeconds"`,
		`"bus"`, `"streamReplicas"`, `"current"`, `"behind"`, `"offline"`, `"consumer"`, `"eventsLag"`, `"recordsLag"`,
	} {
		if !strings.Contains(js.String(), key+":") {
			t.Errorf("JSON lacks %s:\n%s", key, js.String())
		}
	}
}

// TestReadRefuses: an address that does not answer, or answers but not as
// hubsync's server, is an error that says which.
func TestReadRefuses(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	_ = ln.Close()
	notFound := httptest.NewServer(http.NotFoundHandler())
	defer notFound.Close()
	otherMetrics := httptest.NewServer(daemonHandler("# TYPE node_load1 gauge\nnode_load1 0.5\n", "ok\n", true))
	defer otherMetrics.Close()
	html := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "<html><body>hello</body></html>\n")
	}))
	defer html.Close()
	noReadyz := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			_, _ = io.WriteString(w, followerMetrics)
			return
		}
		http.NotFound(w, r)
	}))
	defer noReadyz.Close()
	for _, tc := range []struct {
		name, url   string
		notHubsync  bool
		wantMessage string
	}{
		{"nothing listens", closed, false, "no answer from " + closed + "/metrics"},
		{"404", notFound.URL, true, "/metrics answered 404 Not Found"},
		{"another program's metrics", otherMetrics.URL, true, "has no hubsync_leader metric"},
		{"not an exposition", html.URL, true, "is not a Prometheus exposition"},
		{"no /readyz", noReadyz.URL, true, "/readyz answered 404"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Read(context.Background(), &http.Client{Timeout: 5 * time.Second}, tc.url)
			if err == nil {
				t.Fatal("Read succeeded")
			}
			if errors.Is(err, ErrNotHubsync) != tc.notHubsync || !strings.Contains(err.Error(), tc.wantMessage) {
				t.Errorf("error %q (not hubsync: %v); want one with %q (not hubsync: %v)", err, errors.Is(err, ErrNotHubsync), tc.wantMessage, tc.notHubsync)
			}
		})
	}
}

func TestBaseURL(t *testing.T) {
	for in, want := range map[string]string{
		":8080":                 "http://localhost:8080",
		"localhost:8080":        "http://localhost:8080",
		"10.0.0.5:9090":         "http://10.0.0.5:9090",
		"http://example:8080/":  "http://example:8080",
		"https://example:8443":  "https://example:8443",
		"[::1]:8080":            "http://[::1]:8080",
		"hubsync.example:8080/": "http://hubsync.example:8080",
	} {
		if got := BaseURL(in); got != want {
			t.Errorf("BaseURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestDaemonClock: ages are taken on the daemon's clock when its Date
// header says it is more than maxSkew from this machine's.
func TestDaemonClock(t *testing.T) {
	local := time.Date(2026, 1, 2, 3, 4, 5, 500e6, time.UTC)
	for _, tt := range []struct {
		name, date string
		want       time.Time
	}{
		{"no Date header", "", local},
		{"a Date that does not parse", "yesterday", local},
		{"within the skew", local.Add(time.Second).Format(http.TimeFormat), local},
		{"a daemon ahead", local.Add(time.Hour).Format(http.TimeFormat), local.Add(time.Hour).Truncate(time.Second)},
		{"a daemon behind", local.Add(-10 * time.Minute).Format(http.TimeFormat), local.Add(-10 * time.Minute).Truncate(time.Second)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := daemonClock(local, tt.date); !got.Equal(tt.want) {
				t.Errorf("daemonClock(%s, %q) = %s; want %s", local, tt.date, got, tt.want)
			}
		})
	}
}
