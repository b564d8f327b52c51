package server

import (
	"encoding/base64"
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
