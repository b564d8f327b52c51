package loudskip

import (
	"os"
	"path/filepath"
	"testing"
)

// TestSkipWritesTheLog runs Skip in a subtest and checks the subtest
// skipped and its reason reached the log file, after a line already there.
func TestSkipWritesTheLog(t *testing.T) {
	t.Setenv("CI", "")
	log := filepath.Join(t.TempDir(), "skips")
	if err := os.WriteFile(log, []byte("earlier\tTestEarlier\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(LogEnv, log)
	var skipped bool
	t.Run("needs", func(t *testing.T) {
		defer func() { skipped = t.Skipped() }()
		Skip(t, "grpcurl is missing;\nrun scripts/tools.sh grpcurl")
		t.Error("Skip returned")
	})
	if !skipped {
		t.Fatal("the subtest did not skip")
	}
	got, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	want := "earlier\tTestEarlier\ngrpcurl is missing; run scripts/tools.sh grpcurl\tTestSkipWritesTheLog/needs\n"
	if string(got) != want {
		t.Errorf("log = %q; want %q", got, want)
	}
}
