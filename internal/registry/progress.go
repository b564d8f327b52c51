package registry

import "github.com/connector-svc/connector-svc/internal/registry/progress"

// Progress is one notifications/progress that a server sent for a running
// tool call (see package progress).
type Progress = progress.Progress
