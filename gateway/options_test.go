package gateway

import (
	"strings"
	"testing"
	"time"

	"github.com/hubsync/hubsync/config"
)

// configured fills the options a test leaves zero from hubsync's
// configuration defaults, as the daemon does with OptionsFor.
func configured(o Options) Options {
	d := OptionsFor(config.Default().Gateway)
	fill := func(p *time.Duration, v time.Duration) {
		if *p == 0 {
			*p = v
		}
	}
	fill(&o.ReviewCacheTTL, d.ReviewCacheTTL)
	fill(&o.RefusalCacheTTL, d.RefusalCacheTTL)
	fill(&o.KeyRefresh, d.KeyRefresh)
	fill(&o.KeyMinRefetch, d.KeyMinRefetch)
	fill(&o.BodyTimeout, d.BodyTimeout)
	fill(&o.RetryAfter, d.RetryAfter)
	fill(&o.TunnelWait, d.TunnelWait)
	if o.ReviewCacheSize == 0 {
		o.ReviewCacheSize = d.ReviewCacheSize
	}
	if o.MaxInFlightReviews == 0 {
		o.MaxInFlightReviews = d.MaxInFlightReviews
	}
	if o.RefusalsPerSecond == 0 {
		o.RefusalsPerSecond = d.RefusalsPerSecond
	}
	if o.RefusalBurst == 0 {
		o.RefusalBurst = d.RefusalBurst
	}
	return o
}

// TestNewRefusesUnfilledOptions: the gateway has no defaults of its own
// (config holds them), so a limit or timeout left zero is refused by name
// rather than run as a cache of nothing or a body read without deadline.
func TestNewRefusesUnfilledOptions(t *testing.T) {
	w := newWorld(t)
	tests := []struct {
		name    string
		tune    func(*Options)
		wantErr string // empty: accepted
	}{
		{name: "filled from the configuration", tune: func(*Options) {}},
		{name: "no review TTL", tune: func(o *Options) { o.ReviewCacheTTL = 0 }, wantErr: "ReviewCacheTTL"},
		{name: "no cache size", tune: func(o *Options) { o.ReviewCacheSize = 0 }, wantErr: "ReviewCacheSize"},
		{name: "no bound on reviews", tune: func(o *Options) { o.MaxInFlightReviews = 0 }, wantErr: "MaxInFlightReviews"},
		{name: "no refusal TTL", tune: func(o *Options) { o.RefusalCacheTTL = 0 }, wantErr: "RefusalCacheTTL"},
		{name: "no refusal rate", tune: func(o *Options) { o.RefusalsPerSecond = 0 }, wantErr: "RefusalsPerSecond"},
		{name: "no refusal burst", tune: func(o *Options) { o.RefusalBurst = 0 }, wantErr: "RefusalBurst"},
		{name: "no key refresh", tune: func(o *Options) { o.KeyRefresh = 0 }, wantErr: "KeyRefresh"},
		{name: "no key refetch bound", tune: func(o *Options) { o.KeyMinRefetch = 0 }, wantErr: "KeyMinRefetch"},
		{name: "no body timeout", tune: func(o *Options) { o.BodyTimeout = 0 }, wantErr: "BodyTimeout"},
		{name: "no Retry-After", tune: func(o *Options) { o.RetryAfter = 0 }, wantErr: "RetryAfter"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := OptionsFor(config.Default().Gateway)
			opts.Pool, opts.Reviewer, opts.HubKeys = w.pool(), w.reviewer(), w.hubKeys()
			tt.tune(&opts)
			_, err := New(opts)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("New() = %v; want it accepted", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("New() = %v; want an error naming %s", err, tt.wantErr)
			}
		})
	}
}

// TestServeRefusesUnfilledOptions: zero server limits would be Go's own,
// which bound no slow client, or a drain that cuts every request.
func TestServeRefusesUnfilledOptions(t *testing.T) {
	for _, name := range []string{"MaxHeaderBytes", "ReadHeaderTimeout", "IdleTimeout", "DrainTimeout"} {
		t.Run(name, func(t *testing.T) {
			o := ServerOptionsFor(config.Default().Gateway)
			o.Certs = &FileCert{}
			switch name {
			case "MaxHeaderBytes":
				o.MaxHeaderBytes = 0
			case "ReadHeaderTimeout":
				o.ReadHeaderTimeout = 0
			case "IdleTimeout":
				o.IdleTimeout = 0
			case "DrainTimeout":
				o.DrainTimeout = 0
			}
			err := Serve(t.Context(), nil, nil, o)
			if err == nil || !strings.Contains(err.Error(), name) {
				t.Fatalf("Serve() = %v; want an error naming %s", err, name)
			}
		})
	}
}

// TestCachedReviewerRefusesUnfilledOptions: a cache of nothing, or no
// bound on the hub's TokenReviews, is refused.
func TestCachedReviewerRefusesUnfilledOptions(t *testing.T) {
	_, err := NewCachedReviewer(&mapReviewer{}, ReviewCacheOptions{})
	for _, name := range []string{"TTL", "Size", "MaxInFlight"} {
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("NewCachedReviewer(no options) = %v; want an error naming %s", err, name)
		}
	}
}
