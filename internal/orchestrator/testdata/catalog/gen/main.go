// Command gen writes tools.json, the tools of the labelled catalog that
// narrow_test.go measures the narrowing with: tools in the style of real
// MCP servers (GitHub, a calendar, Jira and Confluence, Zendesk, AWS, DNS,
// Slack, Google Drive, Docs and Sheets, Notion, Gmail), each with an input
// schema whose properties are described, as servers list them. One
// connector holding them all is harder than any single server: "issue",
// "message" or "comment" mean something in several of them.
//
// Run from the repository root after changing a tool:
//
//	go run ./internal/orchestrator/testdata/catalog/gen
//
// The queries, queries.json beside tools.json, are written by hand.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
)

func main() {
	out := flag.String("o", "internal/orchestrator/testdata/catalog/tools.json", "file to write")
	flag.Parse()
	if err := write(*out); err != nil {
		log.Fatal(err)
	}
}

// entry is a tool as tools.json holds it.
type entry struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"inputSchema"`
}

func write(path string) error {
	var entries []entry
	seen := map[string]bool{}
	for _, group := range [][]tool{github(), calendar(), atlassian(), zendesk(), aws(), dns(), slack(), documents(), gmail()} {
		for _, t := range group {
			if seen[t.name] {
				return fmt.Errorf("tool %s is listed twice", t.name)
			}
			seen[t.name] = true
			schema, err := t.schema()
			if err != nil {
				return fmt.Errorf("tool %s: %w", t.name, err)
			}
			entries = append(entries, entry{Name: t.name, Description: t.desc, InputSchema: schema})
		}
	}
	b, err := json.MarshalIndent(entries, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// tool is one tool of the catalog.
type tool struct {
	name, desc string
	props      []prop
}

func t(name, desc string, props ...prop) tool { return tool{name: name, desc: desc, props: props} }

// prop is one property of a tool's input schema.
type prop struct {
	name, typ, desc string
	enum            []string
	required        bool
}

func str(name, desc string) prop  { return prop{name: name, typ: "string", desc: desc} }
func num(name, desc string) prop  { return prop{name: name, typ: "integer", desc: desc} }
func flg(name, desc string) prop  { return prop{name: name, typ: "boolean", desc: desc} }
func list(name, desc string) prop { return prop{name: name, typ: "array", desc: desc} }
func obj(name, desc string) prop  { return prop{name: name, typ: "object", desc: desc} }

func oneOf(name, desc string, values ...string) prop {
	return prop{name: name, typ: "string", desc: desc, enum: values}
}

// must marks p required.
func (p prop) must() prop {
	p.required = true
	return p
}

func (t tool) schema() (json.RawMessage, error) {
	props := map[string]any{}
	required := []string{}
	for _, p := range t.props {
		s := map[string]any{"type": p.typ, "description": p.desc}
		if p.enum != nil {
			s["enum"] = p.enum
		}
		if p.typ == "array" {
			s["items"] = map[string]any{"type": "string"}
		}
		props[p.name] = s
		if p.required {
			required = append(required, p.name)
		}
	}
	return json.Marshal(map[string]any{"type": "object", "properties": props, "required": required})
}
