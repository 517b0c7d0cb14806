package layout

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/hubsync/hubsync/stream"
	"github.com/hubsync/hubsync/test/testutil"
)

// readmeMaxLines bounds README.md: it starts with the user (what hubsync
// is, a quickstart, the support matrix, upgrades), and the rest lives in
// docs/.
const readmeMaxLines = 250

// docFiles are the documents whose names of things are checked.
func docFiles(t *testing.T) map[string]string {
	t.Helper()
	paths, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	paths = append(paths, "../../README.md", "../../CHANGELOG.md")
	out := map[string]string{}
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel("../..", p)
		out[rel] = string(data)
	}
	return out
}

// TestReadme: README.md stays short, and shows the two commands near its
// top.
func TestReadme(t *testing.T) {
	data, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	if n := len(lines); n > readmeMaxLines {
		t.Errorf("README.md has %d lines; at most %d (move the detail into docs/)", n, readmeMaxLines)
	}
	top := strings.Join(lines[:min(20, len(lines))], "\n")
	for _, cmd := range []string{"make demo", "make test"} {
		if !strings.Contains(top, cmd) {
			t.Errorf("README.md's first 20 lines do not show %q", cmd)
		}
	}
}

// codeSpans are the spans a document names things in: `inline code` and
// the lines of fenced code blocks (with shellOnly, of shell blocks only:
// ```sh, ```bash, ```console; other blocks hold output, YAML or pictures).
func codeSpans(doc string, shellOnly ...bool) []string {
	var spans []string
	inBlock, shell := false, false
	for _, line := range strings.Split(doc, "\n") {
		if lang, ok := strings.CutPrefix(strings.TrimSpace(line), "```"); ok {
			inBlock = !inBlock
			shell = inBlock && (lang == "sh" || lang == "bash" || lang == "console" || lang == "shell")
			continue
		}
		if inBlock {
			if len(shellOnly) == 0 || shell {
				spans = append(spans, line)
			}
			continue
		}
		parts := strings.Split(line, "`")
		for i := 1; i < len(parts); i += 2 {
			spans = append(spans, parts[i])
		}
	}
	return spans
}

// TestDocsNameMakeTargets: every `make TARGET` the documents name is a
// target of the Makefile.
func TestDocsNameMakeTargets(t *testing.T) {
	mk, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^([a-z][a-z0-9-]*):`).FindAllStringSubmatch(string(mk), -1) {
		targets[m[1]] = true
	}
	use := regexp.MustCompile(`(?:^|[\s(;&])make ([a-z][a-z0-9-]*)`)
	for name, doc := range docFiles(t) {
		for _, span := range codeSpans(doc) {
			for _, m := range use.FindAllStringSubmatch(span, -1) {
				if !targets[m[1]] {
					t.Errorf("%s names `make %s`, which the Makefile does not have", name, m[1])
				}
			}
		}
	}
}

// TestDocsNameCommandsAndFlags: every `hubsync COMMAND` the documents
// name is a command of the binary, and every --flag written after it is
// one of that command's flags (as its -h lists them).
func TestDocsNameCommandsAndFlags(t *testing.T) {
	bin := testutil.Hubsync(t)
	help := map[string]string{}
	commandHelp := func(cmd string) (string, bool) {
		if h, ok := help[cmd]; ok {
			return h, h != ""
		}
		out, _ := exec.Command(bin, cmd, "-h").CombinedOutput()
		h := string(out)
		if strings.Contains(h, "unknown command") {
			h = ""
		}
		help[cmd] = h
		return h, h != ""
	}
	flagRE := regexp.MustCompile(`^--?([a-z][a-z0-9-]*)`)
	command := regexp.MustCompile(`^[a-z][a-z-]*$`)
	for name, doc := range docFiles(t) {
		for _, span := range codeSpans(doc, true) {
			for _, words := range shellCommands(span) {
				if len(words) < 2 || filepath.Base(words[0]) != "hubsync" || !command.MatchString(words[1]) {
					continue // not hubsync, or a placeholder such as COMMAND
				}
				cmd := words[1]
				h, ok := commandHelp(cmd)
				if !ok {
					t.Errorf("%s names `hubsync %s`, which is not a command", name, cmd)
					continue
				}
				for _, arg := range words[2:] {
					if strings.HasPrefix(arg, "#") {
						break // a comment
					}
					f := flagRE.FindStringSubmatch(arg)
					if f == nil || f[1] == "h" {
						continue
					}
					if !strings.Contains(h, "-"+f[1]+" ") && !strings.Contains(h, "-"+f[1]+"\n") && !strings.Contains(h, "-"+f[1]+"\t") {
						t.Errorf("%s: `hubsync %s ... %s`: %q is not one of its flags", name, cmd, arg, f[1])
					}
				}
			}
		}
	}
}

// shellCommands splits a line of shell into its commands (at |, &&, ;,
// &, $( and `(`), each as words, leaving out a prompt ($) and leading
// variable assignments, so that only a command's own name counts as one.
func shellCommands(line string) [][]string {
	var out [][]string
	for _, part := range regexp.MustCompile(`\|\||&&|[|;&(]|\$\(`).Split(line, -1) {
		words := strings.Fields(part)
		for len(words) > 0 && (words[0] == "$" || strings.Contains(words[0], "=") && !strings.HasPrefix(words[0], "-")) {
			words = words[1:]
		}
		if len(words) > 0 {
			out = append(out, words)
		}
	}
	return out
}

// TestDocsNameConfigKeys: every dotted configuration key the documents
// name (`gateway.clientAddress`, `bus.stream.maxAge`) is a key of the
// configuration, or of the chart's values; Go identifiers and event
// types are told apart.
func TestDocsNameConfigKeys(t *testing.T) {
	data, err := os.ReadFile("../../charts/hubsync/values.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(data, &schema); err != nil {
		t.Fatal(err)
	}
	values := schema
	config, _ := schema["properties"].(map[string]any)["config"].(map[string]any)
	var roots []string
	for k := range config["properties"].(map[string]any) {
		if k != "apiVersion" && k != "kind" {
			roots = append(roots, k)
		}
	}
	slices.Sort(roots)
	key := regexp.MustCompile(`^(` + strings.Join(roots, "|") + `)((?:\.[A-Za-z0-9]+)+):?$`)
	events := map[string]bool{}
	for _, typ := range stream.Types {
		events[strings.TrimPrefix(typ, "io.hubsync.")] = true
	}
	for name, doc := range docFiles(t) {
		for _, span := range codeSpans(doc) {
			m := key.FindStringSubmatch(strings.TrimSpace(span))
			if m == nil {
				continue
			}
			path := strings.Split(m[1]+m[2], ".")
			k := strings.TrimSuffix(m[0], ":")
			if events[k] || slices.ContainsFunc(path[1:], func(s string) bool { return unicode.IsUpper(rune(s[0])) }) {
				continue // an event type, or a Go identifier such as tunnel.ErrNotReady
			}
			if !schemaHas(config, path) && !schemaHas(values, path) {
				t.Errorf("%s names `%s`, which is neither a configuration key nor a chart value", name, k)
			}
		}
	}
}

// schemaHas reports whether the JSON schema s has the property path,
// through objects, arrays and maps.
func schemaHas(s map[string]any, path []string) bool {
	if len(path) == 0 {
		return true
	}
	if items, ok := s["items"].(map[string]any); ok {
		return schemaHas(items, path)
	}
	if props, ok := s["properties"].(map[string]any); ok {
		if next, ok := props[path[0]].(map[string]any); ok {
			return schemaHas(next, path[1:])
		}
	}
	if more, ok := s["additionalProperties"].(map[string]any); ok {
		return schemaHas(more, path[1:])
	}
	return false
}

// TestBashCompletion runs `hubsync completion bash` in bash against the
// binary: a command's name, then that command's flags, come back.
func TestBashCompletion(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	bin := testutil.Hubsync(t)
	dir := filepath.Dir(bin)
	for _, tc := range []struct {
		words string
		want  []string
	}{
		{words: "hubsync ch", want: []string{"check-config"}},
		{words: "hubsync run --log", want: []string{"--log-format", "--log-level"}},
		{words: "hubsync install --", want: []string{"--name"}},
	} {
		script := `source <("` + bin + `" completion bash)
COMP_WORDS=(` + tc.words + `); COMP_CWORD=$((${#COMP_WORDS[@]}-1)); _hubsync; echo "${COMPREPLY[@]}"`
		cmd := exec.Command(bash, "-c", script)
		cmd.Env = append(os.Environ(), "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", tc.words, err, out)
		}
		got := strings.Fields(string(out))
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("completing %q: %v; want %v", tc.words, got, tc.want)
		}
	}
}

// TestDocsNameBenchFlags: every flag the documents pass to the bench
// (`make bench BENCH_FLAGS=...`) is one test/bench defines.
func TestDocsNameBenchFlags(t *testing.T) {
	files, err := filepath.Glob("../bench/*.go")
	if err != nil {
		t.Fatal(err)
	}
	defined := map[string]bool{}
	def := regexp.MustCompile(`flag\.[A-Za-z]+\((?:&[A-Za-z.]+, )?"([a-z0-9-]+)"`)
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range def.FindAllStringSubmatch(string(src), -1) {
			defined[m[1]] = true
		}
	}
	if len(defined) < 20 {
		t.Fatalf("found only %d bench flags: the scan is broken", len(defined))
	}
	use := regexp.MustCompile(`--([a-z][a-z0-9-]*)`)
	for name, doc := range docFiles(t) {
		for _, span := range codeSpans(doc) {
			_, flags, ok := strings.Cut(span, "BENCH_FLAGS=")
			if !ok {
				continue
			}
			for _, m := range use.FindAllStringSubmatch(flags, -1) {
				if !defined[m[1]] {
					t.Errorf("%s passes --%s to the bench, which test/bench does not define", name, m[1])
				}
			}
		}
	}
}
