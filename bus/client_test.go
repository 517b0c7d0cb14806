package bus

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/events"
)

// fakeKV is a KV bucket whose watch delivers entries, then ends as end
// says: with the nil marker of the current values, or by closing.
type fakeKV struct {
	jetstream.KeyValue // the methods a test does not use panic
	entries            []jetstream.KeyValueEntry
	marker             bool // deliver the nil end marker before closing
}

type fakeEntry struct {
	jetstream.KeyValueEntry
	key   string
	value []byte
}

func (e fakeEntry) Key() string   { return e.key }
func (e fakeEntry) Value() []byte { return e.value }

type fakeWatcher struct{ ch chan jetstream.KeyValueEntry }

func (w fakeWatcher) Updates() <-chan jetstream.KeyValueEntry { return w.ch }
func (w fakeWatcher) Stop() error                             { return nil }

func (f *fakeKV) Watch(_ context.Context, _ string, _ ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	ch := make(chan jetstream.KeyValueEntry, len(f.entries)+1)
	for _, e := range f.entries {
		ch <- e
	}
	if f.marker {
		ch <- nil
	}
	close(ch)
	return fakeWatcher{ch}, nil
}

func (f *fakeKV) WatchAll(ctx context.Context, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	return f.Watch(ctx, ">", opts...)
}

// TestKVReaderClosedWatch: a watch that closes before the nil marker that
// ends the current values (the connection dropped, the bucket was
// deleted) is an error, for the daemon's resync as for hubsync state; it
// is not a bucket that holds only what arrived before.
func TestKVReaderClosedWatch(t *testing.T) {
	rec, err := json.Marshal(Record{Namespace: "team-ml", Cluster: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	key := events.KVKey("team-ml", "c1")
	entries := []jetstream.KeyValueEntry{fakeEntry{key: key, value: rec}, fakeEntry{key: "team-ml.junk", value: []byte("{")}}
	for _, tc := range []struct {
		name    string
		marker  bool
		wantErr bool
	}{
		{name: "every value, then the marker", marker: true},
		{name: "closed before the marker", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kv := &fakeKV{entries: entries, marker: tc.marker}
			b := &Bus{kv: kv, log: testLog()}
			got, err := b.kvRecords(context.Background(), true)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("kvRecords = %v, nil error; want an error", got)
				}
			} else if err != nil || len(got) != 2 || got[key] == nil || got["team-ml.junk"] != nil {
				t.Fatalf("kvRecords = %v, %v; want the record and the junk key", got, err)
			}
			recs, err := readRecords(context.Background(), kv, "*.*", true)
			if (err != nil) != tc.wantErr {
				t.Fatalf("readRecords = %v, %v; want an error: %v", recs, err, tc.wantErr)
			}
		})
	}
}

// TestStartHoldsNoLockAcrossIO: while Start reads its files (here an NKey
// seed that is a FIFO nobody writes yet), Attach, which the connection's
// callbacks reach, and ClientURL answer at once.
func TestStartHoldsNoLockAcrossIO(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "user.nk")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	user, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := user.Seed()
	cfg := busConfig(t)
	cfg.URLs = []string{"nats://127.0.0.1:1"}
	cfg.NKeySeedFile = fifo
	b, err := New(cfg, "hubsync/test", testLog(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	started := make(chan error, 1)
	go func() { started <- b.Start(ctx) }()
	// The FIFO's write end opens without blocking only once Start has
	// opened its read end.
	var w *os.File
	eventually(t, "Start reading the seed", func() bool {
		w, err = os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0)
		return err == nil
	})
	answered := make(chan struct{})
	go func() {
		defer close(answered)
		b.Attach(nil)
		_ = b.ClientURL()
	}()
	select {
	case <-answered:
	case <-time.After(5 * time.Second):
		t.Error("Attach waited for Start to read its files")
	}
	if _, err := w.Write(seed); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	<-answered
}

// TestCloseWhileStarting: a Close that comes while Start starts the
// embedded server leaves nothing running: Start fails and stops the
// server itself.
func TestCloseWhileStarting(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "token")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := busConfig(t)
	cfg.Embedded.AuthTokenFile = fifo
	b, err := New(cfg, "hubsync/test", testLog(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan error, 1)
	go func() { started <- b.Start(context.Background()) }()
	var w *os.File
	eventually(t, "Start reading the token", func() bool {
		w, err = os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0)
		return err == nil
	})
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteString("c0nsumer-t0ken-0123456789abcdef\n"); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	if err := <-started; err == nil || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("Start after Close: %v, want an error", err)
	}
	if url := b.ClientURL(); url != "" {
		t.Errorf("a closed bus has a client URL %s", url)
	}
}

// TestDialErrorsHoldNoSecret: the consumer's connection errors show the
// URL without its user information, even for a URL that does not parse.
func TestDialErrorsHoldNoSecret(t *testing.T) {
	for _, u := range []string{
		"nats://s3cret-t0ken@127.0.0.1:1",
		"nats://me:s3cret@127.0.0.1:1",
		"s3cret-t0ken@127.0.0.1:1",
		"nats://s3cret-t0ken@127.0.0.1:port",
		"nats://s3cret-t0ken@127.0.0.1:1,nats://other:s3cret@127.0.0.1:2",
	} {
		cfg := config.Bus{URLs: strings.Split(u, ",")}
		_, err := Dial(cfg, "test", time.Second)
		if err == nil {
			t.Errorf("%s: Dial succeeded", u)
			continue
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("Dial's error shows a secret: %v", err)
		}
	}
}
