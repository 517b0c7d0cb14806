package testutil

import (
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Labels selects the series of a metric: a series matches when it carries
// every one of these label values (and perhaps other labels too). Nil
// selects every series.
type Labels map[string]string

// Metrics is a snapshot of Prometheus metric families by name, read from
// a /metrics endpoint, a Prometheus text or an in-process registry.
type Metrics map[string]*dto.MetricFamily

// ParseMetrics parses a Prometheus text exposition.
func ParseMetrics(text string) (Metrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	return mfs, nil
}

// Scrape reads and parses the metrics url serves (a daemon's
// http://host:port/metrics).
func Scrape(url string) (Metrics, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
	}
	return ParseMetrics(string(body))
}

// Gather reads an in-process registry.
func Gather(g prometheus.Gatherer) (Metrics, error) {
	mfs, err := g.Gather()
	if err != nil {
		return nil, fmt.Errorf("gather metrics: %w", err)
	}
	m := Metrics{}
	for _, mf := range mfs {
		m[mf.GetName()] = mf
	}
	return m, nil
}

// Metric scrapes url and returns the value of name's series that match
// labels (see Metrics.Value), failing t when url cannot be read.
func Metric(t testing.TB, url, name string, labels Labels) float64 {
	t.Helper()
	m, err := Scrape(url)
	if err != nil {
		t.Fatal(err)
	}
	return m.Value(name, labels)
}

// Lookup returns the sum of the values of name's series that match
// labels, and whether any series matched. A counter's, gauge's or
// untyped metric's value is its sample; a histogram's or summary's is its
// sample count.
func (m Metrics) Lookup(name string, labels Labels) (float64, bool) {
	mf := m[name]
	if mf == nil {
		return 0, false
	}
	var sum float64
	found := false
	for _, s := range mf.GetMetric() {
		if !matches(s, labels) {
			continue
		}
		found = true
		switch {
		case s.Counter != nil:
			sum += s.GetCounter().GetValue()
		case s.Gauge != nil:
			sum += s.GetGauge().GetValue()
		case s.Untyped != nil:
			sum += s.GetUntyped().GetValue()
		case s.Histogram != nil:
			sum += float64(s.GetHistogram().GetSampleCount())
		case s.Summary != nil:
			sum += float64(s.GetSummary().GetSampleCount())
		}
	}
	return sum, found
}

// Value is Lookup's sum: 0 when no series matches.
func (m Metrics) Value(name string, labels Labels) float64 {
	v, _ := m.Lookup(name, labels)
	return v
}

// Has reports whether name has a series that matches labels.
func (m Metrics) Has(name string, labels Labels) bool {
	_, ok := m.Lookup(name, labels)
	return ok
}

// Text renders m in the Prometheus text format, families sorted by name,
// for leak checks and failure messages.
func (m Metrics) Text() string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		_, _ = expfmt.MetricFamilyToText(&b, m[n])
	}
	return b.String()
}

func matches(s *dto.Metric, want Labels) bool {
	for k, v := range want {
		found := false
		for _, lp := range s.GetLabel() {
			if lp.GetName() == k && lp.GetValue() == v {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}
