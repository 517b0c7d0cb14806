package events

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// schemaFiles are the JSON Schemas (draft 2020-12) of the public contract,
// found at EventSchemaURL and RecordSchemaURL: events on the stream and
// records in the key-value bucket. docs/events.md describes them.
//
//go:embed schema/event.v1.json schema/record.v1.json
var schemaFiles embed.FS

// schemaFileNames maps each schema's URL to its embedded file.
var schemaFileNames = map[string]string{
	EventSchemaURL:  "schema/event.v1.json",
	RecordSchemaURL: "schema/record.v1.json",
}

// Schema returns the text of the schema at url (EventSchemaURL or
// RecordSchemaURL).
func Schema(url string) ([]byte, error) {
	name, ok := schemaFileNames[url]
	if !ok {
		return nil, fmt.Errorf("no schema %q", url)
	}
	return schemaFiles.ReadFile(name)
}

// Validator checks events and records against the v1 schemas. It is safe
// for concurrent use.
type Validator struct {
	event, record *jsonschema.Schema
}

// NewValidator compiles the embedded schemas. Formats (date-time,
// uri-reference) are asserted, not just annotated.
func NewValidator() (*Validator, error) {
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	for url, name := range schemaFileNames {
		data, err := schemaFiles.ReadFile(name)
		if err != nil {
			return nil, err
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
		if err != nil {
			return nil, fmt.Errorf("schema %s: %w", name, err)
		}
		if err := c.AddResource(url, doc); err != nil {
			return nil, fmt.Errorf("schema %s: %w", name, err)
		}
	}
	v := &Validator{}
	var err error
	if v.event, err = c.Compile(EventSchemaURL); err != nil {
		return nil, fmt.Errorf("compile event schema: %w", err)
	}
	if v.record, err = c.Compile(RecordSchemaURL); err != nil {
		return nil, fmt.Errorf("compile record schema: %w", err)
	}
	return v, nil
}

// ValidateEvent checks one event (CloudEvents structured JSON) against the
// event schema, and that its subject names the same namespace and cluster
// as its data, which a schema cannot express.
func (v *Validator) ValidateEvent(data []byte) error {
	inst, err := validateInstance(v.event, data)
	if err != nil {
		return fmt.Errorf("invalid event: %w", err)
	}
	ev := inst.(map[string]any)
	d := ev["data"].(map[string]any)
	if want := fmt.Sprintf("%v/%v", d["namespace"], d["cluster"]); ev["subject"] != want {
		return fmt.Errorf("invalid event: subject %q is not data.namespace/data.cluster %q", ev["subject"], want)
	}
	return nil
}

// ValidateRecord checks one key-value record against the record schema.
func (v *Validator) ValidateRecord(data []byte) error {
	if _, err := validateInstance(v.record, data); err != nil {
		return fmt.Errorf("invalid record: %w", err)
	}
	return nil
}

func validateInstance(s *jsonschema.Schema, data []byte) (any, error) {
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	if err := s.Validate(inst); err != nil {
		var verr *jsonschema.ValidationError
		if errors.As(err, &verr) {
			return nil, errors.New(describeValidation(verr))
		}
		return nil, err
	}
	return inst, nil
}

// describeValidation flattens a validation error tree into its leaf causes,
// "at '<pointer>': <message>" each, which reads better in a test failure or a
// log line than the nested default.
func describeValidation(e *jsonschema.ValidationError) string {
	var leaves []string
	var walk func(*jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			leaves = append(leaves, e.Error())
			return
		}
		for _, c := range e.Causes {
			walk(c)
		}
	}
	walk(e)
	return strings.Join(leaves, "; ")
}

var defaultValidator = sync.OnceValues(NewValidator)

// ValidateEvent checks an event with a Validator compiled on first use.
func ValidateEvent(data []byte) error {
	v, err := defaultValidator()
	if err != nil {
		return err
	}
	return v.ValidateEvent(data)
}

// ValidateRecord checks a record with a Validator compiled on first use.
func ValidateRecord(data []byte) error {
	v, err := defaultValidator()
	if err != nil {
		return err
	}
	return v.ValidateRecord(data)
}
