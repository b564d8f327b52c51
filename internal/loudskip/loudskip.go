// Package loudskip skips a test that lacks something it needs (Postgres, a
// tool, a binary) so that nobody misses it: under CI=true the test fails
// instead; otherwise the reason goes to stderr and, when TEST_SKIP_LOG names
// a file, is appended to it. `go test ./...` shows no output of a passing
// package, so `make test` sets TEST_SKIP_LOG and prints the file's reasons
// after the run.
package loudskip

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// LogEnv names the file skips are appended to, one line each: the reason,
// a tab, the test's name.
const LogEnv = "TEST_SKIP_LOG"

// Skip fails t under CI=true and skips it elsewhere, saying why on stderr
// and in the file LogEnv names. A file that cannot be written is reported
// on stderr; the test still skips.
func Skip(t testing.TB, reason string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(reason)
	}
	fmt.Fprintln(os.Stderr, "\n!!! SKIPPING "+t.Name()+": "+reason)
	if path := os.Getenv(LogEnv); path != "" {
		if err := appendLine(path, strings.ReplaceAll(reason, "\n", " ")+"\t"+t.Name()+"\n"); err != nil {
			fmt.Fprintf(os.Stderr, "!!! %s: %v\n", LogEnv, err)
		}
	}
	t.Skip(reason)
}

// appendLine appends line to path in one write: test binaries of several
// packages append to the same file at once, and O_APPEND keeps each write
// whole.
func appendLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteString(line)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
