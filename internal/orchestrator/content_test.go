package orchestrator_test

import (
	"strings"
	"testing"

	"github.com/connector-svc/connector-svc/internal/orchestrator"
)

// A form's content is checked against its requested schema, formats
// included, before its server sees it.
func TestValidateContent(t *testing.T) {
	schema := map[string]any{
		"type": "object",
		"properties": map[string]any{
			"name":     map[string]any{"type": "string", "minLength": 1},
			"email":    map[string]any{"type": "string", "format": "email"},
			"birth":    map[string]any{"type": "string", "format": "date"},
			"age":      map[string]any{"type": "integer", "minimum": 1, "maximum": 130},
			"agree":    map[string]any{"type": "boolean"},
			"friend":   map[string]any{"type": "string", "enum": []any{"Monica", "Ross"}},
			"hero":     map[string]any{"type": "string", "oneOf": []any{map[string]any{"const": "h1", "title": "Superman"}}},
			"colours":  map[string]any{"type": "array", "minItems": 1, "maxItems": 2, "items": map[string]any{"type": "string", "enum": []any{"red", "blue", "green"}}},
			"homepage": map[string]any{"type": "string", "format": "uri"},
		},
		"required": []any{"name"},
	}
	good := map[string]any{"name": "Ada", "email": "ada@example.com", "birth": "1815-12-10", "age": 36, "agree": true,
		"friend": "Ross", "hero": "h1", "colours": []any{"red"}, "homepage": "https://ada.example.com"}
	if err := orchestrator.ValidateContent(schema, good); err != nil {
		t.Fatalf("valid content refused: %v", err)
	}
	for name, c := range map[string]struct {
		content map[string]any
		want    string
	}{
		"missing required": {map[string]any{"email": "ada@example.com"}, "name"},
		"bad email":        {map[string]any{"name": "Ada", "email": "not an address"}, "email"},
		"bad date":         {map[string]any{"name": "Ada", "birth": "10/12/1815"}, "birth"},
		"out of range":     {map[string]any{"name": "Ada", "age": 500}, "age"},
		"not in enum":      {map[string]any{"name": "Ada", "friend": "Joey"}, "friend"},
		"too many items":   {map[string]any{"name": "Ada", "colours": []any{"red", "blue", "green"}}, "colours"},
		"wrong type":       {map[string]any{"name": "Ada", "agree": "yes"}, "agree"},
	} {
		err := orchestrator.ValidateContent(schema, c.content)
		if err == nil {
			t.Errorf("%s: accepted %v", name, c.content)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %q does not name %q", name, err, c.want)
		}
	}
}
