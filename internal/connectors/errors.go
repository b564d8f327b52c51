package connectors

import "fmt"

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
