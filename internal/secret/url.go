package secret

import "strings"

// Redacted stands in for a secret value wherever the service shows one.
const Redacted = "REDACTED"

// Param is one name=value pair of a URL's query string, both as written in
// the URL, still percent-encoded. A name without '=' has an empty value.
type Param struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// SplitURL separates the query values from rawURL: it returns rawURL with
// every non-empty query value replaced by Redacted, and the query's
// parameters in order, repeated names repeated. A URL without a query
// string comes back as it is, with no parameters.
func SplitURL(rawURL string) (redacted string, query []Param) {
	head, raw, hasQuery, tail := cutQuery(rawURL)
	if !hasQuery {
		return rawURL, nil
	}
	query = parseQuery(raw)
	shown := make([]Param, len(query))
	for i, p := range query {
		shown[i] = Param{Name: p.Name}
		if p.Value != "" {
			shown[i].Value = Redacted
		}
	}
	return head + "?" + formatQuery(shown) + tail, query
}

// JoinURL puts query back into a URL that SplitURL redacted: it returns
// redactedURL with its query string replaced by query. No parameters leave
// redactedURL as it is.
func JoinURL(redactedURL string, query []Param) string {
	if len(query) == 0 {
		return redactedURL
	}
	head, _, _, tail := cutQuery(redactedURL)
	return head + "?" + formatQuery(query) + tail
}

// cutQuery splits rawURL around its query string the way url.Parse does:
// the fragment starts at the first '#', the query at the first '?' before
// it. tail is the fragment with its '#', or empty.
func cutQuery(rawURL string) (head, query string, hasQuery bool, tail string) {
	rest, fragment, hasFragment := strings.Cut(rawURL, "#")
	if hasFragment {
		tail = "#" + fragment
	}
	head, query, hasQuery = strings.Cut(rest, "?")
	return head, query, hasQuery, tail
}

func parseQuery(raw string) []Param {
	var query []Param
	for piece := range strings.SplitSeq(raw, "&") {
		if piece == "" {
			continue
		}
		name, value, _ := strings.Cut(piece, "=")
		query = append(query, Param{Name: name, Value: value})
	}
	return query
}

func formatQuery(query []Param) string {
	var b strings.Builder
	for i, p := range query {
		if i > 0 {
			b.WriteByte('&')
		}
		b.WriteString(p.Name + "=" + p.Value)
	}
	return b.String()
}
