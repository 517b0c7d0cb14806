package config

import (
	"reflect"
	"strings"
)

// Reloadable lists the top-level fields a running hubsync applies from an
// edited file without a restart.
var Reloadable = []string{"sinks"}

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
		if !reflect.DeepEqual(a.Field(i).Interface(), b.Field(i).Interface()) {
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
