package stream

import (
	"strings"
	"testing"
	"time"
)

// TestAddRefusesUnfilledOptions: the fan-out has no defaults of its own
// (config.ConsumerOptions holds them), so an option left zero is refused
// by name rather than run as a queue of nothing or a backoff that spins.
func TestAddRefusesUnfilledOptions(t *testing.T) {
	tests := []struct {
		name    string
		tune    func(*Options)
		wantErr string // empty: accepted
	}{
		{name: "filled", tune: func(*Options) {}},
		{name: "no queue size", tune: func(o *Options) { o.QueueSize = 0 }, wantErr: "QueueSize"},
		{name: "no batch size", tune: func(o *Options) { o.MaxBatch = 0 }, wantErr: "MaxBatch"},
		{name: "no backoff", tune: func(o *Options) { o.RetryBase = 0 }, wantErr: "RetryBase"},
		{name: "backoff capped below its start", tune: func(o *Options) { o.RetryMax = o.RetryBase / 2 }, wantErr: "RetryMax"},
		{name: "yield without a bound", tune: func(o *Options) { o.Yield = true }, wantErr: "YieldMax"},
		{name: "yield with a bound", tune: func(o *Options) { o.Yield, o.YieldMax = true, time.Minute }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, _ := newFanout(t, nil)
			opts := fast("c")
			tt.tune(&opts)
			err := f.Add(opts, &recorder{})
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("Add() = %v; want it accepted", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("Add() = %v; want an error naming %s", err, tt.wantErr)
			}
		})
	}
}
