package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// decodeErrors are the problems that stopped decoding (a value of the
// wrong type, a duration Go cannot parse), every one, each at its field
// path and saying what is allowed: the document is checked against the
// configuration's JSON Schema, since Go's decoder stops at the first and
// names no field for a bad duration. Enums, ranges and required fields
// are left to validation, which runs once the types are right.
func decodeErrors(js []byte, decodeErr error) field.ErrorList {
	errs, err := schemaErrors(js)
	if err != nil || len(errs) == 0 {
		// The schema saw nothing wrong (or could not run): the decoder's
		// own words, which name the field where they can.
		return field.ErrorList{field.Invalid(field.NewPath(""), nil, decodeErr.Error())}
	}
	return errs
}

func schemaErrors(js []byte) (field.ErrorList, error) {
	doc, err := json.Marshal(JSONSchema(nil))
	if err != nil {
		return nil, err
	}
	schemaDoc, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft7)
	if err := c.AddResource("hubsync-config.json", schemaDoc); err != nil {
		return nil, err
	}
	s, err := c.Compile("hubsync-config.json")
	if err != nil {
		return nil, err
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(js))
	if err != nil {
		return nil, err
	}
	var verr *jsonschema.ValidationError
	if err := s.Validate(inst); !errors.As(err, &verr) {
		return nil, err
	}
	var errs field.ErrorList
	var walk func(*jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) > 0 {
			for _, c := range e.Causes {
				walk(c)
			}
			return
		}
		errs = append(errs, leafError(e, inst)...)
	}
	walk(verr)
	return dedupe(errs), nil
}

// leafError is one schema failure as field errors; nil for the kinds
// validation reports itself.
func leafError(e *jsonschema.ValidationError, inst any) field.ErrorList {
	p := pathOf(e.InstanceLocation)
	switch k := e.ErrorKind.(type) {
	case *kind.Type:
		// "null" is allowed where a field may be left out: not worth
		// saying.
		want := slices.DeleteFunc(slices.Clone(k.Want), func(w string) bool { return w == "null" && len(k.Want) > 1 })
		return field.ErrorList{field.Invalid(p, valueAt(inst, e.InstanceLocation),
			fmt.Sprintf("must be %s, not %s", strings.Join(want, " or "), k.Got))}
	case *kind.Pattern:
		if k.Want == DurationPattern {
			return field.ErrorList{field.Invalid(p, k.Got, "must be a duration such as 30s, 1m30s or 2h (units ns, us, ms, s, m, h)")}
		}
		return field.ErrorList{field.Invalid(p, k.Got, "must match "+k.Want)}
	case *kind.AdditionalProperties:
		var errs field.ErrorList
		for _, name := range k.Properties {
			errs = append(errs, field.Forbidden(p.Child(name), "unknown field"))
		}
		return errs
	}
	return nil
}

// pathOf is a JSON instance location as a field path: list indexes as
// [i], keys as .key.
func pathOf(loc []string) *field.Path {
	var p *field.Path
	for _, tok := range loc {
		if i, err := strconv.Atoi(tok); err == nil && p != nil {
			p = p.Index(i)
			continue
		}
		if p == nil {
			p = field.NewPath(tok)
		} else {
			p = p.Child(tok)
		}
	}
	if p == nil {
		p = field.NewPath("")
	}
	return p
}

// valueAt is the value at loc in a decoded JSON document.
func valueAt(inst any, loc []string) any {
	for _, tok := range loc {
		switch v := inst.(type) {
		case map[string]any:
			inst = v[tok]
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(v) {
				return nil
			}
			inst = v[i]
		default:
			return nil
		}
	}
	return inst
}

// dedupe drops repeated errors (one value can fail the same way under
// several branches of a schema) keeping the first of each.
func dedupe(errs field.ErrorList) field.ErrorList {
	var out field.ErrorList
	seen := map[string]bool{}
	for _, e := range errs {
		if k := e.Error(); !seen[k] {
			seen[k] = true
			out = append(out, e)
		}
	}
	slices.SortStableFunc(out, func(a, b *field.Error) int { return strings.Compare(a.Field, b.Field) })
	return out
}
