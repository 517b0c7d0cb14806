package config

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Load reads a configuration file and parses it (see Parse). The error
// lists every problem found, each with its field path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return Parse(data)
}

// Parse is what the daemon runs before it starts or reloads: it decodes a
// configuration document strictly (unknown keys are errors), fills in
// defaults, validates it and checks that every file it names can be read.
// The error lists every problem at once, each with its field path.
func Parse(data []byte) (*Config, error) {
	return parse(data, true)
}

// Decode is Parse without the file checks, for commands that read the
// daemon's configuration elsewhere than where the daemon runs (hubsync
// kubeconfig on a workstation): the file must still be valid, but the
// certificates and keys it names need not exist there.
func Decode(data []byte) (*Config, error) {
	return parse(data, false)
}

func parse(data []byte, checkFiles bool) (*Config, error) {
	c := &Config{}
	var errs field.ErrorList
	if len(bytes.TrimSpace(data)) > 0 {
		js, err := yaml.YAMLToJSONStrict(data)
		if err != nil {
			return nil, fmt.Errorf("parse config: %w", err)
		}
		// Strict decoding reports every unknown or duplicated key, not just
		// the first, while still decoding the rest for validation.
		strict, err := sigsjson.UnmarshalStrict(js, c, sigsjson.DisallowUnknownFields)
		if err != nil {
			// Go's decoder stops at the first wrong type: every one, each
			// with its path, from the schema.
			return nil, fmt.Errorf("parse config: %w", decodeErrors(js, err).ToAggregate())
		}
		for _, e := range strict {
			errs = append(errs, strictError(e))
		}
	}
	c.SetDefaults()
	errs = append(errs, c.validate()...)
	if checkFiles {
		errs = append(errs, c.checkFiles()...)
	}
	if len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	return c, nil
}

// strictError turns a strict-decoding error such as
// `unknown field "hub.qsp"` into a field error with that path.
func strictError(err error) *field.Error {
	msg := err.Error()
	for _, prefix := range []string{"unknown field ", "duplicate field "} {
		if rest, ok := strings.CutPrefix(msg, prefix); ok {
			if path, uerr := strconv.Unquote(rest); uerr == nil {
				return field.Forbidden(field.NewPath(path), strings.TrimSpace(prefix))
			}
		}
	}
	return field.Invalid(field.NewPath(""), nil, msg)
}
