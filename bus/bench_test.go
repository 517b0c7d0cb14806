package bus

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/stream/streamtest"
)

// BenchmarkPublish measures end-to-end throughput with file storage: each
// event is published, acknowledged by JetStream and mirrored into the KV
// bucket before the next one goes. "embedded" uses the in-process
// connection, "tcp" an external server on loopback.
//
//	go test ./bus -run '^$' -bench Publish -benchtime 20000x
func BenchmarkPublish(bm *testing.B) {
	for _, mode := range []string{"embedded", "tcp"} {
		bm.Run(mode, func(bm *testing.B) {
			cfg := busConfig(bm)
			cfg.BufferSize = bm.N + 1
			if mode == "tcp" {
				s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: bm.TempDir(), NoLog: true, NoSigs: true})
				if err != nil {
					bm.Fatal(err)
				}
				go s.Start()
				if !s.ReadyForConnections(5 * time.Second) {
					bm.Fatal("not ready")
				}
				defer s.Shutdown()
				cfg.URLs = []string{s.ClientURL()}
			}
			bus, err := New(cfg, "hubsync/bench", testLog(), nil)
			if err != nil {
				bm.Fatal(err)
			}
			f, err := stream.NewFanout(testLog(), nil)
			if err != nil {
				bm.Fatal(err)
			}
			if err := f.Add(bus.ConsumerOptions(), bus); err != nil {
				bm.Fatal(err)
			}
			b := &testBus{Bus: bus, f: f}
			defer b.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if err := b.Start(ctx, nil); err != nil {
				bm.Fatal(err)
			}
			changes := make([]stream.Change, bm.N)
			for i := range changes {
				changes[i] = streamtest.Profile(stream.ProfileUpdated, "team-a", fmt.Sprintf("c%d", i%100), strconv.Itoa(i))
			}
			bm.ResetTimer()
			begin := time.Now()
			for _, c := range changes {
				b.Notify(c)
			}
			if err := b.Flush(ctx); err != nil {
				bm.Fatal(err)
			}
			bm.ReportMetric(float64(bm.N)/time.Since(begin).Seconds(), "events/s")
		})
	}
}
