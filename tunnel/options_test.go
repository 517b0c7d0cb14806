package tunnel

import (
	"strings"
	"testing"

	"github.com/hubsync/hubsync/config"
)

// configOptions are the pool's options as hubsync fills them from its
// configuration's defaults.
func configOptions() Options {
	o := OptionsFor(config.Default().Tunnel)
	o.Dialer = &DirectDialer{}
	return o
}

// TestNewRefusesUnfilledOptions: the pool has no defaults of its own
// (config holds them), so an option left zero is refused by name rather
// than run as probes without a timeout or redials without a backoff.
func TestNewRefusesUnfilledOptions(t *testing.T) {
	tests := []struct {
		name    string
		tune    func(*Options)
		wantErr string // empty: accepted
	}{
		{name: "filled from the configuration", tune: func(*Options) {}},
		{name: "only the optional ones zero", tune: func(o *Options) { o.Transport, o.Notifier, o.Log, o.Registerer = "", nil, nil, nil }},
		{name: "no dialer", tune: func(o *Options) { o.Dialer = nil }, wantErr: "Dialer"},
		{name: "no probe path", tune: func(o *Options) { o.ProbePath = "" }, wantErr: "ProbePath"},
		{name: "no probe interval", tune: func(o *Options) { o.ProbeInterval = 0 }, wantErr: "ProbeInterval"},
		{name: "no probe timeout", tune: func(o *Options) { o.ProbeTimeout = 0 }, wantErr: "ProbeTimeout"},
		{name: "no dial timeout", tune: func(o *Options) { o.DialTimeout = 0 }, wantErr: "DialTimeout"},
		{name: "no backoff", tune: func(o *Options) { o.BackoffBase = 0 }, wantErr: "BackoffBase"},
		{name: "backoff capped below its start", tune: func(o *Options) { o.BackoffMax = o.BackoffBase / 2 }, wantErr: "BackoffMax"},
		{name: "no dial bound", tune: func(o *Options) { o.MaxDials = 0 }, wantErr: "MaxDials"},
		{name: "no upgrade dial bound", tune: func(o *Options) { o.MaxUpgradeDials = 0 }, wantErr: "MaxUpgradeDials"},
		{name: "no connections", tune: func(o *Options) { o.MaxConnsPerCluster = 0 }, wantErr: "MaxConnsPerCluster"},
		{name: "no retire grace", tune: func(o *Options) { o.RetireGrace = 0 }, wantErr: "RetireGrace"},
		{name: "no idle bound", tune: func(o *Options) { o.ExtraIdle = 0 }, wantErr: "ExtraIdle"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := configOptions()
			tt.tune(&opts)
			p, err := New(opts)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("New() = %v; want it accepted", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("New() = %v; want an error naming %s", err, tt.wantErr)
			}
			if p != nil {
				p.Close()
			}
		})
	}
}
