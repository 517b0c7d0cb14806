package config

import (
	"strings"
	"testing"
)

// TestForeignWritersValidation: a hold-off that is not positive, or a cap
// below it, is refused with the field's path.
func TestForeignWritersValidation(t *testing.T) {
	tests := []struct {
		name, doc string
		wantPath  string // "" for valid
	}{
		{name: "defaults", doc: ""},
		{name: "shorter hold-off", doc: "foreignWriters: {holdOff: 2s, maxHoldOff: 4s}"},
		{name: "cap equal to the hold-off", doc: "foreignWriters: {holdOff: 1m, maxHoldOff: 1m}"},
		{name: "cap below the hold-off", doc: "foreignWriters: {holdOff: 1m, maxHoldOff: 30s}", wantPath: "foreignWriters.maxHoldOff"},
		{name: "cap below the default hold-off", doc: "foreignWriters: {maxHoldOff: 10s}", wantPath: "foreignWriters.maxHoldOff"},
		{name: "negative hold-off", doc: "foreignWriters: {holdOff: -1s}", wantPath: "foreignWriters.holdOff"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.doc))
			switch {
			case tt.wantPath == "" && err != nil:
				t.Errorf("Parse() error = %v; want none", err)
			case tt.wantPath != "" && (err == nil || !strings.Contains(err.Error(), tt.wantPath)):
				t.Errorf("Parse() error = %v; want one naming %s", err, tt.wantPath)
			}
		})
	}
}
