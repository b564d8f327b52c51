package queries

import (
	"errors"
	"fmt"
	"strings"

	"github.com/connector-svc/connector-svc/internal/oauth"
	"github.com/connector-svc/connector-svc/internal/store"
)

// The errors of the use case. Their texts are what callers of the API
// read, and name its values where they must.

// ErrReplicaStopping is why a run going on here when the replica stops
// fails: its tool call's connection (and any input it waits on) ends with
// the replica.
var ErrReplicaStopping = errors.New("the replica running this query stopped while the run went on without its caller " +
	"(waiting for input, or resumed and left): ask again with QueryConnector")

// ErrRunTaken: another resume claimed the run first (or it expired
// meanwhile).
var ErrRunTaken = errors.New("the run was resumed by another request meanwhile, or expired; GetQueryRun shows where it is")

// RunNotAwaitingError: the run awaits no decision (or authorization) now:
// it was resumed already, it ended, or its connector is gone.
type RunNotAwaitingError struct{ Msg string }

func (e *RunNotAwaitingError) Error() string { return e.Msg }

// RunNotAwaitingInputError: the answers name input requests that are not
// open (answered already, or past their deadline), or the run awaits no
// input.
type RunNotAwaitingInputError struct{ Msg string }

func (e *RunNotAwaitingInputError) Error() string { return e.Msg }

func notAwaitingInput(msg string) error { return &RunNotAwaitingInputError{Msg: msg} }

// RunExpiredError: the run waited longer than it may and expired.
type RunExpiredError struct {
	// Waited is what it waited for: "approval", "input" or "its user's
	// authorization".
	Waited string
}

func (e *RunExpiredError) Error() string {
	return fmt.Sprintf("the run waited for %s longer than APPROVAL_TIMEOUT allows and expired; ask again with QueryConnector", e.Waited)
}

// RunElsewhereError: the run's tool call waits for input on another
// replica, which the request did not reach (the run's session moved, or
// is moving); a retry goes there.
type RunElsewhereError struct{}

func (e *RunElsewhereError) Error() string {
	return "the run's tool call waits on another replica, which this request did not reach; retry. If that replica " +
		"stopped, the run fails once its heartbeat is missed (GetQueryRun shows it), or expires at its input's deadline"
}

// AuthorizationRequiredError: the run's user must authorize its connector
// before it can go on (the front door says where to send them).
type AuthorizationRequiredError struct {
	Row      *store.Connector
	UserID   string
	RunID    string
	Required *oauth.RequiredError
}

func (e *AuthorizationRequiredError) Error() string { return e.Required.Error() }
func (e *AuthorizationRequiredError) Unwrap() error { return e.Required }

// Violation is a field of a request that breaks a rule: Field is its path
// in the request ("decisions[0].edited_arguments").
type Violation struct{ Field, Problem string }

// InvalidError: the request breaks the rules its Violations name.
type InvalidError struct{ Violations []Violation }

func (e *InvalidError) Error() string {
	parts := make([]string, len(e.Violations))
	for i, v := range e.Violations {
		parts[i] = v.Field + ": " + v.Problem
	}
	return "invalid request: " + strings.Join(parts, "; ")
}

// violations collects Violations; err is nil when there are none.
type violations []Violation

func (v *violations) add(field, format string, args ...any) {
	*v = append(*v, Violation{Field: field, Problem: fmt.Sprintf(format, args...)})
}

func (v violations) err() error {
	if len(v) == 0 {
		return nil
	}
	return &InvalidError{Violations: v}
}
