package testutil

import (
	"fmt"
	"sort"
	"strings"

	dto "github.com/prometheus/client_model/go"
)

// promqlKeywords are the PromQL words that stand where a metric name
// could and are not one: binary operators, modifiers and the literals.
var promqlKeywords = map[string]bool{
	"and": true, "or": true, "unless": true, "atan2": true, "bool": true,
	"offset": true, "inf": true, "nan": true,
}

// promqlLabelLists are the keywords followed by a parenthesised list of
// label names, not of expressions.
var promqlLabelLists = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true,
	"group_left": true, "group_right": true,
}

// MetricNames returns the metric names a PromQL expression selects,
// sorted and without repeats: every bare identifier that is not a
// function, an aggregation, a keyword or a label. Label matchers ({...}),
// ranges and subqueries ([...]), strings, numbers, durations and Grafana
// variables ($__rate_interval, ${pod}) are skipped. A series selected by
// a __name__ matcher alone is not found: write its name instead. An
// unbalanced bracket or quote is an error.
func MetricNames(expr string) ([]string, error) {
	seen := map[string]bool{}
	s := expr
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '#':
			for i < len(s) && s[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			end, err := skipString(s, i)
			if err != nil {
				return nil, err
			}
			i = end
		case c == '{':
			end, err := skipTo(s, i, '{', '}')
			if err != nil {
				return nil, err
			}
			i = end
		case c == '[':
			end, err := skipTo(s, i, '[', ']')
			if err != nil {
				return nil, err
			}
			i = end
		case c == '$':
			i = skipVariable(s, i)
		case isDigit(c) || (c == '.' && i+1 < len(s) && isDigit(s[i+1])):
			i = skipNumber(s, i)
		case isIdentStart(c):
			start := i
			for i < len(s) && isIdentChar(s[i]) {
				i++
			}
			word := s[start:i]
			next := i
			for next < len(s) && (s[next] == ' ' || s[next] == '\t' || s[next] == '\n' || s[next] == '\r') {
				next++
			}
			// An aggregation's name is followed by its argument, or by
			// its grouping (sum by (le) (...)).
			calls := next < len(s) && s[next] == '(' || groupingAt(s, next)
			switch {
			case promqlLabelLists[strings.ToLower(word)]:
				if calls {
					end, err := skipTo(s, next, '(', ')')
					if err != nil {
						return nil, err
					}
					i = end
				}
			case promqlKeywords[strings.ToLower(word)], calls:
				// A keyword, or a function or aggregation's name.
			default:
				seen[word] = true
			}
		default:
			i++
		}
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, nil
}

// groupingAt reports whether the word at s[i] is by or without.
func groupingAt(s string, i int) bool {
	j := i
	for j < len(s) && isIdentChar(s[j]) {
		j++
	}
	w := strings.ToLower(s[i:j])
	return w == "by" || w == "without"
}

// skipString returns the index just past the string literal opening at
// s[i].
func skipString(s string, i int) (int, error) {
	quote := s[i]
	for j := i + 1; j < len(s); j++ {
		switch {
		case s[j] == '\\' && quote != '`':
			j++
		case s[j] == quote:
			return j + 1, nil
		}
	}
	return 0, fmt.Errorf("unterminated string at %d in %q", i, s)
}

// skipTo returns the index just past the close that matches the open at
// s[i], passing over strings and nested pairs.
func skipTo(s string, i int, open, close byte) (int, error) {
	depth := 0
	for j := i; j < len(s); j++ {
		switch s[j] {
		case '"', '\'', '`':
			end, err := skipString(s, j)
			if err != nil {
				return 0, err
			}
			j = end - 1
		case open:
			depth++
		case close:
			depth--
			if depth == 0 {
				return j + 1, nil
			}
		}
	}
	return 0, fmt.Errorf("unbalanced %q at %d in %q", open, i, s)
}

// skipVariable returns the index just past the Grafana variable at s[i]:
// $name, ${name} or ${name:format}.
func skipVariable(s string, i int) int {
	i++
	if i < len(s) && s[i] == '{' {
		for i < len(s) && s[i] != '}' {
			i++
		}
		return min(i+1, len(s))
	}
	for i < len(s) && isIdentChar(s[i]) {
		i++
	}
	return i
}

// skipNumber returns the index just past the number or duration at s[i]
// (0.99, 1e-3, 0x1f, 5m, 1h30m).
func skipNumber(s string, i int) int {
	for i < len(s) {
		c := s[i]
		switch {
		case isIdentChar(c) || c == '.':
			i++
		case (c == '+' || c == '-') && (s[i-1] == 'e' || s[i-1] == 'E') && !strings.HasPrefix(strings.ToLower(s[:i]), "0x"):
			i++
		default:
			return i
		}
	}
	return i
}

func isDigit(c byte) bool      { return c >= '0' && c <= '9' }
func isIdentStart(c byte) bool { return c == '_' || c == ':' || (c|0x20 >= 'a' && c|0x20 <= 'z') }
func isIdentChar(c byte) bool  { return isIdentStart(c) || isDigit(c) }

// histogramSuffixes are the series a histogram or summary family
// exposes besides its own name.
var histogramSuffixes = []string{"_bucket", "_sum", "_count"}

// Exposes reports whether the metric name, as a query writes it, is in m:
// a family of that name, or a histogram's or summary's _bucket, _sum or
// _count series (a summary has no _bucket).
func (m Metrics) Exposes(name string) bool {
	if m[name] != nil {
		return true
	}
	for _, suffix := range histogramSuffixes {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		mf := m[base]
		if mf == nil {
			return false
		}
		switch mf.GetType() {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			return true
		case dto.MetricType_SUMMARY:
			return suffix != "_bucket"
		}
		return false
	}
	return false
}
