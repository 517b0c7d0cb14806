package bus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// provisionRetry is how long the bus waits before it tries again to make
// the copies of a consumer account that it could not make.
const provisionRetry = 30 * time.Second

// provision makes or updates the copies of every consumer account of the
// embedded server (layout.go), each through an in-process connection as
// that account's provisioning user, once the writer's stream and bucket
// exist. A failure is logged and tried again after provisionRetry, at
// the next delivery or resync; publishing goes on meanwhile, and a copy
// made later catches up from the start of the writer's stream.
func (b *Bus) provision(ctx context.Context, primary jetstream.StreamConfig) {
	b.mu.Lock()
	srv, auth := b.srv, b.auth
	b.mu.Unlock()
	if srv == nil || auth == nil {
		return
	}
	l := layoutOf(b.cfg)
	var errs []error
	for _, c := range l.Consumers {
		if err := provisionOne(ctx, b, l, c, primary); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		b.provisionAt = time.Now().Add(provisionRetry)
		b.log.Warn("cannot make the copies of every consumer account; trying again", "err", err, "in", provisionRetry)
		return
	}
	b.provisionAt = time.Time{}
	b.provisioned = true
}

func provisionOne(ctx context.Context, b *Bus, l Layout, c ConsumerAccess, primary jetstream.StreamConfig) error {
	nc, err := nats.Connect("", nats.InProcessServer(b.srv), nats.Name("hubsync-provisioner"),
		nats.UserInfo(provisionerUser+c.Name, b.auth.provisionerPassword(c.Name)))
	if err != nil {
		return fmt.Errorf("consumer %s: connect: %w", c.Name, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("consumer %s: %w", c.Name, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return l.Provision(ctx, js, c, primary)
}

// CopyState is how far a consumer account's copies are, for health and
// status: how many events and records each holds, and how many the
// server last counted as still to come from hubsync's stream and bucket.
type CopyState struct {
	Consumer string
	// Events and Records are the messages of the events copy and the keys
	// of the records copy.
	Events, Records uint64
	// EventsLag and RecordsLag are the server's last count of the
	// messages still to come: it is updated as messages arrive, so it
	// can read 0 for a moment after hubsync published.
	EventsLag, RecordsLag uint64
	// Err is why the copies could not be read (not made yet, say).
	Err error
}

// Copies reports the copies of every consumer account of the embedded
// server; nil for an external NATS.
func (b *Bus) Copies(ctx context.Context) []CopyState {
	b.mu.Lock()
	srv, auth := b.srv, b.auth
	b.mu.Unlock()
	if srv == nil || auth == nil {
		return nil
	}
	l := layoutOf(b.cfg)
	out := make([]CopyState, 0, len(l.Consumers))
	for _, c := range l.Consumers {
		st := CopyState{Consumer: c.Name}
		st.Err = b.readCopies(ctx, l, c, &st)
		out = append(out, st)
	}
	return out
}

func (b *Bus) readCopies(ctx context.Context, l Layout, c ConsumerAccess, st *CopyState) error {
	nc, err := nats.Connect("", nats.InProcessServer(b.srv), nats.Name("hubsync-provisioner"),
		nats.UserInfo(provisionerUser+c.Name, b.auth.provisionerPassword(c.Name)))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ev, err := js.Stream(ctx, l.Stream)
	if err != nil {
		return fmt.Errorf("events copy: %w", err)
	}
	info := ev.CachedInfo()
	st.Events = info.State.Msgs
	for _, s := range info.Sources {
		st.EventsLag += s.Lag
	}
	kv, err := js.Stream(ctx, l.kvStream())
	if err != nil {
		return fmt.Errorf("records copy: %w", err)
	}
	info = kv.CachedInfo()
	st.Records = info.State.NumSubjects
	if info.Mirror != nil {
		st.RecordsLag = info.Mirror.Lag
	}
	return nil
}
