package config

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// ForeignWriters sets how hubsync backs off from an object that another
// controller (cluster-proxy's or managed-serviceaccount's ClusterProfile
// writers, OCM registration's ClusterProfile controller, left on by
// mistake) keeps writing too: once that writer has undone hubsync's write
// three times within a minute, hubsync leaves the object alone for HoldOff, then
// writes it again; each time the other writer undoes that write, the
// hold-off doubles, up to MaxHoldOff.
type ForeignWriters struct {
	// HoldOff is the first hold-off. Default 30s.
	HoldOff metav1.Duration `json:"holdOff,omitempty"`
	// MaxHoldOff caps the hold-off. Default 10m.
	MaxHoldOff metav1.Duration `json:"maxHoldOff,omitempty"`
}

func (f ForeignWriters) validate(p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if f.HoldOff.Duration <= 0 {
		errs = append(errs, field.Invalid(p.Child("holdOff"), f.HoldOff.Duration.String(), "must be positive"))
	}
	if f.MaxHoldOff.Duration < f.HoldOff.Duration {
		errs = append(errs, field.Invalid(p.Child("maxHoldOff"), f.MaxHoldOff.Duration.String(), "must be at least foreignWriters.holdOff"))
	}
	return errs
}
