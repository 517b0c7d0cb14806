package layout

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/hubsync/hubsync/test/tools/configschema/valuesschema"
)

// TestValuesSchemaCurrent fails when the chart's values.schema.json does
// not carry, as properties.config, the schema that package config's types
// and doc comments give now: a field added, renamed or retyped, an enum or
// a range changed, a comment edited, without make schema.
func TestValuesSchemaCurrent(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", valuesschema.Path))
	if errors.Is(err, fs.ErrNotExist) {
		t.Skipf("%s does not exist: once the chart is there, run make schema", valuesschema.Path)
	}
	if err != nil {
		t.Fatal(err)
	}
	got, err := valuesschema.ConfigOf(data)
	if err != nil {
		t.Fatalf("%s: %v", valuesschema.Path, err)
	}
	cfg, err := valuesschema.ConfigSchema(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	var want any
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	if diff := differences(got, want, "config"); len(diff) > 0 {
		t.Errorf("%s: properties.config is not the schema of package config as it is now; run make schema. Differences:\n  %s",
			valuesschema.Path, strings.Join(diff, "\n  "))
	}

	// Helm compiles the whole file before it validates values with it.
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("file:///values.schema.json", doc); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Compile("file:///values.schema.json"); err != nil {
		t.Errorf("%s does not compile: %v", valuesschema.Path, err)
	}
}

// differences lists where two decoded JSON documents differ, at most ten.
func differences(got, want any, path string) []string {
	var out []string
	var walk func(got, want any, path string)
	walk = func(got, want any, path string) {
		if len(out) >= 10 || reflect.DeepEqual(got, want) {
			return
		}
		g, gok := got.(map[string]any)
		w, wok := want.(map[string]any)
		if !gok || !wok {
			out = append(out, fmt.Sprintf("%s: have %s, want %s", path, short(got), short(want)))
			return
		}
		keys := map[string]bool{}
		for k := range g {
			keys[k] = true
		}
		for k := range w {
			keys[k] = true
		}
		for _, k := range slices.Sorted(maps.Keys(keys)) {
			walk(g[k], w[k], path+"."+k)
		}
	}
	walk(got, want, path)
	return out
}

func short(v any) string {
	if v == nil {
		return "nothing"
	}
	b, _ := json.Marshal(v)
	if len(b) > 80 {
		return string(b[:77]) + "..."
	}
	return string(b)
}

// TestConfigSchemaDescriptions: the generator gives each field its doc
// comment, the fields a comment names after it share that comment, and a
// section without a comment of its own has its type's. Every field of the
// configuration has a description, so a new field needs a doc comment.
func TestConfigSchemaDescriptions(t *testing.T) {
	cfg, err := valuesschema.ConfigSchema(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	var walk func(s map[string]any, path string)
	walk = func(s map[string]any, path string) {
		if items, ok := s["items"].(map[string]any); ok {
			walk(items, strings.TrimSuffix(path, ".")+"[].")
		}
		props, _ := s["properties"].(map[string]any)
		for _, name := range slices.Sorted(maps.Keys(props)) {
			p := props[name].(map[string]any)
			if _, ok := p["description"]; !ok {
				t.Errorf("config field %s%s has no description: give it a doc comment (then make schema)", path, name)
			}
			// A label selector's own fields are Kubernetes'.
			if name != "clusterSelector" {
				walk(p, path+name+".")
			}
		}
	}
	walk(cfg, "")

	for _, c := range []struct {
		path []string
		want string
	}{
		{[]string{"bus", "batchWindow"}, "BatchWindow is how long the publisher waits"},
		{[]string{"hub", "burst"}, "QPS and Burst bound the client's request rate."},
		{[]string{"tunnel", "konnectivity", "keyFile"}, "CAFile verifies the proxy-server; CertFile and KeyFile"},
		{[]string{"sinks", "[]", "webhook", "spool"}, "Spool keeps undelivered events on disk"},
		{[]string{"bus", "embedded", "tls"}, "TLS serves consumers over TLS"},
		{[]string{"sinks", "[]", "kubeconfig", "exec"}, "ExecAuth is the exec credential plugin"},
		{nil, "Config is the whole configuration file."},
	} {
		s := cfg
		for _, p := range c.path {
			if p == "[]" {
				s = s["items"].(map[string]any)
				continue
			}
			s = s["properties"].(map[string]any)[p].(map[string]any)
		}
		if d, _ := s["description"].(string); !strings.HasPrefix(d, c.want) {
			t.Errorf("%s: description %q; want it to start with %q", strings.Join(c.path, "."), d, c.want)
		}
	}
}

// TestValuesSchemaUpdate: make schema replaces properties.config and keeps
// the chart's other properties as they are; a missing file becomes a
// draft-07 object schema holding config alone; the output is formatted one
// way (keys sorted, two-space indent, a final newline), so that running it
// twice changes nothing.
func TestValuesSchemaUpdate(t *testing.T) {
	cfg := map[string]any{"type": "object", "properties": map[string]any{"hub": map[string]any{"type": "object"}}}
	chart := `{"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "additionalProperties": false,
"properties": {"replicas": {"type": "integer", "minimum": 1}, "config": {"type": "object"}, "image": {"type": "object", "properties": {"tag": {"type": "string"}}}}}`
	tests := []struct {
		name     string
		existing []byte
		want     string
	}{
		{name: "no file yet", want: `{
  "$schema": "http://json-schema.org/draft-07/schema#",
  "properties": {
    "config": {
      "properties": {
        "hub": {
          "type": "object"
        }
      },
      "type": "object"
    }
  },
  "type": "object"
}
`},
		{name: "the chart's file", existing: []byte(chart), want: `{
  "$schema": "http://json-schema.org/draft-07/schema#",
  "additionalProperties": false,
  "properties": {
    "config": {
      "properties": {
        "hub": {
          "type": "object"
        }
      },
      "type": "object"
    },
    "image": {
      "properties": {
        "tag": {
          "type": "string"
        }
      },
      "type": "object"
    },
    "replicas": {
      "minimum": 1,
      "type": "integer"
    }
  },
  "type": "object"
}
`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := valuesschema.Update(tt.existing, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Errorf("Update:\n%s\nwant:\n%s", got, tt.want)
			}
			again, err := valuesschema.Update(got, cfg)
			if err != nil || !bytes.Equal(again, got) {
				t.Errorf("a second Update changes the file (%v):\n%s", err, again)
			}
		})
	}
	if _, err := valuesschema.Update([]byte("null"), cfg); err == nil {
		t.Error("Update accepts a values schema that is not an object")
	}
}
