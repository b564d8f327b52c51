package main

import (
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"
)

// The container's binary, as the Dockerfile installs it.
const containerBinary = "/usr/local/bin/connector-svc"

// TestComposeFile reads docker-compose.yml (docker compose config needs
// the compose plugin; this needs nothing): Postgres is not published, the
// service's SECRET_KEY must come from the environment or .env, and the
// health check is the binary's healthcheck command.
func TestComposeFile(t *testing.T) {
	b, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	type service struct {
		Ports       []string          `yaml:"ports"`
		Environment map[string]string `yaml:"environment"`
		Healthcheck struct {
			Test []string `yaml:"test"`
		} `yaml:"healthcheck"`
	}
	var compose struct {
		Services map[string]service `yaml:"services"`
	}
	if err := yaml.Unmarshal(b, &compose); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	pg, svc := compose.Services["postgres"], compose.Services["connector-svc"]
	if len(pg.Ports) != 0 {
		t.Errorf("postgres publishes %v; a Postgres on the host already has 5432", pg.Ports)
	}
	if !strings.HasPrefix(svc.Environment["SECRET_KEY"], "${SECRET_KEY:?") {
		t.Errorf("SECRET_KEY is %q; want it required from the environment or .env, so every start has the same key", svc.Environment["SECRET_KEY"])
	}
	if diff := cmp.Diff([]string{"CMD", containerBinary, "healthcheck"}, svc.Healthcheck.Test); diff != "" {
		t.Errorf("connector-svc health check (-want +got):\n%s", diff)
	}
	if svc.Environment["AUTH"] == "" {
		t.Error("connector-svc does not set AUTH")
	}
	for _, f := range []string{"../../.gitignore", "../../.dockerignore"} {
		b, err := os.ReadFile(f)
		if err != nil || !slices.Contains(strings.Fields(string(b)), ".env") {
			t.Errorf("%s does not ignore .env, which holds SECRET_KEY (%v)", f, err)
		}
	}
}

// TestDockerfile checks the image's pinned bases, its Node.js line, its OCI
// labels and its health check.
func TestDockerfile(t *testing.T) {
	b, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	froms := regexp.MustCompile(`(?m)^FROM node:(\d+)\.\d+\.\d+-`).FindAllStringSubmatch(text, -1)
	if len(froms) != 1 {
		t.Fatalf("want one runtime stage FROM node:<major.minor.patch>-… (pinned), found %v", froms)
	}
	if !regexp.MustCompile(`(?m)^FROM golang:\d+\.\d+\.\d+-\S+ AS build$`).MatchString(text) {
		t.Error("the build stage's golang image is not pinned to a patch release")
	}
	if !strings.Contains(text, "-X main.stampedVersion=${VERSION} -X main.stampedRevision=${REVISION}") {
		t.Error("the build stage does not stamp the binary with VERSION and REVISION (the context has no .git)")
	}
	for _, label := range []string{"title", "version", "revision", "created", "licenses", "base.name"} {
		if !strings.Contains(text, "org.opencontainers.image."+label+"=") {
			t.Errorf("the image has no org.opencontainers.image.%s label", label)
		}
	}
	// Even majors become LTS; 20 reached its end of life in April 2026.
	if major, _ := strconv.Atoi(froms[0][1]); major < 22 || major%2 != 0 {
		t.Errorf("runtime image Node.js %d; want a supported LTS line (22 or a later even one)", major)
	}
	if !regexp.MustCompile(`HEALTHCHECK [^\n]*\\\n\s*CMD \["` + containerBinary + `", "healthcheck"\]`).MatchString(text) {
		t.Error(`no HEALTHCHECK … CMD ["` + containerBinary + `", "healthcheck"]`)
	}
	if !strings.Contains(text, `ENTRYPOINT ["`+containerBinary+`"]`) {
		t.Errorf("the ENTRYPOINT is not %s, which the health checks run", containerBinary)
	}
}
