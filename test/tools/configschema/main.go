// Command configschema derives the JSON Schema of hubsync's configuration
// file from package config (its types, enums, ranges and doc comments) and
// writes it into the Helm chart's values.schema.json as properties.config,
// keeping the chart's other properties (make schema, part of make
// generate). With -print it writes the configuration's schema alone to
// stdout, for editors (docs/configuration.md).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/hubsync/hubsync/test/tools/configschema/valuesschema"
)

func main() {
	root := flag.String("root", ".", "the repository's root")
	print := flag.Bool("print", false, "write the configuration's schema alone to stdout instead of updating "+valuesschema.Path)
	flag.Parse()
	if err := run(*root, *print); err != nil {
		fmt.Fprintln(os.Stderr, "configschema:", err)
		os.Exit(1)
	}
}

func run(root string, print bool) error {
	cfg, err := valuesschema.ConfigSchema(root)
	if err != nil {
		return err
	}
	if print {
		out, err := valuesschema.Marshal(valuesschema.Standalone(cfg))
		if err != nil {
			return err
		}
		_, err = os.Stdout.Write(out)
		return err
	}
	path := filepath.Join(root, valuesschema.Path)
	existing, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	out, err := valuesschema.Update(existing, cfg)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, out, 0o644)
}
