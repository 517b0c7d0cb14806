// Package status reads what a running hubsync daemon exposes over its
// health and metrics server (/metrics and /readyz?verbose) and sums it up
// for operators: who leads, what the consumer namespaces hold, how the
// sinks, tunnels and gateway fare, whether the hub answers and the
// configuration reloaded. `hubsync status` prints it as text or JSON.
//
// Owns: reading a daemon's exposition over HTTP, the summary and its two
// forms. It knows the daemon only by the names of its metrics and the
// lines of /readyz?verbose (docs/operations.md), so it imports no other
// hubsync package.
package status

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Scrape is one reading of a daemon: its metrics and its verbose
// readiness answer.
type Scrape struct {
	// At is when the metrics were read.
	At time.Time
	// Metrics are the metric families by name.
	Metrics map[string]*dto.MetricFamily
	// Ready is whether /readyz answered 200; Reason is its first line
	// ("ok", "standby", "draining: ...").
	Ready  bool
	Reason string
	// Lines are the rest of /readyz?verbose: one line per sink, the
	// tunnel summary and entries, the contested objects.
	Lines []string
}

// ErrNotHubsync is returned when the address answers, but not as
// hubsync's health and metrics server.
var ErrNotHubsync = errors.New("not hubsync's health and metrics server")

// BaseURL turns an address as an operator gives it (host:port, :port, or
// a URL) into the server's base URL.
func BaseURL(address string) string {
	address = strings.TrimSuffix(address, "/")
	if strings.HasPrefix(address, "http://") || strings.HasPrefix(address, "https://") {
		return address
	}
	if strings.HasPrefix(address, ":") {
		address = "localhost" + address
	}
	return "http://" + address
}

// Read scrapes the daemon at base (see BaseURL): /metrics, then
// /readyz?verbose. An address that does not answer, or answers but not
// as hubsync, is an error that says so.
func Read(ctx context.Context, client *http.Client, base string) (*Scrape, error) {
	s := &Scrape{At: time.Now()}
	body, code, date, err := get(ctx, client, base+"/metrics")
	if err != nil {
		return nil, err
	}
	s.At = daemonClock(s.At, date)
	if code != http.StatusOK {
		return nil, fmt.Errorf("%s/metrics answered %d %s: %w", base, code, http.StatusText(code), ErrNotHubsync)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	if s.Metrics, err = p.TextToMetricFamilies(strings.NewReader(body)); err != nil {
		return nil, fmt.Errorf("%s/metrics is not a Prometheus exposition (%v): %w", base, err, ErrNotHubsync)
	}
	if s.Metrics[mLeader] == nil {
		return nil, fmt.Errorf("%s/metrics has no %s metric: %w", base, mLeader, ErrNotHubsync)
	}
	body, code, _, err = get(ctx, client, base+"/readyz?verbose")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK && code != http.StatusServiceUnavailable {
		return nil, fmt.Errorf("%s/readyz answered %d %s: %w", base, code, http.StatusText(code), ErrNotHubsync)
	}
	s.Ready = code == http.StatusOK
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for first := true; sc.Scan(); first = false {
		if first {
			s.Reason = sc.Text()
			continue
		}
		if line := sc.Text(); line != "" {
			s.Lines = append(s.Lines, line)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s/readyz: %w", base, err)
	}
	return s, nil
}

// maxBody bounds what is read of one answer; a daemon's metrics with a
// large fleet's tunnels are a few megabytes.
const maxBody = 64 << 20

func get(ctx context.Context, client *http.Client, url string) (body string, code int, date string, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", 0, "", fmt.Errorf("request %s: %w", url, err)
	}
	req.Header.Set("Accept", "text/plain")
	resp, err := client.Do(req)
	if err != nil {
		return "", 0, "", fmt.Errorf("no answer from %s: %w (is hubsync running there? for a pod: "+
			"kubectl port-forward -n open-cluster-management-hub pod/POD 8080, then --address localhost:8080)", url, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return "", 0, "", fmt.Errorf("read %s: %w", url, err)
	}
	return string(data), resp.StatusCode, resp.Header.Get("Date"), nil
}

// maxSkew is how far the daemon's clock may be from this machine's before
// ages are taken on the daemon's: the timestamps in its metrics are its own.
const maxSkew = 2 * time.Second

// daemonClock is the daemon's time when it answered: local, unless the
// answer's Date header (whole seconds) says the daemon's clock is more
// than maxSkew away, as on a workstation reaching a pod through a
// port-forward.
func daemonClock(local time.Time, date string) time.Time {
	t, err := http.ParseTime(date)
	if err != nil {
		return local
	}
	if skew := t.Sub(local); skew > maxSkew || skew < -maxSkew {
		return local.Add(skew)
	}
	return local
}
