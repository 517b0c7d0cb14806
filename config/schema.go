package config

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sigsjson "sigs.k8s.io/json"

	"github.com/hubsync/hubsync/stream"
)

// DurationPattern matches what time.ParseDuration accepts, as metav1.Duration
// fields take it: "0", or a sequence of decimal numbers each with a unit
// (ns, us, µs, ms, s, m, h), optionally signed, such as 1m30s or 1.5h.
const DurationPattern = `^[-+]?(0|((\d+(\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h))+)$`

// JSONSchemaDraft is the draft the schema follows (the one Helm v3
// validates values.schema.json with).
const JSONSchemaDraft = "http://json-schema.org/draft-07/schema#"

// choice is a fixed set of values validation accepts for a string field
// (for a list, for each of its entries).
type choice struct {
	values []string
	// emptyOK: an empty (or null) value is replaced by a default or means
	// "none", so validation accepts it too. Otherwise a field that is not a
	// list is required: leaving it out leaves it empty.
	emptyOK bool
	// when names a boolean field of the same section: validation checks
	// the value only while that field is true.
	when string
}

// bound is the range validation keeps an integer field in: never
// negative, and at most max unless max is 0. Zero, which defaulting
// replaces, is inside it.
type bound struct {
	max int64
}

// choices lists, by section type and JSON name, the fields validation
// checks against a fixed set, with the set it uses.
func choices() map[reflect.Type]map[string]choice {
	return map[reflect.Type]map[string]choice{
		reflect.TypeFor[Config](): {
			"apiVersion": {values: []string{APIVersion}, emptyOK: true},
			"kind":       {values: []string{Kind}, emptyOK: true},
		},
		reflect.TypeFor[Logging](): {
			"level":  {values: LogLevels, emptyOK: true},
			"format": {values: LogFormats, emptyOK: true},
		},
		reflect.TypeFor[AccessProvider](): {"type": {values: ProviderTypes, emptyOK: true}},
		reflect.TypeFor[Sink]():           {"type": {values: SinkTypes}},
		reflect.TypeFor[SinkFilter]():     {"eventTypes": {values: stream.Types}},
		reflect.TypeFor[KubeconfigSink](): {
			"auth":     {values: AuthModes, emptyOK: true},
			"consumer": {values: KubeconfigConsumers, emptyOK: true},
		},
		reflect.TypeFor[ArgoCDSink](): {
			"auth":       {values: AuthModes, emptyOK: true},
			"execPlugin": {values: ExecPlugins, emptyOK: true},
		},
		reflect.TypeFor[KueueSink](): {"source": {values: KueueSources, emptyOK: true}},
		reflect.TypeFor[Tunnel](): {
			"transport": {values: TunnelTransports, emptyOK: true},
			"warm":      {values: WarmModes, emptyOK: true},
		},
		reflect.TypeFor[Gateway](): {"passThrough": {values: PassThroughModes, emptyOK: true, when: "enabled"}},
	}
}

// bounds lists, by section type and JSON name, the integer fields
// validation keeps in a range whatever else the file says.
func bounds() map[reflect.Type]map[string]bound {
	return map[reflect.Type]map[string]bound{
		reflect.TypeFor[Hub]():         {"burst": {}},
		reflect.TypeFor[Workers]():     {"topology": {max: MaxWorkers}},
		reflect.TypeFor[Credentials](): {"workers": {max: MaxWorkers}},
		reflect.TypeFor[Bus]():         {"bufferSize": {}},
		reflect.TypeFor[BusStream]():   {"maxBytes": {}, "replicas": {max: MaxStreamReplicas}},
		reflect.TypeFor[Sink]():        {"queueSize": {}},
		reflect.TypeFor[WebhookSink](): {"concurrency": {max: MaxWebhookConcurrency}},
		reflect.TypeFor[Tunnel](): {
			"maxConcurrentDials":        {max: MaxTunnelDials},
			"maxConcurrentUpgradeDials": {max: MaxTunnelDials},
			"maxConnectionsPerCluster":  {max: MaxTunnelConnsPerCluster},
		},
	}
}

// JSONSchema returns the JSON Schema (draft-07) of the configuration file,
// derived from Config's types: every section is an object that refuses
// unknown keys, durations are Go duration strings, and the fields
// validation checks against a fixed set or keeps in a range carry that set
// or range. It is never stricter than Parse: what Parse accepts validates
// (null wherever the decoder ignores it, the empty value wherever a default
// replaces it). Rules across fields and the files the configuration names
// are left to Parse (hubsync check-config).
//
// Reflection cannot see comments: docs maps a section type's name ("Bus")
// and a field's ("Bus.BatchWindow") to its doc comment, which becomes the
// description; nil leaves descriptions out. A field of a type the schema
// cannot describe (an interface, a type that decodes itself other than
// metav1.Duration), or an enum or range naming a field that does not
// exist, panics: the types are fixed at build time and the tests derive
// the schema.
func JSONSchema(docs map[string]string) map[string]any {
	g := schemaGen{
		docs: docs, pkg: reflect.TypeFor[Config]().PkgPath(),
		choices: choices(), bounds: bounds(),
	}
	s := g.schema(reflect.TypeFor[Config](), "config")
	if d := docs["Config"]; d != "" {
		s["description"] = d
	}
	return s
}

type schemaGen struct {
	docs    map[string]string
	pkg     string
	choices map[reflect.Type]map[string]choice
	bounds  map[reflect.Type]map[string]bound
}

var (
	durationType    = reflect.TypeFor[metav1.Duration]()
	unmarshalerType = reflect.TypeFor[json.Unmarshaler]()
)

// schema is the schema of a value of type t found at path (for messages).
func (g schemaGen) schema(t reflect.Type, path string) map[string]any {
	s := g.shape(t, path)
	if nullable(t) {
		s["type"] = []any{s["type"], "null"}
	}
	return s
}

// nullable reports whether the decoder Parse uses accepts null for a t,
// which it then leaves unset (a Duration, for one, refuses it).
func nullable(t reflect.Type) bool {
	_, err := sigsjson.UnmarshalStrict([]byte("null"), reflect.New(t).Interface())
	return err == nil
}

func (g schemaGen) shape(t reflect.Type, path string) map[string]any {
	if t == durationType {
		return map[string]any{"type": "string", "pattern": DurationPattern}
	}
	if t.Kind() != reflect.Pointer && (t.Implements(unmarshalerType) || reflect.PointerTo(t).Implements(unmarshalerType)) {
		panic(fmt.Sprintf("config schema: %s (%s) decodes itself: say in schema.go what it accepts", path, t))
	}
	switch t.Kind() {
	case reflect.Pointer:
		return g.shape(t.Elem(), path)
	case reflect.Struct:
		return g.object(t, path)
	case reflect.Slice:
		return map[string]any{"type": "array", "items": g.schema(t.Elem(), path+"[]")}
	case reflect.Map:
		if t.Key().Kind() != reflect.String {
			panic(fmt.Sprintf("config schema: %s (%s) has keys that are not strings", path, t))
		}
		return map[string]any{"type": "object", "additionalProperties": g.schema(t.Elem(), path+"{}")}
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return map[string]any{"type": "integer"}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return map[string]any{"type": "integer", "minimum": 0}
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	}
	panic(fmt.Sprintf("config schema: %s has type %s, which the schema cannot describe", path, t))
}

// object is the schema of a section: its fields by JSON name, nothing else.
func (g schemaGen) object(t reflect.Type, path string) map[string]any {
	props := map[string]any{}
	conditional := map[string]map[string]any{} // by the field they depend on
	used := map[string]bool{}
	var required []any
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if f.Anonymous && name == "" {
			panic(fmt.Sprintf("config schema: %s embeds %s: inline fields are not described", path, f.Type))
		}
		if name == "" {
			name = f.Name
		}
		p := g.schema(f.Type, path+"."+name)
		if c, ok := g.choices[t][name]; ok {
			used["choice "+name] = true
			enum := c.enum(p)
			switch {
			case c.when == "":
				target(p)["enum"] = enum
				if !c.emptyOK && f.Type.Kind() != reflect.Slice {
					required = append(required, name)
				}
			default:
				conditional[c.when] = map[string]any{name: map[string]any{"enum": enum}}
			}
		}
		if b, ok := g.bounds[t][name]; ok {
			used["bound "+name] = true
			p["minimum"] = 0
			if b.max != 0 {
				p["maximum"] = b.max
			}
		}
		if d := g.doc(t, f); d != "" {
			p["description"] = d
		}
		props[name] = p
	}
	for name := range g.choices[t] {
		if !used["choice "+name] {
			panic(fmt.Sprintf("config schema: the choices of %s name %q, which it does not have", t, name))
		}
	}
	for name := range g.bounds[t] {
		if !used["bound "+name] {
			panic(fmt.Sprintf("config schema: the bounds of %s name %q, which it does not have", t, name))
		}
	}
	s := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	if len(required) > 0 {
		s["required"] = required
	}
	for _, when := range slices.Sorted(maps.Keys(conditional)) {
		if _, ok := s["if"]; ok {
			panic(fmt.Sprintf("config schema: %s: one condition per section", path))
		}
		s["if"] = map[string]any{"properties": map[string]any{when: map[string]any{"const": true}}, "required": []any{when}}
		s["then"] = map[string]any{"properties": conditional[when]}
	}
	return s
}

// enum is the set of values the field whose schema is p may take: the
// choice's, plus the empty value and null where validation accepts them.
func (c choice) enum(p map[string]any) []any {
	var out []any
	for _, v := range c.values {
		out = append(out, v)
	}
	if !c.emptyOK {
		return out
	}
	out = append(out, "")
	if types, ok := target(p)["type"].([]any); ok && slices.Contains(types, any("null")) {
		out = append(out, nil)
	}
	return out
}

// target is where a field's constraints on values go: the schema of its
// entries for a list, its own otherwise.
func target(p map[string]any) map[string]any {
	if items, ok := p["items"].(map[string]any); ok {
		return items
	}
	return p
}

// doc is a field's doc comment, or else that of its section type.
func (g schemaGen) doc(t reflect.Type, f reflect.StructField) string {
	if t.PkgPath() == g.pkg {
		if d := g.docs[t.Name()+"."+f.Name]; d != "" {
			return d
		}
	}
	ft := f.Type
	for ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice {
		ft = ft.Elem()
	}
	if ft.PkgPath() == g.pkg && ft.Kind() == reflect.Struct {
		return g.docs[ft.Name()]
	}
	return ""
}
