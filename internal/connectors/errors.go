package connectors

import (
	"fmt"

	"github.com/connector-svc/connector-svc/internal/queries"
)

// CommandNotAllowedError: a stdio connector's command is not on the
// operator's allow-list.
type CommandNotAllowedError struct{ Command string }

func (e *CommandNotAllowedError) Error() string {
	return fmt.Sprintf("connector.stdio.command %q is not allowed: the operator must add it to STDIO_ALLOWED_COMMANDS", e.Command)
}

// EgressDeniedError: a connector URL the egress policy refuses.
type EgressDeniedError struct{ err error }

func (e *EgressDeniedError) Error() string { return e.err.Error() }
func (e *EgressDeniedError) Unwrap() error { return e.err }

// Violation is a rule a field of a connector breaks: Field is its path in
// the API's request ("connector.http.url"), Problem what is wrong, never
// with a secret value in it. It is the queries use case's type, so that a
// front door reports the invalid requests of both alike.
type Violation = queries.Violation

// InvalidError: the connector breaks the rules its Violations name.
type InvalidError = queries.InvalidError
