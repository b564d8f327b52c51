package ask

import (
	"maps"
	"slices"
)

// Form defaults (SEP-1034): a field of a form's requested schema may give
// a default, and a client that accepts the form without that field sends
// the default in its place.

// defaults are the default values schema's properties give, by field.
func defaults(schema map[string]any) map[string]any {
	props, _ := schema["properties"].(map[string]any)
	var out map[string]any
	for name, p := range props {
		prop, _ := p.(map[string]any)
		if v, ok := prop["default"]; ok {
			if out == nil {
				out = map[string]any{}
			}
			out[name] = v
		}
	}
	return out
}

// DefaultedFields names, sorted, the fields of a form's schema that have
// a default; nil if none.
func DefaultedFields(schema map[string]any) []string {
	d := defaults(schema)
	if len(d) == 0 {
		return nil
	}
	return slices.Sorted(maps.Keys(d))
}

// WithDefaults is content with every field of schema that it leaves out
// and that has a default set to that default. content itself is not
// changed; a nil content with no defaults stays nil.
func WithDefaults(schema, content map[string]any) map[string]any {
	d := defaults(schema)
	if len(d) == 0 {
		return content
	}
	out := maps.Clone(content)
	if out == nil {
		out = make(map[string]any, len(d))
	}
	for name, v := range d {
		if _, ok := out[name]; !ok {
			out[name] = v
		}
	}
	return out
}
