// Package rotations follows hubsync's credential events on NATS and
// refreshes an access.Source as soon as a copy it serves gets a new token.
//
// A Source follows the copies with an informer already; the event is a
// second, independent signal, for consumers that read hubsync's events
// anyway: it arrives when hubsync wrote the copy, whatever the informer's
// lag. It is kept out of package access so that a consumer without NATS
// does not link nats.go.
package rotations

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go"

	"github.com/hubsync/hubsync/access"
	"github.com/hubsync/hubsync/events"
	"github.com/hubsync/hubsync/stream"
)

// queueLength is how many events wait for Follow before NATS drops the
// next ones (a missed event only leaves the refresh to the informer).
const queueLength = 256

// Subject is the NATS subject of the credential events of namespace:
// "<prefix>.<namespace>.*.credential", prefix being hubsync's
// bus.subjectPrefix ("hubsync" unless configured).
func Subject(prefix, namespace string) string {
	return prefix + "." + events.EscapeToken(namespace) + ".*.credential"
}

// Follow reads on nc the credential events of src's namespace from now on,
// through an ordered JetStream consumer of the stream that holds them, and,
// for each io.hubsync.credential.rotated event of src's
// ManagedServiceAccount, refreshes the cluster's copy in src (unless src
// holds the new token already). It blocks until ctx ends, then
// unsubscribes and returns nil; it returns an error if it cannot
// subscribe. log receives events it could not use and failed refreshes
// (nil: discarded); events carry no token.
func Follow(ctx context.Context, nc *nats.Conn, src *access.Source, prefix string, log *slog.Logger) error {
	if prefix == "" {
		return errors.New("rotations: the subject prefix is required (hubsync's bus.subjectPrefix, \"hubsync\" unless configured)")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	msgs := make(chan *nats.Msg, queueLength)
	subject := Subject(prefix, src.Namespace())
	js, err := nc.JetStream()
	if err != nil {
		return fmt.Errorf("rotations: %w", err)
	}
	// New events, through an ordered consumer of the stream that holds the
	// subject: a consumer of hubsync's bus reads a copy in an account of
	// its own, where the events are stored but not published.
	sub, err := js.Subscribe(subject, func(m *nats.Msg) {
		select {
		case msgs <- m:
		default: // a missed event leaves the refresh to the informer
		}
	}, nats.OrderedConsumer(), nats.DeliverNew())
	if err != nil {
		return fmt.Errorf("rotations: subscribe to %s: %w", subject, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-msgs:
			handle(ctx, src, m.Data, log)
		}
	}
}

// handle refreshes src for one event, if it is a rotation of one of its
// copies.
func handle(ctx context.Context, src *access.Source, data []byte, log *slog.Logger) {
	e, err := events.Decode(data)
	if err != nil {
		log.Info("ignoring a message that is not a hubsync event", "err", err)
		return
	}
	c := e.Data.Credential
	if e.Type != stream.CredentialRotated || c == nil || e.Data.Namespace != src.Namespace() ||
		c.ManagedServiceAccount != src.ManagedServiceAccount() {
		return
	}
	if err := src.Refresh(ctx, e.Data.Cluster, c.Fingerprint); err != nil && ctx.Err() == nil {
		log.Info("refreshing a rotated credential copy failed", "cluster", e.Data.Cluster, "secret", c.Secret, "err", err)
	}
}
