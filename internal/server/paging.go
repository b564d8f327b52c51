package server

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"strings"
)

// pageTokenPrefix versions the token format; the rest is the last key seen.
const pageTokenPrefix = "v1:"

// page checks page_size and page_token and returns the size to serve and
// the key to list after.
func (c *checker) page(size int32, token string, def int) (int, string) {
	n := int(size)
	switch {
	case size < 0:
		c.add("page_size", "must not be negative")
	case size == 0:
		n = def
	case size > maxPageSize:
		n = maxPageSize
	}
	if token == "" {
		return n, ""
	}
	raw, err := base64.RawURLEncoding.DecodeString(token)
	after, ok := strings.CutPrefix(string(raw), pageTokenPrefix)
	if err != nil || !ok || after == "" {
		c.add("page_token", "not a token from a previous response")
	}
	return n, after
}

// nextPage trims items, fetched with one extra, to size and returns the
// token of the next page, empty on the last.
func nextPage[T any](items []T, size int, key func(T) string) ([]T, string) {
	if len(items) <= size {
		return items, ""
	}
	items = items[:size]
	return items, base64.RawURLEncoding.EncodeToString([]byte(pageTokenPrefix + key(items[size-1])))
}

// pageFilter is the filters of a listing, hashed, that its page tokens
// carry: a token then only goes on with a listing of the same filters.
func pageFilter(filters ...string) string {
	h := sha256.New()
	for _, f := range filters {
		h.Write([]byte(f))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// filteredPage is page for a listing whose tokens carry its filter
// (pageFilter): a token of a listing with other filters is refused, not
// read as a place in this one.
func (c *checker) filteredPage(size int32, token string, def int, filter string) (int, string) {
	seen := len(c.violations)
	n, after := c.page(size, token, def)
	if token == "" || len(c.violations) > seen {
		return n, ""
	}
	f, key, ok := strings.Cut(after, "/")
	if !ok || f != filter || key == "" {
		c.add("page_token", "not from a listing with these filters: a page token goes on with the same request it came "+
			"from, only page_size may change; start again without page_token")
		return n, ""
	}
	return n, key
}

// nextFilteredPage is nextPage for a listing whose tokens carry its
// filter.
func nextFilteredPage[T any](items []T, size int, filter string, key func(T) string) ([]T, string) {
	return nextPage(items, size, func(item T) string { return filter + "/" + key(item) })
}
