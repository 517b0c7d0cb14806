// Package bustest holds what tests of hubsync's bus share: the ways an
// application's credential may try to write, erase or spy on the bus, run
// against an in-process server by the bus package's tests and against
// real hubsync processes by the outage tests.
package bustest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Names are the bus's names an attack aims at.
type Names struct {
	Prefix, Stream, Bucket string
	// Namespace is one the application reads.
	Namespace string
}

// Errors collects a connection's asynchronous errors (the server's
// permissions violations): pass Handler to nats.Connect.
type Errors chan error

// NewErrors returns a collector.
func NewErrors() Errors { return make(Errors, 256) }

// Handler is the connection's error handler.
func (e Errors) Handler() nats.Option {
	return nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case e <- err:
		default:
		}
	})
}

// violation waits up to a few seconds for the server's permissions
// violation naming subject.
func (e Errors) violation(subject string) bool {
	timeout := time.After(5 * time.Second)
	for {
		select {
		case err := <-e:
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), `"`+subject+`"`) {
				return true
			}
		case <-timeout:
			return false
		}
	}
}

// Attack tries, as the application connected with nc (whose errors go to
// errs), every way to write to the bus or erase from it: publishing
// events, records and JetStream API requests that purge, delete or
// update the streams; subscribing to the events' subjects, other
// deliveries and acknowledgements; and push consumers whose deliveries,
// idle heartbeats and flow control would land on the JetStream API, the
// events' subjects or the imported API. It returns what the server
// allowed; empty when it refused everything. The caller checks that the
// stream and bucket are as they were.
func Attack(ctx context.Context, nc *nats.Conn, errs Errors, n Names) []string {
	var allowed []string
	kvStream := "KV_" + n.Bucket
	for _, subject := range []string{
		n.Prefix + "." + n.Namespace + ".planted.profile",
		"$KV." + n.Bucket + "." + n.Namespace + ".planted",
		"$JS.API.STREAM.PURGE." + n.Stream,
		"$JS.API.STREAM.DELETE." + n.Stream,
		"$JS.API.STREAM.DELETE." + kvStream,
		"$JS.API.STREAM.PURGE." + kvStream,
		"$JS.API.STREAM.MSG.DELETE." + n.Stream,
		"$JS.API.STREAM.UPDATE." + n.Stream,
		"$JS.API.STREAM.CREATE.MINE",
		"$JS.API.CONSUMER.CREATE." + kvStream,
		"$JS.API.CONSUMER.CREATE." + kvStream + ".x.$KV." + n.Bucket + ".>",
		"$JS.hubsync.API.CONSUMER.CREATE." + n.Stream + ".x." + n.Prefix + ".>",
		"_HUBSYNC_DELIVER.x",
	} {
		if err := nc.Publish(subject, []byte(`{}`)); err != nil {
			return append(allowed, fmt.Sprintf("publish to %s: %v", subject, err))
		}
		if !errs.violation(subject) {
			allowed = append(allowed, "publish to "+subject)
		}
	}
	for _, subject := range []string{n.Prefix + ".>", "_HUBSYNC_DELIVER.>", "$JS.ACK.>"} {
		sub, err := nc.SubscribeSync(subject)
		if err != nil {
			return append(allowed, fmt.Sprintf("subscribe to %s: %v", subject, err))
		}
		if !errs.violation(subject) {
			allowed = append(allowed, "subscribe to "+subject)
		}
		_ = sub.Unsubscribe()
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return append(allowed, fmt.Sprintf("JetStream: %v", err))
	}
	s, err := js.Stream(ctx, n.Stream)
	if err != nil {
		return append(allowed, fmt.Sprintf("the application's copy of %s: %v", n.Stream, err))
	}
	for _, deliver := range []string{
		"$JS.API.STREAM.PURGE." + n.Stream,
		"$JS.API.STREAM.DELETE." + kvStream,
		n.Prefix + "." + n.Namespace + ".planted.profile",
		"$JS.hubsync.API.CONSUMER.CREATE." + n.Stream,
	} {
		c, err := s.CreateOrUpdatePushConsumer(ctx, jetstream.ConsumerConfig{
			DeliverSubject: deliver, DeliverPolicy: jetstream.DeliverAllPolicy, AckPolicy: jetstream.AckNonePolicy,
			IdleHeartbeat: 100 * time.Millisecond, FlowControl: true,
		})
		if err == nil {
			allowed = append(allowed, "a push consumer delivering to "+deliver)
			_ = s.DeleteConsumer(ctx, c.CachedInfo().Name)
		}
	}
	// Delivered where nothing in the account listens (the records' copy
	// has no subjects): allowed, and never active. Heartbeats every
	// 100ms: wait for several.
	toKV, err := s.CreateOrUpdatePushConsumer(ctx, jetstream.ConsumerConfig{
		DeliverSubject: "$KV." + n.Bucket + "." + n.Namespace + ".planted", DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy: jetstream.AckNonePolicy, IdleHeartbeat: 100 * time.Millisecond,
	})
	if err != nil {
		return append(allowed, fmt.Sprintf("a push consumer delivering to the records' subjects: %v", err))
	}
	defer func() { _ = s.DeleteConsumer(context.WithoutCancel(ctx), toKV.CachedInfo().Name) }()
	select {
	case <-ctx.Done():
	case <-time.After(time.Second):
	}
	if info, err := toKV.Info(ctx); err != nil || info.PushBound || info.Delivered.Consumer != 0 {
		allowed = append(allowed, fmt.Sprintf("a push consumer delivering to the records' subjects has a listener: %+v, %v", info, err))
	}
	return allowed
}
