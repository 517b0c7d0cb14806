package sinks

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/hubsync/hubsync/config"
	"github.com/hubsync/hubsync/stream"
)

// slowSink is a sink whose Close waits until the test releases it, as a
// sink flushing a spool or a connection would.
type slowSink struct {
	closing chan struct{} // closed when Close begins
	release chan struct{}
}

func (s *slowSink) Deliver(context.Context, []stream.Change) error { return nil }
func (s *slowSink) Resync(context.Context, []stream.Change) error  { return nil }
func (s *slowSink) Close() error {
	close(s.closing)
	<-s.release
	return nil
}

// TestManagerHoldsNoLockWhileSinksStop: while Apply waits for a removed
// sink to close, Names answers, and a Close that comes meanwhile closes
// the sink that Apply was building instead of leaving it running.
func TestManagerHoldsNoLockWhileSinksStop(t *testing.T) {
	_, fan := startedFanout(t)
	slow := &slowSink{closing: make(chan struct{}), release: make(chan struct{})}
	var fresh *fakeSink
	factory := func(cfg config.Sink, _ Deps) (Sink, error) {
		if cfg.Name == "slow" {
			return slow, nil
		}
		fresh = &fakeSink{name: cfg.Name}
		return fresh, nil
	}
	m := NewManager(fan, Deps{Log: slog.New(slog.DiscardHandler)}, map[string]Factory{config.SinkWebhook: factory})
	hook := func(name string) config.Sink {
		return defaulted(config.Sink{Name: name, Type: config.SinkWebhook, Webhook: &config.WebhookSink{URL: "https://" + name}})
	}
	if _, err := m.Apply([]config.Sink{hook("slow")}); err != nil {
		t.Fatal(err)
	}

	applied := make(chan error, 1)
	go func() {
		_, err := m.Apply([]config.Sink{hook("fresh")})
		applied <- err
	}()
	<-slow.closing // Apply is stopping the slow sink
	named := make(chan []string, 1)
	go func() { named <- m.Names() }()
	select {
	case names := <-named:
		if len(names) != 0 {
			t.Errorf("Names = %v while the only sink stops, want none", names)
		}
	case <-time.After(5 * time.Second):
		t.Error("Names waited for a sink to close")
	}
	closed := make(chan error, 1)
	go func() { closed <- m.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Error("Close waited for Apply's sink to close")
	}
	close(slow.release)
	if err := <-applied; !errors.Is(err, errClosed) {
		t.Errorf("Apply across a Close: %v, want %v", err, errClosed)
	}
	if fresh == nil || !fresh.closed || fan.Has("fresh") || !slices.Equal(m.Names(), nil) {
		t.Errorf("the sink built while the manager closed is still running")
	}
	if _, err := m.Apply([]config.Sink{hook("late")}); !errors.Is(err, errClosed) {
		t.Errorf("Apply after Close: %v, want %v", err, errClosed)
	}
}
