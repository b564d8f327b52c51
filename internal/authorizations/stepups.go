package authorizations

import (
	"sync"
	"time"
)

// MaxAuthorizations is how many authorizations a server may have a user of
// a connector go through within the OAuth window: the one that gave the
// token it refused, and MaxStepUps for more scopes (step-ups).
const MaxAuthorizations = 3

// MaxStepUps is how many authorizations for more scopes (step-ups) a user
// of a connector may start within the OAuth window: a step-up follows the
// authorization whose token the server refused, which counts as one of
// MaxAuthorizations.
const MaxStepUps = MaxAuthorizations - 1

// stepUps counts the step-ups of each user of each connector within the
// OAuth window, so that a server that keeps asking for more scopes is
// stopped.
type stepUps struct {
	mu sync.Mutex
	at map[stepUpKey][]time.Time
}

type stepUpKey struct {
	connector int64
	user      string
}

// take counts one step-up of user on connector, and reports false past
// MaxStepUps within window.
func (t *stepUps) take(connector int64, user string, window time.Duration) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.at == nil {
		t.at = map[stepUpKey][]time.Time{}
	}
	k := stepUpKey{connector, user}
	cut := time.Now().Add(-window)
	kept := t.at[k][:0]
	for _, at := range t.at[k] {
		if at.After(cut) {
			kept = append(kept, at)
		}
	}
	if len(kept) >= MaxStepUps {
		t.at[k] = kept
		return false
	}
	t.at[k] = append(kept, time.Now())
	// Forget the users with none left, so the map does not grow.
	for other, ats := range t.at {
		if len(ats) == 0 || !ats[len(ats)-1].After(cut) {
			delete(t.at, other)
		}
	}
	return true
}
