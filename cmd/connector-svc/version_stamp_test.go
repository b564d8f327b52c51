package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestStampedVersion builds the binary as the Dockerfile does, with the
// version and revision stamped in, and reads them back from `version`.
func TestStampedVersion(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "connector-svc")
	build := exec.Command("go", "build", "-ldflags", "-X main.stampedVersion=0.9.1 -X main.stampedRevision=feedface", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "connector-svc 0.9.1 (revision feedface") {
		t.Errorf("version = %q, %v; want the stamped version and revision", out, err)
	}
}
