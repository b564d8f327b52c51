package orchestrator

import (
	"encoding/json"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"unicode"
)

// index ranks a connector's tools for a query with BM25 (Okapi, k1 = 1.2,
// b = 0.75) over each tool's words: its name (counted three times: a name
// says most about a tool), its description, and its parameters' names,
// descriptions and allowed values. Words (words) are lower-cased, split at
// anything but letters and digits and at camelCase humps, stripped of a
// few English endings ("issues", "closing" and "closed" match "issue" and
// "close") and of common words, and the tool vocabulary's synonyms are
// read as one word ("remove" is "delete", "PR" is "pull request"). It is
// built once per catalog and read without locks.
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
				enum, _ := ps["enum"].([]any)
				for _, v := range enum {
					if v, ok := v.(string); ok {
						b.WriteString(v)
						b.WriteByte(' ')
					}
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
	runes := []rune(text)
	start := -1
	flush := func(end int) {
		if start < 0 {
			return
		}
		w := stem(strings.ToLower(string(runes[start:end])))
		start = -1
		if len(w) < 2 || stopWords[w] {
			return
		}
		if syn, ok := vocabulary()[w]; ok {
			out = append(out, syn...)
			return
		}
		out = append(out, w)
	}
	for i, r := range runes {
		if !unicode.IsLetter(r) && !unicode.IsDigit(r) {
			flush(i)
			continue
		}
		// Humps: "listIssues" is "list" and "issues", "CPUUtilization"
		// is "cpu" and "utilization".
		if i > 0 && unicode.IsUpper(r) && (unicode.IsLower(runes[i-1]) ||
			unicode.IsUpper(runes[i-1]) && i+1 < len(runes) && unicode.IsLower(runes[i+1])) {
			flush(i)
		}
		if start < 0 {
			start = i
		}
	}
	flush(len(runes))
	return out
}

// stem strips a few English endings, enough for the words tools are
// described with: plural, -ing, -ed and -ee forms, and a final e, meet
// their stem ("closes", "closing", "closed" and "close" are "clos";
// "assignee" and "assigned" are "assign").
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
	case strings.HasSuffix(w, "ee") && len(w) > 5:
		return w[:len(w)-2]
	case strings.HasSuffix(w, "es") && (strings.HasSuffix(w, "ches") || strings.HasSuffix(w, "shes") || strings.HasSuffix(w, "xes")):
		return w[:len(w)-2]
	case strings.HasSuffix(w, "es") && len(w) > 4:
		return w[:len(w)-2] // "closes" is "clos", as "close" is
	case strings.HasSuffix(w, "s") && !strings.HasSuffix(w, "ss") && !strings.HasSuffix(w, "us") && !strings.HasSuffix(w, "is"):
		return w[:len(w)-1]
	case strings.HasSuffix(w, "e") && len(w) > 4:
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

// stopWords are words too common to tell tools apart.
var stopWords = setOf(`a an and are as at be by can do doe for from how in into is it its
	me my of on or our please so that the their them then there these this to up us was we what when where
	which who will with you your all any some one`)

func setOf(list string) map[string]bool {
	out := map[string]bool{}
	for _, w := range strings.Fields(list) {
		out[w] = true
	}
	return out
}

// synonyms are the tool vocabulary's words that mean the same, each group
// read as its first entry: the verbs of every API and the nouns and
// abbreviations of the services MCP servers front. It is general, not fit
// to one server: a word belongs here only if it means the same in every
// catalog.
var synonyms = [][]string{
	{"delete", "remove", "erase", "destroy", "drop", "trash", "rm"},
	{"create", "new", "make", "add"},
	{"update", "edit", "change", "modify", "set", "rename"},
	{"get", "fetch", "retrieve", "read", "show", "view", "see", "display"},
	{"search", "find", "lookup", "locate", "query"},
	{"send", "post", "tell", "notify", "announce"},
	{"stop", "halt", "shutdown", "kill", "terminate"},
	{"start", "launch", "boot", "run"},
	{"merge", "combine", "squash"},
	{"remind", "reminder", "ping", "nudge"},
	{"share", "invite", "grant"},
	{"latest", "newest", "recent", "last", "current"},
	{"event", "meeting", "appointment"},
	{"comment", "reply", "respond", "response"},
	{"instance", "vm", "server", "machine"},
	{"document", "doc"},
	{"database", "db"},
	{"repository", "repo"},
	{"email", "mail", "gmail"},
	{"configuration", "config", "settings"},
	{"permission", "access", "role", "privilege"},
	{"spreadsheet", "sheet"},
	{"user", "person", "member", "people", "account"},
	{"pull request", "pr", "mr"},
	{"direct message", "dm"},
	{"vacation", "ooo"},
}

// vocabulary maps each word of synonyms, stemmed, to its group's first
// entry, split into words and stemmed.
var vocabulary = sync.OnceValue(func() map[string][]string {
	out := map[string][]string{}
	for _, group := range synonyms {
		var canon []string
		for _, w := range strings.Fields(group[0]) {
			if w = stem(w); !stopWords[w] {
				canon = append(canon, w)
			}
		}
		for _, w := range group {
			if !strings.Contains(w, " ") {
				out[stem(w)] = canon
			}
		}
	}
	return out
})
