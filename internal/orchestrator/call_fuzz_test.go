package orchestrator_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/connector-svc/connector-svc/internal/orchestrator"
)

// FuzzCheckCall feeds tool calls the model might make (any name, any
// arguments, any tool schema a server might send) to the checks a run
// makes before it calls a tool. They must never panic; a call they let
// through names an enabled tool, within budget, with a JSON object as
// arguments, which reach the tool as the model wrote them (a large integer
// id keeps its digits); the reason for a refusal is valid UTF-8, since it
// goes into the response.
func FuzzCheckCall(f *testing.F) {
	echo := `{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}`
	for _, s := range []struct{ name, args, schema string }{
		{"echo", `{"text":"hi"}`, echo},
		{"echo", `{"txt":"typo"}`, echo},
		{"echo", ``, echo},
		{"echo", `null`, echo},
		{"echo", `[]`, echo},
		{"echo", `{"text":"hi"} {"text":"again"}`, echo},
		{"echo", `{"text":"hi"}}`, echo},
		{"echo", `{"text":1e400}`, echo},
		{"get_tweet", `{"id":1790000000000000001}`, `{"type":"object","properties":{"id":{"type":"integer"}}}`},
		{"get_tweet", `{"id":12345678901234567890123}`, `{"type":"object"}`},
		{"t", `{"a":{"b":[1,2,{"c":null}]}}`, `{"$ref":"#/$defs/o","$defs":{"o":{"type":"object"}}}`},
		{"t", `{}`, `{"$ref":"file:///etc/hostname"}`},
		{"t", `{}`, `{"$ref":"http://169.254.169.254/latest/meta-data/"}`},
		{"t", `{}`, `{"$schema":"http://json-schema.org/draft-07/schema#","type":"object"}`},
		{"t", `{"s":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!"}`, `{"properties":{"s":{"pattern":"^(a+)+$"}}}`},
		{"t", `{}`, `not json`},
		{"t", `{}`, `{"type":"object","required":["x"],"additionalProperties":false}`},
		{"delete_everything", `{}`, echo},
		{"", `{}`, ``},
	} {
		f.Add(s.name, s.args, s.schema, 10, 0)
	}
	f.Add("echo", `{"text":"hi"}`, echo, 3, 3)
	f.Fuzz(func(t *testing.T, name, args, schema string, maxTools, used int) {
		if !utf8.ValidString(name) || !utf8.ValidString(args) || !utf8.ValidString(schema) {
			return // model output and schemas reach us JSON-decoded
		}
		tools := []orchestrator.Tool{{Name: "echo", InputSchema: json.RawMessage(echo)}}
		if name != "echo" && name != "delete_everything" {
			tools = append(tools, orchestrator.Tool{Name: name, InputSchema: json.RawMessage(schema)})
		}
		got, reason := orchestrator.CheckCall(tools, maxTools, used, name, args)
		if !utf8.ValidString(reason) {
			t.Errorf("reason is not valid UTF-8: %q", reason)
		}
		if reason != "" {
			return
		}
		if name == "delete_everything" || used >= maxTools || got == nil {
			t.Fatalf("call %q(%s) with %d of %d used went through: %v", name, args, used, maxTools, got)
		}
		trimmed := strings.TrimSpace(args)
		if trimmed == "" || trimmed == "null" {
			if len(got) != 0 {
				t.Errorf("arguments %q became %v, want {}", args, got)
			}
			return
		}
		if !json.Valid([]byte(trimmed)) || trimmed[0] != '{' {
			t.Errorf("arguments %q are not one JSON object, and went through", args)
		}
		sent, err := json.Marshal(got)
		if err != nil {
			t.Fatalf("arguments %v do not encode: %v", got, err)
		}
		if !sameJSON(t, trimmed, string(sent)) {
			t.Errorf("arguments %s reach the tool as %s", trimmed, sent)
		}
	})
}

// sameJSON reports whether a and b are the same JSON value, numbers
// compared digit for digit.
func sameJSON(t *testing.T, a, b string) bool {
	decode := func(s string) any {
		d := json.NewDecoder(bytes.NewReader([]byte(s)))
		d.UseNumber()
		var v any
		if err := d.Decode(&v); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		return v
	}
	return cmp.Equal(decode(a), decode(b), cmpopts.EquateEmpty())
}

// TestSchemasLoadNothing: a tool's schema comes from the MCP server, and a
// "$ref" to a file or URL must not make the service read that file or
// fetch that URL (here: a file whose content would show in the refusal).
func TestSchemasLoadNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "schema.json")
	if err := os.WriteFile(path, []byte(`{"type":"object","required":["read_from_disk"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, schema := range []string{
		`{"$ref":"file://` + path + `"}`,
		`{"type":"object","properties":{"a":{"$ref":"file://` + path + `"}}}`,
	} {
		tools := []orchestrator.Tool{{Name: "t", InputSchema: json.RawMessage(schema)}}
		if _, reason := orchestrator.CheckCall(tools, 10, 0, "t", `{"a":{}}`); reason != "" {
			t.Errorf("schema %s: the call was refused (%s); the referenced file was read", schema, reason)
		}
	}
	// References inside the schema still work.
	local := `{"$ref":"#/$defs/o","$defs":{"o":{"type":"object","required":["x"]}}}`
	tools := []orchestrator.Tool{{Name: "t", InputSchema: json.RawMessage(local)}}
	if _, reason := orchestrator.CheckCall(tools, 10, 0, "t", `{}`); !strings.Contains(reason, "x") {
		t.Errorf("a local $ref was not enforced: reason %q", reason)
	}
}
