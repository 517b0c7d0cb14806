package sinks

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers c on reg, or returns the collector already registered
// there under the same description. Every sink of a type makes its own
// collectors, but their series share one metric name, labelled by sink:
// the first sink of the type registers them and the others, and a sink
// made again by a configuration reload, reuse its collectors. A nil reg
// returns c, which nothing collects.
func Register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if reg == nil {
		return c, nil
	}
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, fmt.Errorf("register metrics: %w", err)
}
