package registry

import "github.com/connector-svc/connector-svc/internal/ask"

// CallOptions are what a caller adds to one tool call, besides the tool
// and its arguments. The zero value asks for nothing.
type CallOptions struct {
	// Session is the caller's session id: a call to a per_session
	// connector runs on that session's own connection (ErrSessionRequired
	// without one). Shared connectors ignore it.
	Session string
	// UserID is the end user the call is for: an oauth_user connector
	// runs it on that user's own connection, with that user's token
	// (ErrUserRequired without one). Other connectors ignore it.
	UserID string
	// Progress, when set, asks the call for progress: the call sends a
	// progress token of its own, and every notifications/progress the
	// server sends with that token reaches Progress, in the order sent, on
	// the goroutine that called CallTool, before CallTool returns and
	// never after. A slow Progress never holds up the connection, which
	// other calls share: updates wait in a queue meanwhile, and when more
	// than its queue holds (256, see package progress) wait, the newest replaces the last queued
	// one. Servers may send no progress at all. A call of a task tool (see
	// TaskID) also reports each new status of its task here, after the
	// server's progress received before it: Message says the status and
	// the server's status message ("working: 3 of 10 done"), and Progress
	// and Total repeat the last update's.
	Progress func(Progress)
	// Restarted, when set, is set to true before CallTool returns if the
	// call ran on a new MCP session that took the place of one its caller
	// session had: an adopted session the server no longer knew (see
	// Adopt), or one this replica had opened that was lost or broke
	// since. Whatever the server kept for the old session is gone, and
	// the caller should be told so ("session_restarted"). The first
	// session of a caller session is not a restart; each restart is
	// reported to one call. Only per_session connectors set it.
	Restarted *bool
	// Retry, on a connector of the sessionless protocol, sends the call
	// again after it ended with an *ask.InputRequiredError: with the
	// user's answers (mapped to elicitation results), the round's served
	// answers and the server's request state. Other connections ignore it.
	Retry *ask.Retry
	// TaskID, when set, is set to the id the server gave the call's task,
	// as soon as it gives one: before the task's first status reaches
	// Progress, so a Progress callback may read it. A tool whose
	// execution.taskSupport is "required" is called as a task on the
	// classic protocol (2025-11-25): the call asks for a task, polls its
	// status and fetches its result once it ends; a task that fails, or
	// that the server cancels, answers as a tool error; a call whose
	// context ends first cancels its task (tasks/cancel). Other tools, and
	// "optional" ones, run as plain calls and leave TaskID alone.
	TaskID *string

	// asTask says the call runs as a task: the tool requires it.
	asTask bool
}

// restarted reports a restart to the caller, if it asked.
func (o CallOptions) restarted() {
	if o.Restarted != nil {
		*o.Restarted = true
	}
}
