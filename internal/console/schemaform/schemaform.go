// Package schemaform turns a tool's input JSON Schema into HTML form
// fields, and a posted form back into the tool's arguments, converted to
// the schema's types and validated against it, with a message per field.
// The console uses it to call a tool from a form and to edit a call's
// arguments before approving it.
//
// A top-level property of type string, integer, number or boolean gets an
// input of its own (a select for an enum); anything else (objects, arrays,
// unions) a textarea of JSON. A schema without properties is edited as one
// JSON object.
package schemaform

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"math"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// JSONField is the name (after the prefix) of the textarea that holds the
// whole arguments object when the schema has no properties.
const JSONField = "json"

// schema is the part of a JSON Schema the form is made from.
type schema struct {
	Type        any                `json:"type"`
	Properties  map[string]*schema `json:"properties"`
	Required    []string           `json:"required"`
	Description string             `json:"description"`
	Title       string             `json:"title"`
	Enum        []any              `json:"enum"`
	Default     any                `json:"default"`
	MaxLength   *int               `json:"maxLength"`
}

// kind is how a property is edited.
type kind int

const (
	kindJSON kind = iota
	kindString
	kindInteger
	kindNumber
	kindBoolean
)

func (s *schema) kind() kind {
	t, _ := s.Type.(string)
	switch t {
	case "string":
		return kindString
	case "integer":
		return kindInteger
	case "number":
		return kindNumber
	case "boolean":
		return kindBoolean
	}
	return kindJSON
}

func parse(raw []byte) (*schema, error) {
	s := &schema{}
	if len(bytes.TrimSpace(raw)) == 0 {
		return s, nil
	}
	if err := json.Unmarshal(raw, s); err != nil {
		return nil, fmt.Errorf("input schema: %w", err)
	}
	return s, nil
}

// field is one property, in the order fields are shown: required ones
// first, then by name.
type field struct {
	Name     string
	S        *schema
	Required bool
}

func (s *schema) fields() []field {
	var out []field
	for name, p := range s.Properties {
		if p == nil {
			p = &schema{}
		}
		out = append(out, field{Name: name, S: p, Required: slices.Contains(s.Required, name)})
	}
	slices.SortFunc(out, func(a, b field) int {
		if a.Required != b.Required {
			if a.Required {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

// view is what the template shows of a field.
type view struct {
	ID, Name, Label, Hint, Error string
	Required                     bool
	Kind                         string // text, textarea, number, select, checkbox, json
	Step                         string
	Value                        string
	Checked                      bool
	Options                      []opt
}

type opt struct {
	Value, Label string
	Selected     bool
}

var fieldsTemplate = template.Must(template.New("fields").Parse(`{{range .}}{{if eq .Kind "none"}}<p class="error" role="alert">{{.Error}}</p>
{{else}}<div class="field">
{{if eq .Kind "checkbox"}}<span><input type="hidden" name="{{.Name}}" value="false"><input type="checkbox" id="{{.ID}}" name="{{.Name}}" value="true"{{if .Checked}} checked{{end}}> <label for="{{.ID}}">{{.Label}}{{if .Required}} (required){{end}}</label></span>
{{else}}<label for="{{.ID}}">{{.Label}}{{if .Required}} (required){{end}}</label>
{{if eq .Kind "select"}}<select id="{{.ID}}" name="{{.Name}}">{{range .Options}}<option value="{{.Value}}"{{if .Selected}} selected{{end}}>{{.Label}}</option>{{end}}</select>
{{else if eq .Kind "textarea"}}<textarea id="{{.ID}}" name="{{.Name}}" rows="4">{{.Value}}</textarea>
{{else if eq .Kind "json"}}<textarea id="{{.ID}}" name="{{.Name}}" rows="5" spellcheck="false">{{.Value}}</textarea>
{{else if eq .Kind "number"}}<input type="number" id="{{.ID}}" name="{{.Name}}" step="{{.Step}}" value="{{.Value}}">
{{else}}<input type="text" id="{{.ID}}" name="{{.Name}}" value="{{.Value}}">
{{end}}{{end}}{{if .Hint}}<small>{{.Hint}}</small>
{{end}}{{if .Error}}<span class="error" role="alert">{{.Error}}</span>
{{end}}</div>
{{end}}{{end}}`))

var unsafeID = regexp.MustCompile(`[^A-Za-z0-9_.:-]`)

// Form renders the fields of a tool's input schema (a JSON object schema)
// for the values given (nil: empty, or the schema's defaults where given).
// prefix is put before every input's name and id, so that several forms
// (one per pending call) share one <form>: prefix "c0." names a property
// city "c0.arg.city". errs maps a property name ("" for the whole object)
// to its message, shown beside it.
func Form(raw []byte, values map[string]any, prefix string, errs map[string]string) (template.HTML, error) {
	s, err := parse(raw)
	if err != nil {
		return "", err
	}
	var views []view
	if len(s.Properties) == 0 {
		v := values
		if v == nil {
			v = map[string]any{}
		}
		b, _ := json.MarshalIndent(v, "", "  ")
		views = append(views, view{ID: "f-" + unsafeID.ReplaceAllString(prefix+JSONField, "_"), Name: prefix + JSONField,
			Label: "Arguments (a JSON object)", Kind: "json", Value: string(b), Error: errs[""]})
	} else {
		if msg := errs[""]; msg != "" {
			views = append(views, view{Kind: "none", Error: msg})
		}
		for _, f := range s.fields() {
			val, has := values[f.Name]
			if !has && values == nil && f.S.Default != nil {
				val, has = f.S.Default, true
			}
			views = append(views, fieldView(f, prefix, val, has, errs[f.Name]))
		}
	}
	var buf bytes.Buffer
	if err := fieldsTemplate.Execute(&buf, views); err != nil {
		return "", err
	}
	return template.HTML(buf.String()), nil //nolint:gosec // made by html/template
}

func fieldView(f field, prefix string, val any, has bool, msg string) view {
	v := view{ID: "f-" + unsafeID.ReplaceAllString(prefix+"arg."+f.Name, "_"), Name: prefix + "arg." + f.Name,
		Label: f.Name, Required: f.Required, Error: msg, Hint: f.S.Description}
	if f.S.Title != "" {
		v.Label = f.S.Title + " (" + f.Name + ")"
	}
	switch k := f.S.kind(); {
	case len(f.S.Enum) > 0 && k != kindJSON:
		v.Kind = "select"
		if !f.Required {
			v.Options = append(v.Options, opt{Value: "", Label: "(not set)", Selected: !has})
		}
		for _, e := range f.S.Enum {
			text := scalar(e)
			v.Options = append(v.Options, opt{Value: text, Label: text, Selected: has && scalar(val) == text})
		}
	case k == kindBoolean && f.Required:
		v.Kind, v.Checked = "checkbox", val == true
	case k == kindBoolean:
		v.Kind = "select"
		v.Options = []opt{{Value: "", Label: "(not set)", Selected: !has},
			{Value: "true", Label: "true", Selected: has && val == true}, {Value: "false", Label: "false", Selected: has && val == false}}
	case k == kindInteger || k == kindNumber:
		v.Kind, v.Step = "number", "any"
		if k == kindInteger {
			v.Step = "1"
		}
		if has {
			v.Value = scalar(val)
		}
	case k == kindString:
		v.Kind = "text"
		if has {
			v.Value = scalar(val)
		}
		if strings.Contains(v.Value, "\n") || f.S.MaxLength != nil && *f.S.MaxLength > 200 {
			v.Kind = "textarea"
		}
	default:
		v.Kind = "json"
		if has {
			b, _ := json.MarshalIndent(val, "", "  ")
			v.Value = string(b)
		}
		if v.Hint != "" {
			v.Hint += " "
		}
		v.Hint += "(JSON)"
	}
	return v
}

// scalar is a value as a form shows it: numbers without an exponent.
func scalar(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case string:
		return v
	case float64:
		if v == math.Trunc(v) && math.Abs(v) < 1e15 {
			return strconv.FormatInt(int64(v), 10)
		}
		return strconv.FormatFloat(v, 'f', -1, 64)
	case json.Number:
		return v.String()
	case bool:
		return strconv.FormatBool(v)
	default:
		b, _ := json.Marshal(v)
		return string(b)
	}
}

// Parse reads the arguments back from a posted form (the same prefix),
// converts each field to its schema type, drops optional fields left
// empty, and validates the result against the schema. errs is nil when
// args are valid; otherwise it maps property names ("" for the whole
// object) to messages that name the problem.
func Parse(raw []byte, form url.Values, prefix string) (args map[string]any, errs map[string]string) {
	s, err := parse(raw)
	if err != nil {
		return nil, map[string]string{"": err.Error()}
	}
	errs = map[string]string{}
	args = map[string]any{}
	if len(s.Properties) == 0 {
		text := strings.TrimSpace(form.Get(prefix + JSONField))
		if text != "" {
			v, err := decodeJSON(text)
			obj, ok := v.(map[string]any)
			switch {
			case err != nil:
				errs[""] = "the arguments are not valid JSON: " + err.Error()
			case !ok:
				errs[""] = "the arguments must be a JSON object"
			default:
				args = obj
			}
		}
	} else {
		for _, f := range s.fields() {
			text, posted := lastValue(form, prefix+"arg."+f.Name)
			v, present, msg := convert(f, text, posted)
			if msg != "" {
				errs[f.Name] = msg
				continue
			}
			if present {
				args[f.Name] = v
			} else if f.Required {
				errs[f.Name] = "required"
			}
		}
	}
	if len(errs) == 0 {
		validate(raw, args, errs)
	}
	if len(errs) == 0 {
		return args, nil
	}
	return args, errs
}

// lastValue is a field's last value: a required boolean posts a hidden
// "false" before its checkbox's "true".
func lastValue(form url.Values, name string) (string, bool) {
	vs, ok := form[name]
	if !ok || len(vs) == 0 {
		return "", false
	}
	return vs[len(vs)-1], true
}

// convert reads one field's text as its type; present is false for an
// optional field left empty.
func convert(f field, text string, posted bool) (v any, present bool, msg string) {
	trimmed := strings.TrimSpace(text)
	k := f.S.kind()
	if k != kindString && trimmed == "" || k == kindString && !posted {
		return nil, false, ""
	}
	if k == kindString && text == "" && !f.Required {
		return nil, false, ""
	}
	switch k {
	case kindString:
		return text, true, ""
	case kindInteger:
		n, err := strconv.ParseInt(trimmed, 10, 64)
		if err != nil {
			return nil, false, fmt.Sprintf("want an integer, got %q", trimmed)
		}
		return n, true, ""
	case kindNumber:
		n, err := strconv.ParseFloat(trimmed, 64)
		if err != nil || math.IsInf(n, 0) || math.IsNaN(n) {
			return nil, false, fmt.Sprintf("want a number, got %q", trimmed)
		}
		return n, true, ""
	case kindBoolean:
		switch trimmed {
		case "true", "on":
			return true, true, ""
		case "false":
			return false, true, ""
		}
		return nil, false, fmt.Sprintf("want true or false, got %q", trimmed)
	}
	val, err := decodeJSON(trimmed)
	if err != nil {
		return nil, false, "not valid JSON: " + err.Error()
	}
	return val, true, ""
}

// decodeJSON decodes one JSON value, keeping integers exact.
func decodeJSON(text string) (any, error) {
	d := json.NewDecoder(strings.NewReader(text))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if d.More() {
		return nil, errors.New("more than one value")
	}
	return numbers(v), nil
}

// numbers turns json.Numbers into int64 where integral, float64 otherwise.
func numbers(v any) any {
	switch v := v.(type) {
	case json.Number:
		if n, err := v.Int64(); err == nil {
			return n
		}
		f, _ := v.Float64()
		return f
	case map[string]any:
		for k, e := range v {
			v[k] = numbers(e)
		}
	case []any:
		for i, e := range v {
			v[i] = numbers(e)
		}
	}
	return v
}

// validate checks args against the schema; a schema that does not
// compile checks nothing (the server has the last word).
func validate(raw []byte, args map[string]any, errs map[string]string) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("tool.json", doc); err != nil {
		return
	}
	sch, err := c.Compile("tool.json")
	if err != nil {
		return
	}
	// The validator wants JSON's own types: round-trip the arguments.
	b, err := json.Marshal(args)
	if err != nil {
		errs[""] = err.Error()
		return
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		errs[""] = err.Error()
		return
	}
	verr := sch.Validate(inst)
	var ve *jsonschema.ValidationError
	if verr == nil || !errors.As(verr, &ve) {
		return
	}
	for _, leaf := range leaves(ve) {
		key := ""
		if len(leaf.InstanceLocation) > 0 {
			key = leaf.InstanceLocation[0]
		}
		msg := leaf.ErrorKind.LocalizedString(printer)
		if len(leaf.InstanceLocation) > 1 {
			msg = "/" + strings.Join(leaf.InstanceLocation[1:], "/") + ": " + msg
		}
		if errs[key] == "" {
			errs[key] = msg
		}
	}
}

var printer = message.NewPrinter(language.English)

// leaves are the innermost causes of a validation error.
func leaves(e *jsonschema.ValidationError) []*jsonschema.ValidationError {
	if len(e.Causes) == 0 {
		return []*jsonschema.ValidationError{e}
	}
	var out []*jsonschema.ValidationError
	for _, c := range e.Causes {
		out = append(out, leaves(c)...)
	}
	return out
}
