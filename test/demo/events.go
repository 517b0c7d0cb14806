package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// eventTail subscribes to hubsync's event subjects on its NATS and prints
// what arrived since the last call, as a consumer of the bus sees it.
type eventTail struct {
	nc *nats.Conn
	mu sync.Mutex
	ev []string
	n  int
}

func tailEvents(url string) (*eventTail, error) {
	var nc *nats.Conn
	var err error
	for range 100 {
		if nc, err = nats.Connect(url); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		return nil, fmt.Errorf("connect to hubsync's NATS at %s: %w", url, err)
	}
	t := &eventTail{nc: nc}
	js, err := nc.JetStream()
	if err != nil {
		return nil, err
	}
	handle := func(m *nats.Msg) {
		var e struct {
			Type    string `json:"type"`
			Subject string `json:"subject"`
			Data    struct {
				Profile *struct {
					Healthy string `json:"healthy"`
				} `json:"profile"`
				Credential *struct {
					Secret      string `json:"secret"`
					Fingerprint string `json:"fingerprint"`
				} `json:"credential"`
				Tunnel *struct {
					Reason      string  `json:"reason"`
					ProbeMillis float64 `json:"probeMillis"`
				} `json:"tunnel"`
			} `json:"data"`
		}
		if json.Unmarshal(m.Data, &e) != nil {
			return
		}
		line := fmt.Sprintf("%-28s %-28s", strings.TrimPrefix(e.Type, "io.hubsync."), e.Subject)
		switch {
		case e.Data.Tunnel != nil && e.Data.Tunnel.Reason != "":
			line += " reason=" + e.Data.Tunnel.Reason
		case e.Data.Tunnel != nil:
			line += fmt.Sprintf(" probe=%.1fms", e.Data.Tunnel.ProbeMillis)
		case e.Data.Credential != nil:
			line += fmt.Sprintf(" secret=%s fp=%s", e.Data.Credential.Secret, e.Data.Credential.Fingerprint)
		case e.Data.Profile != nil && e.Data.Profile.Healthy != "":
			line += " healthy=" + e.Data.Profile.Healthy
		}
		t.mu.Lock()
		t.ev = append(t.ev, line)
		t.n++
		t.mu.Unlock()
	}
	// As a consumer follows the bus (nats sub 'hubsync.>' --new): an
	// ordered consumer of its copy of the stream, which exists once
	// hubsync has made it.
	for range 200 {
		if _, err = js.Subscribe("hubsync.>", handle, nats.OrderedConsumer(), nats.DeliverNew()); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		return nil, fmt.Errorf("follow hubsync's events at %s: %w", url, err)
	}
	return t, nil
}

// flush prints the events received since the last flush (at most max,
// then a count), after a moment for stragglers.
func (t *eventTail) flush(max int) {
	time.Sleep(150 * time.Millisecond)
	t.mu.Lock()
	ev := t.ev
	t.ev = nil
	t.mu.Unlock()
	for i, l := range ev {
		if i == max {
			fmt.Printf("   event: ... and %d more\n", len(ev)-max)
			break
		}
		fmt.Println("   event: " + l)
	}
}

// skip drops what arrived so far and returns how many events that was.
func (t *eventTail) skip() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(t.ev)
	t.ev = nil
	return n
}

func (t *eventTail) close() { t.nc.Close() }
