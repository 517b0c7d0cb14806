package webhook

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/stream/streamtest"
)

// BenchmarkDeliver measures what one event costs the sink from Deliver to
// a loopback endpoint's 2xx, in batches of 4 as in an initial sync:
//
//	go test ./sinks/webhook -run '^$' -bench Deliver -benchtime 4000x
func BenchmarkDeliver(b *testing.B) {
	var got atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		got.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	e := newEnv(b, srv.URL)
	e.cfg.Webhook.Spool.MaxBytes = 1 << 30
	s := e.start()
	const batch = 4
	changes := make([]stream.Change, 0, batch)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		changes = append(changes, streamtest.Profile(stream.ProfileCreated, "ns", fmt.Sprintf("cluster-%06d", i), "1"))
		if len(changes) == batch || i == b.N-1 {
			if err := s.Deliver(b.Context(), changes); err != nil {
				b.Fatal(err)
			}
			changes = changes[:0]
		}
	}
	waitFor(b, "every event delivered", func() bool { return got.Load() >= int64(b.N) })
}
