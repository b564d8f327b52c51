package server

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/connector-svc/connector-svc/internal/connectors"
)

// invalidError is a bad request: one violation per field, each naming the
// field by its JSON path in the request.
type invalidError struct {
	violations []violation
}

type violation struct {
	field, problem string
}

func (e *invalidError) Error() string {
	parts := make([]string, len(e.violations))
	for i, v := range e.violations {
		parts[i] = v.field + ": " + v.problem
	}
	return "invalid request: " + strings.Join(parts, "; ")
}

// checker collects violations; err returns nil when there are none.
type checker struct {
	violations []violation
}

func (c *checker) add(field, format string, args ...any) {
	c.violations = append(c.violations, violation{field, fmt.Sprintf(format, args...)})
}

func (c *checker) err() error {
	if len(c.violations) == 0 {
		return nil
	}
	return &invalidError{violations: c.violations}
}

// maxIDLen is the longest workspace or connector id.
const maxIDLen = connectors.MaxIDLen

// maxUserIDLen is the longest user id, in characters.
const maxUserIDLen = 256

// id checks a workspace or connector id.
func (c *checker) id(field, v string) {
	if p := connectors.IDProblem(v); p != "" {
		c.add(field, "%s", p)
	}
}

// ref checks the workspace_id and connector_id of a request.
func (c *checker) ref(workspaceID, connectorID string) {
	c.id("workspace_id", workspaceID)
	c.id("connector_id", connectorID)
}

// toolRef checks the workspace_id, connector_id and tool_name of a request.
func (c *checker) toolRef(workspaceID, connectorID, tool string) {
	c.ref(workspaceID, connectorID)
	if tool == "" {
		c.add("tool_name", "required")
	}
}

// connectorRef checks a request that names only a connector.
func connectorRef(workspaceID, connectorID string) error {
	var c checker
	c.ref(workspaceID, connectorID)
	return c.err()
}

// use adds the violations of a use case's rules.
func (c *checker) use(violations []connectors.Violation) {
	for _, v := range violations {
		c.violations = append(c.violations, violation{field: v.Field, problem: v.Problem})
	}
}

// scopes checks OAuth scopes (connectors.CheckScopes).
func (c *checker) scopes(field string, scopes []string) { c.use(connectors.CheckScopes(field, scopes)) }

// userID checks the user_id of a call or query of an oauth_user connector:
// required, and of the form userIDForm checks.
func (c *checker) userID(connectorID, v string) {
	if v == "" {
		c.add("user_id", "required: connector %q is AUTH_MODE_OAUTH_USER, and its calls run with the token of the end user they are for", connectorID)
		return
	}
	c.userIDForm(v)
}

// userIDForm checks the form of a user_id, which the service stores and
// routes on as it is: valid UTF-8, at most maxUserIDLen characters (not
// bytes), no control characters.
func (c *checker) userIDForm(v string) {
	switch {
	case !utf8.ValidString(v):
		c.add("user_id", "not valid UTF-8")
	case utf8.RuneCountInString(v) > maxUserIDLen:
		c.add("user_id", "longer than %d characters", maxUserIDLen)
	case strings.ContainsFunc(v, unicode.IsControl):
		c.add("user_id", "contains a control character")
	}
}
