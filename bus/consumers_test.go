package bus

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/events"
	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/stream/streamtest"
	"github.com/hubsync/hubsync/test/testutil"
)

// consumerKey is a consuming application's NKey pair.
type consumerKey struct {
	pub string
	kp  nkeys.KeyPair
}

func newConsumerKey(t *testing.T) consumerKey {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return consumerKey{pub: pub, kp: kp}
}

// dial connects with k to url; closed tells when the server closes it.
func (k consumerKey) dial(url string, closed chan<- struct{}) (*nats.Conn, error) {
	return nats.Connect(url, nats.Nkey(k.pub, k.kp.Sign), nats.NoReconnect(), nats.Timeout(2*time.Second),
		nats.ClosedHandler(func(*nats.Conn) {
			if closed != nil {
				close(closed)
			}
		}))
}

// copyKeys are the (namespace, cluster) keys of the events a consumer's
// copy holds.
func copyKeys(t *testing.T, nc *nats.Conn, cfg config.Bus) (map[string]bool, error) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	s, err := js.Stream(ctxT(t), cfg.Stream.Name)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	info := s.CachedInfo()
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctxT(t), seq)
		if err != nil {
			return nil, err
		}
		e, err := events.Decode(m.Data)
		if err != nil {
			return nil, err
		}
		out[e.Data.Namespace+"/"+e.Data.Cluster] = true
	}
	return out, nil
}

// TestConsumersSignInWithTheirKeys: an application of bus.consumers signs
// in with its NKey, reads the events of its namespaces only, and changes
// to bus.consumers apply without a restart: a new consumer can sign in, a
// replaced key cannot and its connection is closed, a removed consumer
// loses its connections and copies.
func TestConsumersSignInWithTheirKeys(t *testing.T) {
	a1, a2, bk := newConsumerKey(t), newConsumerKey(t), newConsumerKey(t)
	cfg := busConfig(t)
	cfg.Consumers = []config.BusConsumer{{Name: "app-a", NKeys: []string{a1.pub}, Namespaces: []string{"team-a"}}}
	b, _ := newBus(t, cfg)
	start(t, b, nil)
	for _, c := range []stream.Change{
		streamtest.Profile(stream.ProfileCreated, "team-a", "c1", "1"),
		streamtest.Profile(stream.ProfileCreated, "team-b", "c2", "1"),
	} {
		b.Notify(c)
	}
	flush(t, b)

	closedA1 := make(chan struct{})
	ncA1, err := a1.dial(b.ClientURL(), closedA1)
	if err != nil {
		t.Fatalf("app-a signs in: %v", err)
	}
	defer ncA1.Close()
	eventually(t, "app-a's copy of team-a's events", func() bool {
		keys, err := copyKeys(t, ncA1, cfg)
		return err == nil && len(keys) == 1 && keys["team-a/c1"]
	})
	if _, err := bk.dial(b.ClientURL(), nil); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("an unknown key signs in: %v", err)
	}

	// app-a's key replaced, app-b added: applied without a restart.
	next := []config.BusConsumer{
		{Name: "app-a", NKeys: []string{a2.pub}, Namespaces: []string{"team-a"}},
		{Name: "app-b", NKeys: []string{bk.pub}},
	}
	if err := b.SetConsumers(ctxT(t), next); err != nil {
		t.Fatal(err)
	}
	select {
	case <-closedA1:
	case <-time.After(5 * time.Second):
		t.Fatal("the connection of app-a's replaced key stays open")
	}
	if _, err := a1.dial(b.ClientURL(), nil); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("app-a's replaced key signs in: %v", err)
	}
	ncA2, err := a2.dial(b.ClientURL(), nil)
	if err != nil {
		t.Fatalf("app-a's new key: %v", err)
	}
	defer ncA2.Close()
	closedB := make(chan struct{})
	ncB, err := bk.dial(b.ClientURL(), closedB)
	if err != nil {
		t.Fatalf("app-b signs in: %v", err)
	}
	defer ncB.Close()
	testutil.Eventually(t, 40*time.Second, 100*time.Millisecond, func() bool {
		keys, err := copyKeys(t, ncB, cfg)
		if err != nil || len(keys) != 2 {
			t.Logf("app-b: %v %v; copies %+v", keys, err, b.Copies(ctxT(t)))
		}
		return err == nil && len(keys) == 2
	}, "app-b's copy of every namespace's events")

	// app-b removed: its connection closed, its copies deleted.
	if err := b.SetConsumers(ctxT(t), next[:1]); err != nil {
		t.Fatal(err)
	}
	select {
	case <-closedB:
	case <-time.After(5 * time.Second):
		t.Fatal("the connection of a removed consumer stays open")
	}
	if _, err := bk.dial(b.ClientURL(), nil); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("a removed consumer signs in: %v", err)
	}
	for _, st := range b.Copies(ctxT(t)) {
		if st.Consumer == "app-b" {
			t.Errorf("the removed consumer's copies are still reported: %+v", st)
		}
	}
	// hubsync keeps publishing, and app-a keeps reading.
	b.Notify(streamtest.Profile(stream.ProfileCreated, "team-a", "c3", "1"))
	flush(t, b)
	eventually(t, "app-a reads the new event", func() bool {
		keys, err := copyKeys(t, ncA2, cfg)
		return err == nil && keys["team-a/c3"] && !keys["team-b/c2"]
	})
	if got := fmt.Sprint(len(b.Copies(ctxT(t)))); got != "2" {
		t.Errorf("%s consumers' copies, want 2 (local and app-a)", got)
	}
}
