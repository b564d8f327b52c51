package schemaform

import (
	"encoding/json"
	"html"
	"net/url"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// Schemas like the MCP reference server's tools.
const (
	addSchema  = `{"type":"object","properties":{"a":{"type":"number","description":"First number"},"b":{"type":"number","description":"Second number"}},"required":["a","b"]}`
	echoSchema = `{"type":"object","properties":{"message":{"type":"string","description":"Message to echo"}},"required":["message"]}`
	enumSchema = `{"type":"object","properties":{"city":{"type":"string"},"unit":{"type":"string","enum":["celsius","fahrenheit"],"default":"celsius"},"days":{"type":"integer","minimum":1,"maximum":7}},"required":["city"]}`
	boolSchema = `{"type":"object","properties":{"confirm":{"type":"boolean"},"verbose":{"type":"boolean","description":"More output"}},"required":["confirm"]}`
	nestSchema = `{"type":"object","properties":{"address":{"type":"object","properties":{"street":{"type":"string"},"zip":{"type":"integer"}},"required":["zip"]},"tags":{"type":"array","items":{"type":"string"}},"ids":{"type":"array","items":{"type":"integer"}},"level":{"type":"integer","enum":[1,2,3]}},"required":["address"]}`
)

var (
	inputRE    = regexp.MustCompile(`<input ([^>]*)>`)
	selectRE   = regexp.MustCompile(`(?s)<select ([^>]*)>(.*?)</select>`)
	optionRE   = regexp.MustCompile(`<option ([^>]*)>`)
	textareaRE = regexp.MustCompile(`(?s)<textarea ([^>]*)>(.*?)</textarea>`)
	attrRE     = regexp.MustCompile(`([a-z-]+)(?:="([^"]*)")?`)
)

func attrs(s string) map[string]string {
	m := map[string]string{}
	for _, a := range attrRE.FindAllStringSubmatch(s, -1) {
		m[a[1]] = html.UnescapeString(a[2])
	}
	return m
}

// post is what a browser posts for the fields of page, left as rendered.
func post(t *testing.T, page string, into url.Values) url.Values {
	t.Helper()
	if into == nil {
		into = url.Values{}
	}
	for _, m := range inputRE.FindAllStringSubmatch(page, -1) {
		a := attrs(m[1])
		if a["type"] == "checkbox" {
			if _, on := a["checked"]; !on {
				continue
			}
		}
		into.Add(a["name"], a["value"])
	}
	for _, m := range selectRE.FindAllStringSubmatch(page, -1) {
		a := attrs(m[1])
		opts := optionRE.FindAllStringSubmatch(m[2], -1)
		if len(opts) == 0 {
			t.Fatalf("select %q has no options", a["name"])
		}
		val := attrs(opts[0][1])["value"]
		for _, o := range opts {
			oa := attrs(o[1])
			if _, sel := oa["selected"]; sel {
				val = oa["value"]
				break
			}
		}
		into.Add(a["name"], val)
	}
	for _, m := range textareaRE.FindAllStringSubmatch(page, -1) {
		a := attrs(m[1])
		// Browsers drop the newline right after <textarea>.
		into.Add(a["name"], html.UnescapeString(strings.TrimPrefix(m[2], "\n")))
	}
	return into
}

func form(t *testing.T, schema string, values map[string]any, prefix string, errs map[string]string) string {
	t.Helper()
	h, err := Form([]byte(schema), values, prefix, errs)
	if err != nil {
		t.Fatalf("Form: %v", err)
	}
	return string(h)
}

func TestRoundTrip(t *testing.T) {
	tests := []struct {
		name   string
		schema string
		values map[string]any
		want   map[string]any // nil: values
	}{
		{"add", addSchema, map[string]any{"a": 3.5, "b": 2.0}, nil},
		{"add json.Number", addSchema, map[string]any{"a": json.Number("1e3"), "b": json.Number("-0.25")}, map[string]any{"a": 1000.0, "b": -0.25}},
		{"echo", echoSchema, map[string]any{"message": "hello"}, nil},
		{"echo multiline", echoSchema, map[string]any{"message": "line one\n\nline three\n"}, nil},
		{"echo empty", echoSchema, map[string]any{"message": ""}, nil},
		{"enum set", enumSchema, map[string]any{"city": "Paris", "unit": "fahrenheit", "days": int64(3)}, nil},
		{"enum unset", enumSchema, map[string]any{"city": "Paris"}, nil},
		{"integer as int", enumSchema, map[string]any{"city": "Oslo", "days": 5}, map[string]any{"city": "Oslo", "days": int64(5)}},
		{"integer as float", enumSchema, map[string]any{"city": "Oslo", "days": 5.0}, map[string]any{"city": "Oslo", "days": int64(5)}},
		{"bool checked", boolSchema, map[string]any{"confirm": true, "verbose": false}, nil},
		{"bool unchecked", boolSchema, map[string]any{"confirm": false}, nil},
		{"bool optional true", boolSchema, map[string]any{"confirm": false, "verbose": true}, nil},
		{"nested", nestSchema, map[string]any{
			"address": map[string]any{"street": "1 <Main> St", "zip": int64(12345)},
			"tags":    []any{"a", "b"},
			"ids":     []any{int64(9007199254740993)},
			"level":   int64(2),
		}, nil},
		{"nested from json.Number", nestSchema, map[string]any{
			"address": map[string]any{"zip": json.Number("7")},
		}, map[string]any{"address": map[string]any{"zip": int64(7)}}},
		{"no schema", ``, map[string]any{"x": "y", "n": int64(1)}, nil},
		{"empty schema", `{}`, map[string]any{"x": []any{true}}, nil},
		{"object without properties", `{"type":"object"}`, map[string]any{"q": map[string]any{"r": 1.5}}, nil},
		{"no schema, no values", ``, nil, map[string]any{}},
		{"extra arguments kept", echoSchema, map[string]any{"message": "hi", "other": int64(4)}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			page := form(t, tt.schema, tt.values, "c0.", nil)
			got, errs := Parse([]byte(tt.schema), post(t, page, nil), "c0.")
			if errs != nil {
				t.Fatalf("errs = %v\n%s", errs, page)
			}
			want := tt.want
			if want == nil {
				want = tt.values
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("args = %#v, want %#v\n%s", got, want, page)
			}
		})
	}
}

func TestFormFields(t *testing.T) {
	tests := []struct {
		name   string
		schema string
		values map[string]any
		errs   map[string]string
		want   []string
		not    []string
	}{
		{"add", addSchema, map[string]any{"a": 1.0, "b": json.Number("2")}, nil, []string{
			`<div class="field">`,
			`<label for="c0.arg.a">a <span class="required">(required)</span></label>`,
			`<small id="c0.arg.a-hint">First number</small>`,
			`<input type="number" step="any" name="c0.arg.a" id="c0.arg.a" value="1"`,
			`name="c0.arg.b" id="c0.arg.b" value="2"`,
		}, []string{"e+"}},
		{"big integral float has no exponent", addSchema, map[string]any{"a": 1e20, "b": 1.0}, nil, []string{`value="100000000000000000000"`}, nil},
		{"string", echoSchema, nil, nil, []string{`<input type="text" name="c0.arg.message" id="c0.arg.message" value=""`}, nil},
		{"multiline string", echoSchema, map[string]any{"message": "a\nb"}, nil, []string{"<textarea name=\"c0.arg.message\"", ">\na\nb</textarea>"}, nil},
		{"long string", `{"type":"object","properties":{"body":{"type":"string","maxLength":5000}}}`, nil, nil, []string{`<textarea name="c0.arg.body"`}, nil},
		{"enum optional", enumSchema, map[string]any{"unit": "fahrenheit"}, nil, []string{
			`<select name="c0.arg.unit" id="c0.arg.unit"`,
			`<option value="">(not set)</option>`,
			`<option value="fahrenheit" selected>fahrenheit</option>`,
			`<input type="number" step="1" name="c0.arg.days"`,
		}, nil},
		{"enum default", enumSchema, nil, nil, []string{`<option value="celsius" selected>celsius</option>`}, nil},
		{"enum value outside", enumSchema, map[string]any{"unit": "kelvin"}, nil, []string{`<option value="kelvin" selected>kelvin (not allowed)</option>`}, nil},
		{"enum required has no empty option", `{"type":"object","properties":{"u":{"type":"string","enum":["x","y"]}},"required":["u"]}`, nil, nil, []string{`<option value="x">x</option>`}, []string{"(not set)"}},
		{"bool", boolSchema, map[string]any{"confirm": true, "verbose": false}, nil, []string{
			`<input type="hidden" name="c0.arg.confirm" value="false">`,
			`<input type="checkbox" name="c0.arg.confirm" id="c0.arg.confirm" value="true" checked`,
			`<option value="false" selected>false</option>`,
			`<option value="">(not set)</option>`,
		}, nil},
		{"nested", nestSchema, map[string]any{"address": map[string]any{"zip": 1}, "tags": []any{"x"}}, nil, []string{
			"<textarea name=\"c0.arg.address\" id=\"c0.arg.address\" class=\"json\"",
			">\n{\n  &#34;zip&#34;: 1\n}</textarea>",
			">\n[\n  &#34;x&#34;\n]</textarea>",
		}, nil},
		{"no properties", `{"type":"object"}`, map[string]any{"k": "v"}, nil, []string{
			`<textarea name="c0.json" id="c0.json" class="json"`,
			">\n{\n  &#34;k&#34;: &#34;v&#34;\n}</textarea>",
		}, []string{"c0.arg."}},
		{"errors", enumSchema, map[string]any{"days": "abc"}, map[string]string{
			"days": `"days": want an integer, got "abc"`,
			"":     "the call failed",
			"gone": `"gone": unknown`,
		}, []string{
			`<p class="error" role="alert">the call failed; &#34;gone&#34;: unknown</p>`,
			`value="abc" aria-invalid="true" aria-describedby="c0.arg.days-error">` + "\n" +
				`<span class="error" role="alert" id="c0.arg.days-error">&#34;days&#34;: want an integer, got &#34;abc&#34;</span>`,
		}, nil},
		{"odd names get valid ids", `{"type":"object","properties":{"a b/c":{"type":"string"}}}`, nil, nil, []string{`name="c0.arg.a b/c" id="c0.arg.a_b_c"`, `<label for="c0.arg.a_b_c">a b/c</label>`}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			page := form(t, tt.schema, tt.values, "c0.", tt.errs)
			for _, w := range tt.want {
				if !strings.Contains(page, w) {
					t.Errorf("missing %q in\n%s", w, page)
				}
			}
			for _, n := range tt.not {
				if strings.Contains(page, n) {
					t.Errorf("unexpected %q in\n%s", n, page)
				}
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name     string
		schema   string
		form     url.Values
		wantArgs map[string]any
		wantErrs map[string]string
	}{
		{"bad integer", enumSchema, url.Values{"p.arg.city": {"Rome"}, "p.arg.days": {"abc"}},
			map[string]any{"city": "Rome"},
			map[string]string{"days": `"days": want an integer, got "abc"`}},
		{"bad number", addSchema, url.Values{"p.arg.a": {"1,5"}, "p.arg.b": {"2"}},
			map[string]any{"b": 2.0},
			map[string]string{"a": `"a": want a number, got "1,5"`}},
		{"missing required number", addSchema, url.Values{"p.arg.a": {""}, "p.arg.b": {"2"}},
			map[string]any{"b": 2.0},
			map[string]string{"a": `"a": required`}},
		{"required string not posted", echoSchema, url.Values{},
			map[string]any{},
			map[string]string{"message": `"message": required`}},
		{"required string empty is kept", echoSchema, url.Values{"p.arg.message": {""}},
			map[string]any{"message": ""}, nil},
		{"enum violation", enumSchema, url.Values{"p.arg.city": {"Rome"}, "p.arg.unit": {"kelvin"}},
			map[string]any{"city": "Rome", "unit": "kelvin"},
			map[string]string{"unit": `"unit": value must be one of 'celsius', 'fahrenheit'`}},
		{"minimum", enumSchema, url.Values{"p.arg.city": {"Rome"}, "p.arg.days": {"0"}},
			map[string]any{"city": "Rome", "days": int64(0)},
			map[string]string{"days": `"days": minimum: got 0, want 1`}},
		{"integer enum", nestSchema, url.Values{"p.arg.address": {`{"zip":1}`}, "p.arg.level": {"4"}},
			map[string]any{"address": map[string]any{"zip": int64(1)}, "level": int64(4)},
			map[string]string{"level": `"level": value must be one of 1, 2, 3`}},
		{"nested wrong type", nestSchema, url.Values{"p.arg.address": {`{"zip":"x"}`}},
			map[string]any{"address": map[string]any{"zip": "x"}},
			map[string]string{"address": `"address/zip": got string, want integer`}},
		{"nested missing", nestSchema, url.Values{"p.arg.address": {`{}`}},
			map[string]any{"address": map[string]any{}},
			map[string]string{"address": `"address/zip": required`}},
		{"bad JSON", nestSchema, url.Values{"p.arg.address": {`{"zip":`}},
			map[string]any{},
			map[string]string{"address": `"address": not valid JSON: unexpected EOF`}},
		{"JSON with trailing text", nestSchema, url.Values{"p.arg.address": {`{} {}`}},
			map[string]any{},
			map[string]string{"address": `"address": not valid JSON: text after the JSON value`}},
		{"bad boolean", boolSchema, url.Values{"p.arg.confirm": {"yes"}},
			map[string]any{},
			map[string]string{"confirm": `"confirm": want true or false, got "yes"`}},
		{"checkbox on", boolSchema, url.Values{"p.arg.confirm": {"false", "on"}},
			map[string]any{"confirm": true}, nil},
		{"whole object not an object", ``, url.Values{"p.json": {`[1]`}},
			map[string]any{},
			map[string]string{"": "the arguments must be a JSON object"}},
		{"whole object validated", `{"type":"object","minProperties":1}`, url.Values{"p.json": {` `}},
			map[string]any{},
			map[string]string{"": "minProperties: got 0, want 1"}},
		{"additional property", `{"type":"object","properties":{"a":{"type":"string"}},"additionalProperties":false}`, url.Values{"p.arg.a": {"x"}, "p.extra": {`{"b":1}`}},
			map[string]any{"a": "x", "b": int64(1)},
			map[string]string{"": "additional properties 'b' not allowed"}},
		{"schema that does not compile: converted, not validated", `{"type":"object","properties":{"n":{"type":"integer","minimum":"x"}},"required":["n"]}`, url.Values{"p.arg.n": {"5"}},
			map[string]any{"n": int64(5)}, nil},
		{"other prefixes ignored", echoSchema, url.Values{"q.arg.message": {"other"}, "p.arg.message": {"mine"}},
			map[string]any{"message": "mine"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args, errs := Parse([]byte(tt.schema), tt.form, "p.")
			if !reflect.DeepEqual(args, tt.wantArgs) {
				t.Errorf("args = %#v, want %#v", args, tt.wantArgs)
			}
			if !reflect.DeepEqual(errs, tt.wantErrs) {
				t.Errorf("errs = %#v, want %#v", errs, tt.wantErrs)
			}
		})
	}
}

// TestTwoFormsInOne: two pending calls share one <form>; each Parse reads
// its own fields, and errors shown by Form land on the right field.
func TestTwoFormsInOne(t *testing.T) {
	p0 := form(t, echoSchema, map[string]any{"message": "first"}, "c0.", nil)
	p1 := form(t, enumSchema, map[string]any{"city": "Lima", "unit": "kelvin"}, "c1.", nil)
	posted := post(t, p0+p1, nil)

	a0, e0 := Parse([]byte(echoSchema), posted, "c0.")
	if e0 != nil || !reflect.DeepEqual(a0, map[string]any{"message": "first"}) {
		t.Fatalf("c0: args %#v errs %#v", a0, e0)
	}
	a1, e1 := Parse([]byte(enumSchema), posted, "c1.")
	if !reflect.DeepEqual(a1, map[string]any{"city": "Lima", "unit": "kelvin"}) {
		t.Fatalf("c1: args %#v", a1)
	}
	if len(e1) != 1 || e1["unit"] == "" {
		t.Fatalf("c1: errs %#v, want one on unit", e1)
	}
	again := form(t, enumSchema, a1, "c1.", e1)
	want := `<span class="error" role="alert" id="c1.arg.unit-error">` + html.EscapeString(e1["unit"]) + `</span>`
	if !strings.Contains(again, want) {
		t.Fatalf("missing %q in\n%s", want, again)
	}
	if strings.Contains(again, `id="c1.arg.city-error"`) {
		t.Fatalf("error shown on city:\n%s", again)
	}
}

// TestEscaping: nothing from the schema, the values or the messages can add HTML.
func TestEscaping(t *testing.T) {
	schema := `{"type":"object","properties":{
		"<script>n</script>":{"type":"string","description":"<script>alert(1)</script>"},
		"obj":{"type":"object","description":"x\" onmouseover=\"alert(2)"},
		"e":{"type":"string","enum":["<script>e</script>"]}},
		"required":["<script>n</script>"]}`
	values := map[string]any{
		"<script>n</script>": `"><script>alert(3)</script>`,
		"obj":                map[string]any{"k": "</textarea><script>alert(4)</script>"},
		"e":                  "<script>e</script>",
		"<b>extra</b>":       "<i>",
	}
	errs := map[string]string{"": "<script>alert(5)</script>", "obj": "<img src=x onerror=alert(6)>"}
	page := form(t, schema, values, `p"><script>.`, errs)
	for _, bad := range []string{"<script", "</textarea><", "<img", "<b>", "<i>", `" onmouseover`} {
		if strings.Contains(page, bad) {
			t.Errorf("page holds %q:\n%s", bad, page)
		}
	}
	for _, good := range []string{"&lt;script&gt;alert(1)&lt;/script&gt;", "&lt;img src=x onerror=alert(6)&gt;"} {
		if !strings.Contains(page, good) {
			t.Errorf("page lacks %q:\n%s", good, page)
		}
	}
	// The escaped page still posts the values back unchanged.
	args, perrs := Parse([]byte(schema), post(t, page, nil), `p"><script>.`)
	if perrs != nil {
		t.Fatalf("errs %v", perrs)
	}
	if !reflect.DeepEqual(args, values) {
		t.Fatalf("args = %#v, want %#v", args, values)
	}
}
