package bus

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// describing records the name of every metric registered on it.
type describing struct{ names []string }

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (d *describing) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 16)
	go func() { c.Describe(ch); close(ch) }()
	for desc := range ch {
		// A Desc shows its name only through String.
		if m := fqName.FindStringSubmatch(desc.String()); m != nil {
			d.names = append(d.names, m[1])
		}
	}
	return nil
}

func (d *describing) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = d.Register(c)
	}
}

func (d *describing) Unregister(prometheus.Collector) bool { return false }

// Every metric of the bus shares one prefix, so that one query or one
// dashboard row finds all the NATS sink reports, labelled series that have
// no value yet included.
func TestMetricsShareOnePrefix(t *testing.T) {
	d := &describing{}
	if _, err := newMetrics(d); err != nil {
		t.Fatal(err)
	}
	if len(d.names) < 9 {
		t.Fatalf("only %d metrics described: %v", len(d.names), d.names)
	}
	for _, n := range d.names {
		if !strings.HasPrefix(n, "hubsync_bus_") {
			t.Errorf("metric %s: want the prefix hubsync_bus_", n)
		}
	}
	if !slices.Contains(d.names, "hubsync_bus_publish_duration_seconds") {
		t.Errorf("the publish histogram is missing from %v", d.names)
	}
}
