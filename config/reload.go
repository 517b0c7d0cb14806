package config

import (
	"reflect"
	"strings"
)

// Reloadable lists the fields a running hubsync applies from an edited
// file without a restart.
var Reloadable = []string{"sinks", "bus.consumers"}

// RestartNeeded returns the top-level fields (by their YAML names) that
// differ between the running configuration c and next and that take effect
// only after a restart.
func (c *Config) RestartNeeded(next *Config) []string {
	var out []string
	a, b := reflect.ValueOf(*c), reflect.ValueOf(*next)
	t := a.Type()
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name == "" || name == "-" || isReloadable(name) {
			continue
		}
		x, y := a.Field(i).Interface(), b.Field(i).Interface()
		if name == "bus" {
			// bus.consumers is reloadable; the rest of bus is not.
			xb, yb := x.(Bus), y.(Bus)
			xb.Consumers, yb.Consumers = nil, nil
			x, y = xb, yb
		}
		if !reflect.DeepEqual(x, y) {
			out = append(out, name)
		}
	}
	return out
}

func isReloadable(name string) bool {
	for _, r := range Reloadable {
		if r == name {
			return true
		}
	}
	return false
}
