package main

import (
	"cmp"
	"fmt"
	"runtime/debug"

	"go.opentelemetry.io/otel/attribute"
)

// build is what the binary was built from, as the Go toolchain recorded
// it: the module version (v1.2.3 for go install …@v1.2.3, "(devel)" for a
// build in a clone) and, in a clone, the VCS revision and time and whether
// the tree had uncommitted changes.
type build struct {
	Version, Revision, Time, GoVersion string
	Modified                           bool
}

// stampedVersion and stampedRevision, when a build sets them (go build
// -ldflags "-X main.stampedVersion=… -X main.stampedRevision=…", as the
// Dockerfile does, whose context has no .git), win over what the
// toolchain recorded.
var stampedVersion, stampedRevision string

// readBuild reads the build info of the running binary.
func readBuild() build {
	b := readToolchainBuild()
	b.Version = cmp.Or(stampedVersion, b.Version)
	b.Revision = cmp.Or(stampedRevision, b.Revision)
	return b
}

// readToolchainBuild is what the Go toolchain recorded in the binary.
func readToolchainBuild() build {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return build{Version: "unknown"}
	}
	b := build{Version: cmp.Or(info.Main.Version, "(devel)"), GoVersion: info.GoVersion}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Revision = s.Value
		case "vcs.time":
			b.Time = s.Value
		case "vcs.modified":
			b.Modified = s.Value == "true"
		}
	}
	return b
}

// String is the line `connector-svc version` prints.
func (b build) String() string {
	s := "connector-svc " + b.Version
	if b.Revision != "" {
		s += fmt.Sprintf(" (revision %s, %s", b.Revision, cmp.Or(b.Time, "time unknown"))
		if b.Modified {
			s += ", with uncommitted changes"
		}
		s += ")"
	}
	return s + ", " + cmp.Or(b.GoVersion, "go version unknown")
}

// revision is the VCS revision, "+modified" if the tree had changes.
func (b build) revision() string {
	if b.Modified {
		return b.Revision + "+modified"
	}
	return b.Revision
}

// attrs label the build info metric and the start-up log line.
func (b build) attrs() []attribute.KeyValue {
	return []attribute.KeyValue{attribute.String("version", b.Version), attribute.String("revision", b.revision()),
		attribute.String("go_version", b.GoVersion)}
}
