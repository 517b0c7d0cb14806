package layout

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// maxFuncLines is the longest a product function may be. A longer one is
// split into named steps (docs/architecture.md); the table below lists the
// exceptions, each with its reason, and is empty today.
const maxFuncLines = 80

var longFuncAllowed = map[string]string{}

// TestFunctionLength fails when a function or method in product code (not
// tests, not test/) is longer than maxFuncLines lines and not listed in
// longFuncAllowed.
func TestFunctionLength(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel == "test" || strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
			name := filepath.ToSlash(rel) + ":" + fd.Name.Name
			if _, ok := longFuncAllowed[name]; n > maxFuncLines && !ok {
				t.Errorf("%s is %d lines (at most %d): split it into named steps", name, n, maxFuncLines)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
