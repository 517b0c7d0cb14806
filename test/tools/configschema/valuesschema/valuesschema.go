// Package valuesschema writes the configuration's JSON Schema, derived from
// package config's types with their doc comments as descriptions, into the
// Helm chart's values.schema.json as properties.config.
package valuesschema

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/hubsync/hubsync/config"
)

// Path is the chart's values schema, relative to the repository's root.
const Path = "charts/hubsync/values.schema.json"

// ConfigSchema returns the schema of the configuration file with the doc
// comments of package config (read from root/config/*.go) as descriptions.
func ConfigSchema(root string) (map[string]any, error) {
	docs, err := FieldDocs(filepath.Join(root, "config"))
	if err != nil {
		return nil, err
	}
	return config.JSONSchema(docs), nil
}

// Standalone is the configuration's schema as a document of its own, for
// editors.
func Standalone(cfg map[string]any) map[string]any {
	out := map[string]any{"$schema": config.JSONSchemaDraft, "title": "hubsync configuration (" + config.APIVersion + ", " + config.Kind + ")"}
	for k, v := range cfg {
		out[k] = v
	}
	return out
}

// FieldDocs reads the doc comments of the struct types declared in dir's
// non-test Go files: a type's under its name ("Bus"), a field's under
// "Type.Field" ("Bus.BatchWindow"). A field without a comment of its own
// shares the one before it when that comment is about it too: it names
// the field among its subjects ("QPS and Burst bound ...").
func FieldDocs(dir string) (map[string]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	docs := map[string]string{}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			return nil, fmt.Errorf("read doc comments: %w", err)
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.TYPE {
				continue
			}
			for _, spec := range gd.Specs {
				ts := spec.(*ast.TypeSpec)
				st, ok := ts.Type.(*ast.StructType)
				if !ok {
					continue
				}
				doc := ts.Doc
				if doc == nil && len(gd.Specs) == 1 {
					doc = gd.Doc
				}
				if d := text(doc); d != "" {
					docs[ts.Name.Name] = d
				}
				structDocs(docs, ts.Name.Name, st)
			}
		}
	}
	return docs, nil
}

// structDocs records the doc comments of a struct's fields.
func structDocs(docs map[string]string, typ string, st *ast.StructType) {
	shared := "" // the last comment, while the fields after it are named in it
	for _, field := range st.Fields.List {
		if d := text(field.Doc); d != "" {
			shared = d
			for _, n := range field.Names {
				docs[typ+"."+n.Name] = d
			}
			continue
		}
		for _, n := range field.Names {
			if !slices.Contains(subjects(shared), n.Name) {
				shared = ""
				break
			}
			docs[typ+"."+n.Name] = shared
		}
	}
}

// subjectList is a list of field names opening a sentence or a clause.
var subjectList = regexp.MustCompile(`(?:^|[.;] )([A-Z]\w*(?:(?:, | and |, and )[A-Z]\w*)*) `)

// subjects are the field names a comment's sentences and clauses open
// with: "QPS and Burst bound ..." is about QPS and Burst.
func subjects(comment string) []string {
	var out []string
	for _, m := range subjectList.FindAllStringSubmatch(comment, -1) {
		for _, name := range regexp.MustCompile(`, and |, | and `).Split(m[1], -1) {
			out = append(out, name)
		}
	}
	return out
}

// text is a comment's text with each paragraph on one line.
func text(cg *ast.CommentGroup) string {
	if cg == nil {
		return ""
	}
	var paras []string
	for _, p := range strings.Split(strings.TrimSpace(cg.Text()), "\n\n") {
		if p = strings.Join(strings.Fields(p), " "); p != "" {
			paras = append(paras, p)
		}
	}
	return strings.Join(paras, "\n\n")
}

// Update returns the values schema existing (nil: none yet) with
// properties.config replaced by cfg, everything else kept, formatted
// stably.
func Update(existing []byte, cfg map[string]any) ([]byte, error) {
	doc := map[string]any{
		"$schema":    config.JSONSchemaDraft,
		"type":       "object",
		"properties": map[string]any{},
	}
	if existing != nil {
		d := json.NewDecoder(bytes.NewReader(existing))
		d.UseNumber()
		doc = nil
		if err := d.Decode(&doc); err != nil {
			return nil, fmt.Errorf("read %s: %w", Path, err)
		}
		if doc == nil {
			return nil, fmt.Errorf("%s is not a JSON object", Path)
		}
	}
	props, ok := doc["properties"].(map[string]any)
	if !ok {
		if doc["properties"] != nil {
			return nil, fmt.Errorf("%s: properties is not an object", Path)
		}
		props = map[string]any{}
		doc["properties"] = props
	}
	props["config"] = cfg
	return Marshal(doc)
}

// ConfigOf returns the properties.config of a values schema, or nil.
func ConfigOf(valuesSchema []byte) (any, error) {
	var doc struct {
		Properties map[string]any `json:"properties"`
	}
	if err := json.Unmarshal(valuesSchema, &doc); err != nil {
		return nil, err
	}
	return doc.Properties["config"], nil
}

// Marshal formats a schema the one way the repository keeps it: two-space
// indent, keys sorted, no HTML escapes, a final newline.
func Marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	e := json.NewEncoder(&b)
	e.SetIndent("", "  ")
	e.SetEscapeHTML(false)
	if err := e.Encode(v); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
