// Package schemaform owns the console's forms for MCP tool arguments: it
// turns a tool's input JSON Schema and the current arguments into HTML
// form fields (Form), and a posted form back into an arguments object,
// converted to the schema's types and validated against it (Parse).
//
// Each top-level property gets one field. Properties whose type the form
// cannot show as a simple input (objects, arrays, oneOf, type lists, no
// type) are edited as JSON in a textarea. A schema without properties is
// edited as one JSON textarea holding the whole arguments object.
package schemaform

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html"
	"html/template"
	"math"
	"sort"
	"strconv"
	"strings"
)

// Field kinds: how a property is shown and read back.
const (
	kindText    = "text"    // string: text input or textarea
	kindSelect  = "select"  // string, integer or number with an enum
	kindInteger = "integer" // number input, step 1
	kindNumber  = "number"  // number input, step any
	kindBool    = "boolean" // checkbox (required) or three-way select
	kindJSON    = "json"    // textarea of JSON
)

// field is one top-level property of the schema.
type field struct {
	name     string
	kind     string
	typ      string // the schema type for kindSelect ("string", "integer", "number")
	required bool
	desc     string
	enum     []any
	long     bool // maxLength > 200: a textarea
	def      any
	hasDef   bool
}

// shape is what the form knows of a schema.
type shape struct {
	fields []field // nil: the whole object is one JSON textarea
	byName map[string]*field
}

// readShape reads the top-level properties of schema. A schema that is
// empty, not JSON, not an object schema or without properties gives a
// shape without fields.
func readShape(schema []byte) shape {
	var s shape
	if len(bytes.TrimSpace(schema)) == 0 {
		return s
	}
	dec := json.NewDecoder(bytes.NewReader(schema))
	dec.UseNumber()
	var doc map[string]any
	if err := dec.Decode(&doc); err != nil {
		return s
	}
	if t, ok := doc["type"]; ok && t != "object" {
		return s
	}
	props, _ := doc["properties"].(map[string]any)
	if len(props) == 0 {
		return s
	}
	req := map[string]bool{}
	if list, ok := doc["required"].([]any); ok {
		for _, r := range list {
			if name, ok := r.(string); ok {
				req[name] = true
			}
		}
	}
	for name, p := range props {
		pm, _ := p.(map[string]any)
		f := field{name: name, required: req[name], kind: kindJSON}
		if pm != nil {
			f.desc, _ = pm["description"].(string)
			f.def, f.hasDef = pm["default"]
			enum, _ := pm["enum"].([]any)
			typ, _ := pm["type"].(string)
			_, oneOf := pm["oneOf"]
			_, anyOf := pm["anyOf"]
			_, allOf := pm["allOf"]
			if !oneOf && !anyOf && !allOf {
				switch typ {
				case "string":
					f.kind = kindText
					if n, ok := pm["maxLength"].(json.Number); ok {
						if v, err := n.Int64(); err == nil && v > 200 {
							f.long = true
						}
					}
				case "integer":
					f.kind = kindInteger
				case "number":
					f.kind = kindNumber
				case "boolean":
					f.kind = kindBool
				}
				if len(enum) > 0 && (typ == "string" || typ == "integer" || typ == "number") {
					f.kind, f.typ, f.enum = kindSelect, typ, enum
				}
			}
		}
		s.fields = append(s.fields, f)
	}
	// Required properties first, then by name.
	sort.Slice(s.fields, func(i, j int) bool {
		a, b := s.fields[i], s.fields[j]
		if a.required != b.required {
			return a.required
		}
		return a.name < b.name
	})
	s.byName = map[string]*field{}
	for i := range s.fields {
		s.byName[s.fields[i].name] = &s.fields[i]
	}
	return s
}

// Form renders the fields of a tool's input schema (a JSON object schema)
// for the values given (nil: empty, or the schema's defaults where given).
// prefix is put before every input's name and id, so that several forms
// (one per pending call) share one <form>: e.g. prefix "c0." gives names "c0.arg.city".
// errs maps a field name (a top-level property, or "" for the whole form) to its message, shown beside it.
func Form(schema []byte, values map[string]any, prefix string, errs map[string]string) (template.HTML, error) {
	s := readShape(schema)
	var b strings.Builder

	if s.fields == nil {
		text := "{}"
		if len(values) > 0 {
			j, err := prettyJSON(values)
			if err != nil {
				return "", fmt.Errorf("schemaform: arguments: %w", err)
			}
			text = j
		}
		// Every message goes beside the one textarea.
		var msgs []string
		if m := errs[""]; m != "" {
			msgs = append(msgs, m)
		}
		for _, k := range sortedKeys(errs) {
			if k != "" && errs[k] != "" {
				msgs = append(msgs, errs[k])
			}
		}
		writeTextarea(&b, prefix+"json", "Arguments (JSON)", "", true, text, strings.Join(msgs, "; "), true)
		return template.HTML(b.String()), nil
	}

	// Messages not about a field shown here go at the top.
	var top []string
	if m := errs[""]; m != "" {
		top = append(top, m)
	}
	for _, k := range sortedKeys(errs) {
		if k != "" && s.byName[k] == nil && errs[k] != "" {
			top = append(top, errs[k])
		}
	}
	if len(top) > 0 {
		fmt.Fprintf(&b, "<p class=\"error\" role=\"alert\">%s</p>\n", esc(strings.Join(top, "; ")))
	}

	for _, f := range s.fields {
		v, has := values[f.name]
		if values == nil && f.hasDef {
			v, has = f.def, true
		}
		if err := writeField(&b, prefix, f, v, has, errs[f.name]); err != nil {
			return "", err
		}
	}

	// Arguments the schema does not name are kept in a JSON textarea of
	// their own, so that editing a call does not silently drop them.
	extra := map[string]any{}
	for k, v := range values {
		if s.byName[k] == nil {
			extra[k] = v
		}
	}
	if len(extra) > 0 {
		j, err := prettyJSON(extra)
		if err != nil {
			return "", fmt.Errorf("schemaform: other arguments: %w", err)
		}
		writeTextarea(&b, prefix+"extra", "Other arguments (JSON)", "Arguments the tool's schema does not list.", false, j, "", true)
	}
	return template.HTML(b.String()), nil
}

// writeField writes one property's field.
func writeField(b *strings.Builder, prefix string, f field, v any, has bool, msg string) error {
	name := prefix + "arg." + f.name
	id := sanitizeID(name)

	switch f.kind {
	case kindText:
		text := ""
		if has {
			text = scalarText(v)
		}
		if f.long || strings.ContainsAny(text, "\n\r") {
			writeTextarea(b, name, f.name, f.desc, f.required, text, msg, false)
			return nil
		}
		open(b, id, f.name, f.desc, f.required)
		fmt.Fprintf(b, "<input type=\"text\" name=\"%s\" id=\"%s\" value=\"%s\"%s>\n", esc(name), esc(id), esc(text), aria(id, f.desc, f.required, msg))
		closeField(b, id, msg)

	case kindInteger, kindNumber:
		text := ""
		if has {
			text = scalarText(v)
		}
		step := "1"
		if f.kind == kindNumber {
			step = "any"
		}
		open(b, id, f.name, f.desc, f.required)
		fmt.Fprintf(b, "<input type=\"number\" step=\"%s\" name=\"%s\" id=\"%s\" value=\"%s\"%s>\n", step, esc(name), esc(id), esc(text), aria(id, f.desc, f.required, msg))
		closeField(b, id, msg)

	case kindSelect:
		cur := ""
		if has && v != nil {
			cur = scalarText(v)
		}
		open(b, id, f.name, f.desc, f.required)
		fmt.Fprintf(b, "<select name=\"%s\" id=\"%s\"%s>\n", esc(name), esc(id), aria(id, f.desc, f.required, msg))
		found := false
		var opts strings.Builder
		for _, e := range f.enum {
			t := scalarText(e)
			sel := ""
			if has && t == cur && !found {
				sel, found = " selected", true
			}
			fmt.Fprintf(&opts, "<option value=\"%s\"%s>%s</option>\n", esc(t), sel, esc(t))
		}
		if !f.required {
			sel := ""
			if !has || v == nil {
				sel = " selected"
			}
			fmt.Fprintf(b, "<option value=\"\"%s>(not set)</option>\n", sel)
		}
		// A current value outside the enum is shown, so that it is seen
		// (and reported when posted back) rather than silently replaced.
		if has && v != nil && !found {
			fmt.Fprintf(b, "<option value=\"%s\" selected>%s (not allowed)</option>\n", esc(cur), esc(cur))
		}
		b.WriteString(opts.String())
		b.WriteString("</select>\n")
		closeField(b, id, msg)

	case kindBool:
		val, isBool := v.(bool)
		if !has {
			isBool = false
		}
		open(b, id, f.name, f.desc, f.required)
		if f.required {
			// The hidden input posts false when the box is left unchecked;
			// a checked box posts true after it, and the last value wins.
			checked := ""
			if isBool && val {
				checked = " checked"
			}
			fmt.Fprintf(b, "<input type=\"hidden\" name=\"%s\" value=\"false\">\n", esc(name))
			fmt.Fprintf(b, "<input type=\"checkbox\" name=\"%s\" id=\"%s\" value=\"true\"%s%s>\n", esc(name), esc(id), checked, aria(id, f.desc, false, msg))
		} else {
			sel := [3]string{}
			switch {
			case isBool && val:
				sel[1] = " selected"
			case isBool && !val:
				sel[2] = " selected"
			default:
				sel[0] = " selected"
			}
			fmt.Fprintf(b, "<select name=\"%s\" id=\"%s\"%s>\n", esc(name), esc(id), aria(id, f.desc, false, msg))
			fmt.Fprintf(b, "<option value=\"\"%s>(not set)</option>\n<option value=\"true\"%s>true</option>\n<option value=\"false\"%s>false</option>\n</select>\n", sel[0], sel[1], sel[2])
		}
		closeField(b, id, msg)

	default: // kindJSON
		text := ""
		if has {
			j, err := prettyJSON(v)
			if err != nil {
				return fmt.Errorf("schemaform: %q: %w", f.name, err)
			}
			text = j
		}
		writeTextarea(b, name, f.name, f.desc, f.required, text, msg, true)
	}
	return nil
}

// writeTextarea writes a whole field holding a textarea.
func writeTextarea(b *strings.Builder, name, label, desc string, required bool, text, msg string, isJSON bool) {
	id := sanitizeID(name)
	open(b, id, label, desc, required)
	class := ""
	if isJSON {
		class = " class=\"json\""
	}
	// A newline right after <textarea> is dropped by browsers, so one is
	// always written before the text to keep a leading newline of its own.
	fmt.Fprintf(b, "<textarea name=\"%s\" id=\"%s\"%s rows=\"%d\"%s>\n%s</textarea>\n", esc(name), esc(id), class, rows(text), aria(id, desc, required, msg), esc(text))
	closeField(b, id, msg)
}

// open starts a field: its div, label and hint.
func open(b *strings.Builder, id, label, desc string, required bool) {
	b.WriteString("<div class=\"field\">\n")
	fmt.Fprintf(b, "<label for=\"%s\">%s", esc(id), esc(label))
	if required {
		b.WriteString(" <span class=\"required\">(required)</span>")
	}
	b.WriteString("</label>\n")
	if desc != "" {
		fmt.Fprintf(b, "<small id=\"%s-hint\">%s</small>\n", esc(id), esc(desc))
	}
}

// closeField writes the error message, if any, and ends the field.
func closeField(b *strings.Builder, id, msg string) {
	if msg != "" {
		fmt.Fprintf(b, "<span class=\"error\" role=\"alert\" id=\"%s-error\">%s</span>\n", esc(id), esc(msg))
	}
	b.WriteString("</div>\n")
}

// aria gives an input's accessibility attributes. The HTML "required"
// attribute is not used: the browser would then refuse to post the whole
// <form>, which may hold other calls, or a button that rejects this one.
func aria(id, desc string, required bool, msg string) string {
	var parts []string
	var by []string
	if desc != "" {
		by = append(by, id+"-hint")
	}
	if msg != "" {
		by = append(by, id+"-error")
		parts = append(parts, ` aria-invalid="true"`)
	}
	if len(by) > 0 {
		parts = append(parts, ` aria-describedby="`+esc(strings.Join(by, " "))+`"`)
	}
	if required {
		parts = append(parts, ` aria-required="true"`)
	}
	return strings.Join(parts, "")
}

// rows sizes a textarea to its text, within bounds.
func rows(text string) int {
	n := strings.Count(text, "\n") + 2
	if n < 3 {
		n = 3
	}
	if n > 20 {
		n = 20
	}
	return n
}

func esc(s string) string { return html.EscapeString(s) }

// sanitizeID makes name a valid, CSS-friendly id: letters, digits and
// - _ . : are kept, anything else becomes _, and it starts with a letter.
func sanitizeID(name string) string {
	var b strings.Builder
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.', r == ':':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	id := b.String()
	if id == "" || !(id[0] >= 'a' && id[0] <= 'z' || id[0] >= 'A' && id[0] <= 'Z') {
		id = "f-" + id
	}
	return id
}

// scalarText prints a value for a text or number input: strings as they
// are, numbers without an exponent when integral, anything else as JSON.
func scalarText(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case string:
		return v
	case json.Number:
		if _, err := v.Int64(); err == nil {
			return v.String()
		}
		if f, err := v.Float64(); err == nil {
			return formatFloat(f)
		}
		return v.String()
	case float64:
		return formatFloat(v)
	case float32:
		return formatFloat(float64(v))
	case int:
		return strconv.Itoa(v)
	case int64:
		return strconv.FormatInt(v, 10)
	case int32:
		return strconv.FormatInt(int64(v), 10)
	case uint64:
		return strconv.FormatUint(v, 10)
	case bool:
		return strconv.FormatBool(v)
	}
	j, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(j)
}

func formatFloat(f float64) string {
	if f == math.Trunc(f) && math.Abs(f) < 1e21 {
		return strconv.FormatFloat(f, 'f', -1, 64)
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// prettyJSON prints v as indented JSON, without escaping < > & (the HTML
// escaping is done when the text is written into the page).
func prettyJSON(v any) (string, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return "", err
	}
	return strings.TrimSuffix(buf.String(), "\n"), nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
