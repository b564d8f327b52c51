package schemaform

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/url"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
)

// Parse reads the arguments back from a posted form (the same prefix),
// converts each field to its schema type, drops optional fields left empty,
// and validates the result against the schema. errs is nil when args are valid;
// otherwise it maps field names ("" for the whole object) to messages that name the problem
// (e.g. `"count": want an integer, got "abc"`, `"city": required`).
func Parse(schema []byte, form url.Values, prefix string) (args map[string]any, errs map[string]string) {
	s := readShape(schema)
	errs = map[string]string{}
	args = map[string]any{}

	if s.fields == nil {
		raw, _ := last(form, prefix+"json")
		text := strings.TrimSpace(raw)
		if text != "" {
			v, err := decodeJSON(text)
			if err != nil {
				errs[""] = "the arguments are not valid JSON: " + err.Error()
				return args, errs
			}
			obj, ok := v.(map[string]any)
			if !ok {
				errs[""] = "the arguments must be a JSON object"
				return args, errs
			}
			args = obj
		}
	} else {
		for _, f := range s.fields {
			raw, posted := last(form, prefix+"arg."+f.name)
			v, ok, msg := readField(f, raw, posted)
			if msg != "" {
				errs[f.name] = msg
			} else if ok {
				args[f.name] = v
			}
		}
		if raw, _ := last(form, prefix+"extra"); strings.TrimSpace(raw) != "" {
			text := strings.TrimSpace(raw)
			v, err := decodeJSON(text)
			obj, isObj := v.(map[string]any)
			switch {
			case err != nil:
				errs[""] = "the other arguments are not valid JSON: " + err.Error()
			case !isObj:
				errs[""] = "the other arguments must be a JSON object"
			default:
				for k, v := range obj {
					if s.byName[k] == nil {
						args[k] = v
					}
				}
			}
		}
	}

	// Schema validation; a field that could not be read keeps its own message.
	if sch := compileSchema(schema); sch != nil {
		if err := sch.Validate(args); err != nil {
			for key, msg := range validationErrors(err) {
				if _, taken := errs[key]; taken && key != "" {
					continue
				}
				if old := errs[key]; old != "" {
					msg = old + "; " + msg
				}
				errs[key] = msg
			}
		}
	}
	if len(errs) == 0 {
		errs = nil
	}
	return args, errs
}

// readField converts one posted field to its schema type. ok is false when
// the field is omitted; msg is set when it cannot be read. posted is
// false when the form has no such input at all.
func readField(f field, raw string, posted bool) (v any, ok bool, msg string) {
	q := strconv.Quote(f.name)
	text := strings.TrimSpace(raw)
	typ := f.kind
	if f.kind == kindSelect {
		typ = f.typ
	}
	if typ == kindText || typ == "string" {
		// A string is kept as typed; an empty optional one is omitted,
		// an empty required one is kept ("" may be a valid value), unless
		// the form did not post it at all.
		if raw == "" && (!f.required || !posted) {
			return nil, false, ""
		}
		return raw, true, ""
	}
	if text == "" {
		if f.required {
			return nil, false, q + ": required"
		}
		return nil, false, ""
	}
	switch typ {
	case kindInteger:
		n, err := strconv.ParseInt(text, 10, 64)
		if err != nil {
			return nil, false, fmt.Sprintf("%s: want an integer, got %q", q, text)
		}
		return n, true, ""
	case kindNumber:
		n, err := strconv.ParseFloat(text, 64)
		if err != nil || math.IsInf(n, 0) || math.IsNaN(n) {
			return nil, false, fmt.Sprintf("%s: want a number, got %q", q, text)
		}
		return n, true, ""
	case kindBool:
		switch strings.ToLower(text) {
		case "true", "on":
			return true, true, ""
		case "false":
			return false, true, ""
		}
		return nil, false, fmt.Sprintf("%s: want true or false, got %q", q, text)
	default: // kindJSON
		v, err := decodeJSON(text)
		if err != nil {
			return nil, false, fmt.Sprintf("%s: not valid JSON: %v", q, err)
		}
		return v, true, ""
	}
}

// last is the last value posted under name, and whether there is one: a
// required boolean posts its hidden "false" first and, when checked, "true" after.
func last(form url.Values, name string) (string, bool) {
	vs := form[name]
	if len(vs) == 0 {
		return "", false
	}
	return vs[len(vs)-1], true
}

// decodeJSON reads one JSON value. Numbers become int64 when integral and
// in range, float64 otherwise, so the result marshals as it was written.
func decodeJSON(text string) (any, error) {
	dec := json.NewDecoder(strings.NewReader(text))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if strings.TrimSpace(text[dec.InputOffset():]) != "" {
		return nil, errors.New("text after the JSON value")
	}
	return plainNumbers(v), nil
}

// plainNumbers replaces json.Number values inside v with int64 or float64.
func plainNumbers(v any) any {
	switch v := v.(type) {
	case json.Number:
		if n, err := v.Int64(); err == nil {
			return n
		}
		if f, err := v.Float64(); err == nil {
			return f
		}
		return v
	case map[string]any:
		for k, e := range v {
			v[k] = plainNumbers(e)
		}
		return v
	case []any:
		for i, e := range v {
			v[i] = plainNumbers(e)
		}
		return v
	}
	return v
}

// compileSchema compiles the schema, or gives nil when it is missing or
// does not compile (then nothing is validated). References to other
// documents are not loaded: schemas come from MCP servers.
func compileSchema(schema []byte) *jsonschema.Schema {
	if len(bytes.TrimSpace(schema)) == 0 {
		return nil
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schema))
	if err != nil {
		return nil
	}
	const u = "mem://schemaform/input.json"
	c := jsonschema.NewCompiler()
	c.UseLoader(loadNothing{})
	if err := c.AddResource(u, doc); err != nil {
		return nil
	}
	sch, err := c.Compile(u)
	if err != nil {
		return nil
	}
	return sch
}

type loadNothing struct{}

func (loadNothing) Load(u string) (any, error) {
	return nil, fmt.Errorf("a tool schema may not load %s", u)
}

// validationErrors maps the validator's error to top-level property names
// ("" for the object itself), one short message per leaf error.
func validationErrors(err error) map[string]string {
	out := map[string]string{}
	add := func(key, msg string) {
		if old, ok := out[key]; ok {
			if strings.Contains(old, msg) {
				return
			}
			msg = old + "; " + msg
		}
		out[key] = msg
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		add("", err.Error())
		return out
	}
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) > 0 {
			for _, c := range e.Causes {
				walk(c)
			}
			return
		}
		loc := e.InstanceLocation
		if req, ok := e.ErrorKind.(*kind.Required); ok {
			// A missing property is reported on the property itself.
			for _, m := range req.Missing {
				path := append(append([]string{}, loc...), m)
				add(path[0], strconv.Quote(strings.Join(path, "/"))+": required")
			}
			return
		}
		msg := kindMessage(e)
		if len(loc) == 0 {
			add("", msg)
			return
		}
		add(loc[0], strconv.Quote(strings.Join(loc, "/"))+": "+msg)
	}
	walk(ve)
	return out
}

// kindMessage is the validator's message for one error, without the
// instance location it starts with.
func kindMessage(e *jsonschema.ValidationError) string {
	leaf := &jsonschema.ValidationError{SchemaURL: e.SchemaURL, ErrorKind: e.ErrorKind}
	s := leaf.Error()
	if rest, ok := strings.CutPrefix(s, "at '': "); ok {
		return rest
	}
	return s
}
