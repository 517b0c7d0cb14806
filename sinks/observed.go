package sinks

import (
	"context"
	"time"
)

// Observed is a sink's last look at the objects it keeps on the hub, which
// the sink keeps up to date with its own writes and reuses for MaxAge: a
// burst of deliveries costs one look every MaxAge rather than one per
// batch. A sink forgets it after a failure and before a resync, so that
// those look afresh; an object created meanwhile under a name the sink
// writes is found by the create that fails. The zero value holds nothing.
type Observed[T any] struct {
	MaxAge time.Duration
	cur    T
	at     time.Time
	ok     bool
}

// Get returns the last look, looking again with look when there is none
// or it is MaxAge old; now is the sink's clock, and the age counts from
// when the look returned.
func (o *Observed[T]) Get(ctx context.Context, now func() time.Time, look func(context.Context) (T, error)) (T, error) {
	if o.ok && now().Sub(o.at) < o.MaxAge {
		return o.cur, nil
	}
	cur, err := look(ctx)
	if err != nil {
		var zero T
		return zero, err
	}
	o.cur, o.at, o.ok = cur, now(), true
	return cur, nil
}

// Current returns the last look, if there is one, for a write to update.
func (o *Observed[T]) Current() (T, bool) { return o.cur, o.ok }

// Forget drops the last look: the next Get looks afresh.
func (o *Observed[T]) Forget() {
	var zero T
	o.cur, o.ok = zero, false
}
