package main

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/hubsync/hubsync/test/fleet"
)

// apiRequests counts the API server's requests by verb, resource and
// subresource (apiserver_request_total), for telling what a run asked of
// it beside its writes.
type apiRequests map[string]float64

var requestLabel = regexp.MustCompile(`(\w+)="([^"]*)"`)

// readAPIRequests scrapes the API server's request counters.
func readAPIRequests(ctx context.Context, hub *fleet.Hub) (apiRequests, error) {
	raw, err := hub.Kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("scrape the API server's metrics: %w", err)
	}
	out := apiRequests{}
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		end := strings.LastIndex(line, "}")
		v, err := strconv.ParseFloat(strings.TrimSpace(line[end+1:]), 64)
		if err != nil {
			continue
		}
		labels := map[string]string{}
		for _, m := range requestLabel.FindAllStringSubmatch(line[:end], -1) {
			labels[m[1]] = m[2]
		}
		key := labels["verb"] + " " + labels["resource"]
		if s := labels["subresource"]; s != "" {
			key += "/" + s
		}
		out[key] += v
	}
	return out, nil
}

// since lists the requests made after before, most first.
func (a apiRequests) since(before apiRequests) string {
	type count struct {
		key string
		n   float64
	}
	var counts []count
	for k, v := range a {
		if d := v - before[k]; d > 0 {
			counts = append(counts, count{k, d})
		}
	}
	slices.SortFunc(counts, func(x, y count) int { return int(y.n - x.n) })
	parts := make([]string, 0, len(counts))
	for _, c := range counts {
		parts = append(parts, fmt.Sprintf("%s %.0f", c.key, c.n))
	}
	return strings.Join(parts, ", ")
}
