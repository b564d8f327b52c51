package orchestrator

import (
	"encoding/json"
	"maps"
	"math"
	"slices"
	"strings"
	"unicode"
)

// index ranks a connector's tools for a query with BM25 (Okapi, k1 = 1.2,
// b = 0.75) over each tool's words: its name (counted three times: a name
// says most about a tool), its description, and its parameters' names and
// descriptions. Words are lower-cased, split at anything but letters and
// digits and at camelCase humps, stripped of a few English endings
// ("issues", "listing" and "listed" match "issue" and "list") and of
// common words. It is built once per catalog and read without locks.
type index struct {
	postings map[string][]posting
	lengths  []float64 // words per tool, in catalog order
	avgLen   float64
}

type posting struct {
	tool int // in catalog order
	tf   float64
}

const (
	bm25K1     = 1.2
	bm25B      = 0.75
	nameWeight = 3
)

func newIndex(tools []*tool) *index {
	ix := &index{postings: map[string][]posting{}, lengths: make([]float64, len(tools))}
	var total float64
	for i, t := range tools {
		tf := map[string]float64{}
		for _, w := range words(t.Name) {
			tf[w] += nameWeight
		}
		for _, w := range words(t.Description) {
			tf[w]++
		}
		for _, w := range words(schemaText(t.InputSchema)) {
			tf[w]++
		}
		for w, n := range tf {
			ix.postings[w] = append(ix.postings[w], posting{tool: i, tf: n})
			ix.lengths[i] += n
		}
		total += ix.lengths[i]
	}
	if len(tools) > 0 {
		ix.avgLen = total / float64(len(tools))
	}
	return ix
}

// scores returns each tool's BM25 score for text, in catalog order.
func (ix *index) scores(text string) []float64 {
	out := make([]float64, len(ix.lengths))
	n := float64(len(ix.lengths))
	seen := map[string]bool{}
	for _, w := range words(text) {
		if seen[w] {
			continue
		}
		seen[w] = true
		ps := ix.postings[w]
		if len(ps) == 0 {
			continue
		}
		df := float64(len(ps))
		idf := math.Log(1 + (n-df+0.5)/(df+0.5))
		for _, p := range ps {
			norm := bm25K1 * (1 - bm25B + bm25B*ix.lengths[p.tool]/ix.avgLen)
			out[p.tool] += idf * p.tf * (bm25K1 + 1) / (p.tf + norm)
		}
	}
	return out
}

// rank returns the catalog indexes of the tools in order of score, best
// first; ties (no shared word included) keep catalog order.
func rank(scores []float64) []int {
	order := make([]int, len(scores))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		switch {
		case scores[a] > scores[b]:
			return -1
		case scores[a] < scores[b]:
			return 1
		}
		return 0
	})
	return order
}

// schemaText is the names and descriptions of a JSON schema's properties,
// nested ones included, in name order (the text is the same every time).
func schemaText(raw json.RawMessage) string {
	var schema map[string]any
	if json.Unmarshal(raw, &schema) != nil {
		return ""
	}
	var b strings.Builder
	var walk func(s map[string]any, depth int)
	walk = func(s map[string]any, depth int) {
		if depth > 4 {
			return
		}
		props, _ := s["properties"].(map[string]any)
		for _, name := range slices.Sorted(maps.Keys(props)) {
			p := props[name]
			b.WriteString(name)
			b.WriteByte(' ')
			if ps, ok := p.(map[string]any); ok {
				if d, ok := ps["description"].(string); ok {
					b.WriteString(d)
					b.WriteByte(' ')
				}
				walk(ps, depth+1)
				if items, ok := ps["items"].(map[string]any); ok {
					walk(items, depth+1)
				}
			}
		}
	}
	walk(schema, 0)
	return b.String()
}

// words splits text into the index's words.
func words(text string) []string {
	var out []string
	var cur []rune
	flush := func() {
		if len(cur) > 0 {
			if w := stem(strings.ToLower(string(cur))); w != "" && !stopWords[w] {
				out = append(out, w)
			}
			cur = cur[:0]
		}
	}
	var prev rune
	for _, r := range text {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r):
			// A hump: "listIssues" is "list" and "issues".
			if unicode.IsUpper(r) && unicode.IsLower(prev) {
				flush()
			}
			cur = append(cur, r)
		default:
			flush()
		}
		prev = r
	}
	flush()
	return out
}

// stem strips a few English endings, enough for the words tools are
// described with: plural, -ing and -ed forms meet their stem.
func stem(w string) string {
	if len(w) <= 3 {
		return w
	}
	switch {
	case strings.HasSuffix(w, "ies") && len(w) > 4:
		return w[:len(w)-3] + "y"
	case strings.HasSuffix(w, "sses"):
		return w[:len(w)-2]
	case strings.HasSuffix(w, "ing") && len(w) > 5:
		return trimDouble(w[:len(w)-3])
	case strings.HasSuffix(w, "ed") && len(w) > 4:
		return trimDouble(w[:len(w)-2])
	case strings.HasSuffix(w, "es") && (strings.HasSuffix(w, "ches") || strings.HasSuffix(w, "shes") || strings.HasSuffix(w, "xes")):
		return w[:len(w)-2]
	case strings.HasSuffix(w, "s") && !strings.HasSuffix(w, "ss") && !strings.HasSuffix(w, "us") && !strings.HasSuffix(w, "is"):
		return w[:len(w)-1]
	}
	return w
}

// trimDouble undoes a doubled last consonant: "stopp" (from "stopped")
// is "stop".
func trimDouble(w string) string {
	n := len(w)
	if n >= 3 && w[n-1] == w[n-2] && !strings.ContainsRune("aeiouls", rune(w[n-1])) {
		return w[:n-1]
	}
	return w
}

var stopWords = map[string]bool{}

func init() {
	for _, w := range strings.Fields(`a an and are as at be by can do doe for from how i in into is it its
		me my of on or our please so that the their them then there these this to up us was we what when where
		which who will with you your all any some one`) {
		stopWords[w] = true
	}
}
