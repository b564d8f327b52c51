package schemaform

import (
	"net/url"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// Schemas as real servers send them: the reference server's get-sum and
// echo, and a tool with every kind of property.
const (
	sumSchema  = `{"type":"object","properties":{"a":{"type":"number","description":"First number"},"b":{"type":"number","description":"Second number"}},"required":["a","b"]}`
	echoSchema = `{"type":"object","properties":{"message":{"type":"string","description":"Message to echo"}},"required":["message"]}`
	allSchema  = `{"type":"object","properties":{
		"city":{"type":"string"},
		"count":{"type":"integer","minimum":1},
		"unit":{"type":"string","enum":["celsius","fahrenheit"]},
		"verbose":{"type":"boolean"},
		"confirm":{"type":"boolean"},
		"filter":{"type":"object","properties":{"tag":{"type":"string"}},"required":["tag"]},
		"ids":{"type":"array","items":{"type":"integer"}}
	},"required":["city","confirm"]}`
)

// post is what a browser posts for a form's fields as rendered: each
// input's value, the selected option of each select, checked checkboxes.
func post(t *testing.T, html string) url.Values {
	t.Helper()
	form := url.Values{}
	for _, m := range regexp.MustCompile(`<input type="(text|number|hidden)" (?:id="[^"]*" )?name="([^"]+)"(?: step="[^"]*")? value="([^"]*)"`).FindAllStringSubmatch(html, -1) {
		form.Add(m[2], unescape(m[3]))
	}
	for _, m := range regexp.MustCompile(`<input type="checkbox" id="[^"]*" name="([^"]+)" value="([^"]*)" checked>`).FindAllStringSubmatch(html, -1) {
		form.Add(m[1], m[2])
	}
	for _, m := range regexp.MustCompile(`(?s)<textarea id="[^"]*" name="([^"]+)"[^>]*>(.*?)</textarea>`).FindAllStringSubmatch(html, -1) {
		form.Add(m[1], unescape(m[2]))
	}
	for _, m := range regexp.MustCompile(`(?s)<select id="[^"]*" name="([^"]+)">(.*?)</select>`).FindAllStringSubmatch(html, -1) {
		if sel := regexp.MustCompile(`<option value="([^"]*)" selected>`).FindStringSubmatch(m[2]); sel != nil {
			form.Add(m[1], sel[1])
		}
	}
	return form
}

func unescape(s string) string {
	return strings.NewReplacer("&#34;", `"`, "&lt;", "<", "&gt;", ">", "&#39;", "'", "&amp;", "&", "&#43;", "+").Replace(s)
}

func TestRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name, schema string
		args         map[string]any
	}{
		{"sum", sumSchema, map[string]any{"a": 1.5, "b": float64(2)}},
		{"echo", echoSchema, map[string]any{"message": "hello <b>world</b> & \"friends\""}},
		{"all", allSchema, map[string]any{"city": "Oslo", "count": int64(3), "unit": "celsius", "verbose": false, "confirm": true,
			"filter": map[string]any{"tag": "x"}, "ids": []any{int64(1), int64(2)}}},
		{"all, optional ones unset", allSchema, map[string]any{"city": "Oslo", "confirm": false}},
		{"no properties", `{"type":"object"}`, map[string]any{"free": "form", "n": int64(1)}},
		{"no schema", ``, map[string]any{"x": []any{true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			html, err := Form([]byte(tc.schema), tc.args, "c0.", nil)
			if err != nil {
				t.Fatal(err)
			}
			got, errs := Parse([]byte(tc.schema), post(t, string(html)), "c0.")
			if errs != nil {
				t.Fatalf("errors %v\nform:\n%s", errs, html)
			}
			want := tc.args
			if tc.name == "sum" {
				want = map[string]any{"a": 1.5, "b": float64(2)}
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("args = %#v\nwant %#v\nform:\n%s", got, want, html)
			}
		})
	}
}

func TestFormShowsFields(t *testing.T) {
	html, err := Form([]byte(allSchema), nil, "", map[string]string{"count": "want an integer"})
	if err != nil {
		t.Fatal(err)
	}
	s := string(html)
	for _, want := range []string{
		`<label for="f-arg.city">city (required)</label>`,
		`<input type="number" id="f-arg.count" name="arg.count" step="1" value="">`,
		`<span class="error" role="alert">want an integer</span>`,
		`<option value="" selected>(not set)</option><option value="celsius">celsius</option>`,
		`<input type="hidden" name="arg.confirm" value="false"><input type="checkbox" id="f-arg.confirm" name="arg.confirm" value="true">`,
		`<textarea id="f-arg.filter" name="arg.filter" rows="5" spellcheck="false">`,
	} {
		if !strings.Contains(s, want) {
			t.Errorf("form lacks %s\n%s", want, s)
		}
	}
	// Required fields come first.
	if strings.Index(s, "arg.city") > strings.Index(s, "arg.count") || strings.Index(s, "arg.confirm") > strings.Index(s, "arg.count") {
		t.Errorf("required fields are not first:\n%s", s)
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name, schema string
		form         url.Values
		want         map[string]string
	}{
		{"bad integer", allSchema, url.Values{"arg.city": {"Oslo"}, "arg.confirm": {"false"}, "arg.count": {"abc"}},
			map[string]string{"count": `want an integer, got "abc"`}},
		{"missing required", sumSchema, url.Values{"arg.a": {"1"}, "arg.b": {""}}, map[string]string{"b": "required"}},
		{"enum", allSchema, url.Values{"arg.city": {"Oslo"}, "arg.confirm": {"false"}, "arg.unit": {"kelvin"}},
			map[string]string{"unit": "value must be one of 'celsius', 'fahrenheit'"}},
		{"minimum", allSchema, url.Values{"arg.city": {"Oslo"}, "arg.confirm": {"false"}, "arg.count": {"0"}},
			map[string]string{"count": "minimum: got 0, want 1"}},
		{"nested", allSchema, url.Values{"arg.city": {"Oslo"}, "arg.confirm": {"false"}, "arg.filter": {`{}`}},
			map[string]string{"filter": "missing property 'tag'"}},
		{"bad JSON", allSchema, url.Values{"arg.city": {"Oslo"}, "arg.confirm": {"false"}, "arg.ids": {`[1,`}},
			map[string]string{"ids": "not valid JSON: unexpected EOF"}},
		{"not an object", ``, url.Values{"json": {`[1]`}}, map[string]string{"": "the arguments must be a JSON object"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, errs := Parse([]byte(tc.schema), tc.form, "")
			if !reflect.DeepEqual(errs, tc.want) {
				t.Errorf("errs = %q, want %q", errs, tc.want)
			}
		})
	}
}

func TestPrefixesSeparateForms(t *testing.T) {
	form := url.Values{"c0.arg.message": {"first"}, "c1.arg.message": {"second"}}
	a, _ := Parse([]byte(echoSchema), form, "c0.")
	b, _ := Parse([]byte(echoSchema), form, "c1.")
	if a["message"] != "first" || b["message"] != "second" {
		t.Errorf("c0 = %v, c1 = %v", a, b)
	}
}

func TestEscaping(t *testing.T) {
	schema := `{"type":"object","properties":{"<script>x</script>":{"type":"string","description":"<script>alert(1)</script>"}}}`
	html, err := Form([]byte(schema), map[string]any{"<script>x</script>": `"><script>alert(2)</script>`}, `"><p`, nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(html), "<script>") || strings.Contains(string(html), `"><p`) {
		t.Errorf("unescaped input in the form:\n%s", html)
	}
}

func TestDefaults(t *testing.T) {
	schema := `{"type":"object","properties":{"n":{"type":"integer","default":7},"s":{"type":"string","default":"hi"}}}`
	html, _ := Form([]byte(schema), nil, "", nil)
	if !strings.Contains(string(html), `value="7"`) || !strings.Contains(string(html), `value="hi"`) {
		t.Errorf("defaults not shown:\n%s", html)
	}
	// Values given (even empty) win over defaults.
	html, _ = Form([]byte(schema), map[string]any{}, "", nil)
	if strings.Contains(string(html), `value="7"`) {
		t.Errorf("a default shown over the values given:\n%s", html)
	}
}
