package sinks

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestRegister(t *testing.T) {
	newVec := func(name string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: "h"}, []string{"sink"})
	}
	tests := []struct {
		name string
		// first is registered before, if set.
		first   prometheus.Collector
		c       *prometheus.GaugeVec
		nilReg  bool
		reuse   bool // want first back
		wantErr bool
	}{
		{name: "new", c: newVec("a")},
		{name: "no registry", c: newVec("a"), nilReg: true},
		{name: "a second sink reuses the first one's", first: newVec("a"), c: newVec("a"), reuse: true},
		{name: "same name, other labels", first: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "a", Help: "h"}, []string{"other"}),
			c: newVec("a"), wantErr: true},
		{name: "same name, other type", first: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "a", Help: "h"}, []string{"sink"}),
			c: newVec("a"), wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			if tt.first != nil {
				reg.MustRegister(tt.first)
			}
			var r prometheus.Registerer = reg
			if tt.nilReg {
				r = nil
			}
			got, err := Register(r, tt.c)
			if (err != nil) != tt.wantErr {
				t.Fatalf("Register: %v, want error %v", err, tt.wantErr)
			}
			if tt.wantErr {
				return
			}
			want := tt.c
			if tt.reuse {
				want = tt.first.(*prometheus.GaugeVec)
			}
			if got != want {
				t.Errorf("Register returned another collector than %s", map[bool]string{true: "the one registered before", false: "its argument"}[tt.reuse])
			}
			// What it returns is what the registry collects.
			got.WithLabelValues("s").Set(7)
			n, _ := reg.Gather()
			if collected := len(n) == 1; collected == tt.nilReg {
				t.Errorf("registry gathers %d families, registry given: %v", len(n), !tt.nilReg)
			}
		})
	}
}
