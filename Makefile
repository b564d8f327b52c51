# Developer entry points; the README names `make run` and `make test`.
GO ?= go

.PHONY: run tools test bench lint gen fuzz chart image image-push dev-model dev-certs

## run: start Postgres if needed, then the service on 127.0.0.1:50051 (gRPC)
## and 127.0.0.1:8090 (the MCP endpoint).
## A development SECRET_KEY is generated once into .dev/secret_key.
## The binary is built into .dev/bin and exec'd by the recipe's shell (not
## go run), so a signal to make or Ctrl-C reaches the service itself, and
## nothing is left holding the port. -buildvcs=auto records the commit for
## `connector-svc version` even where GOFLAGS says -buildvcs=false.
run: .dev/secret_key
	@scripts/ensure-postgres.sh
	$(GO) build -buildvcs=auto -o .dev/bin/connector-svc ./cmd/connector-svc
	SECRET_KEY="$${SECRET_KEY:-$$(cat .dev/secret_key)}" \
	STDIO_ALLOWED_COMMANDS="$${STDIO_ALLOWED_COMMANDS-npx}" \
	OAUTH_REDIRECT_URL="$${OAUTH_REDIRECT_URL-http://localhost:8081/oauth/callback}" \
	OAUTH_CALLBACK_ADDR="$${OAUTH_CALLBACK_ADDR-127.0.0.1:8081}" \
	MCP_ADDR="$${MCP_ADDR-127.0.0.1:8090}" \
	CONSOLE_ADDR="$${CONSOLE_ADDR-127.0.0.1:8070}" \
	exec .dev/bin/connector-svc

.dev/secret_key:
	@mkdir -p .dev && umask 077 && head -c 32 /dev/urandom | base64 > $@

## dev-model: the development model on 127.0.0.1:11435 (DEV_MODEL_ADDR), in
## the foreground: a scripted stand-in for an OpenAI-compatible model, not a
## language model, so that queries can be tried without one. In another
## terminal: LLM_BASE_URL=http://127.0.0.1:11435/v1 LLM_MODEL=dev-model make run
dev-model:
	$(GO) run ./cmd/connector-svc dev-model

## dev-certs: a CA, a server certificate for localhost and a client
## certificate into .dev/tls (git-ignored), for trying TLS and mutual TLS;
## kept when they exist (make dev-certs ARGS=-force makes new ones).
dev-certs:
	$(GO) run ./cmd/connector-svc dev-certs $(ARGS)

## tools: grpcurl into .tools/bin, the reference MCP server into .tools/npm
## and the TypeScript example's packages into examples/ts/node_modules,
## pinned: what the README's examples, the client examples and the interop tests use.
tools:
	@scripts/tools.sh grpcurl
	@scripts/install-mcp-everything.sh
	@scripts/install-mcp-conformance.sh
	@npm ci --prefix examples/ts --no-audit --no-fund --loglevel=error

## test: start Postgres if needed, install the tools (the interop and README
## tests skip without them, except under CI=true, where they fail), then
## every test under the race detector. `go test ./...` shows nothing of a
## passing package, so a skip would go unseen: each test that skips appends
## its reason to TEST_SKIP_LOG (internal/loudskip), and the reasons are
## printed after the run, which keeps go test's status. TEST_PKGS narrows
## the run (make test TEST_PKGS=./internal/store/...).
SKIP_LOG = .dev/skipped-tests
TEST_PKGS ?= ./...
test:
	@scripts/ensure-postgres.sh
	@$(MAKE) --no-print-directory tools || echo "!!! could not install grpcurl or the reference MCP server; the README and interop tests will skip" >&2
	@mkdir -p .dev && rm -f $(SKIP_LOG)
	@echo "$(GO) test -race -count=1 -timeout 20m $(TEST_PKGS)"
	@TEST_SKIP_LOG="$(CURDIR)/$(SKIP_LOG)" $(GO) test -race -count=1 -timeout 20m $(TEST_PKGS); status=$$?; \
	if [ -s $(SKIP_LOG) ]; then \
	  echo "!!! SKIPPED: these tests did not run (under CI=true they fail):" >&2; \
	  awk -F '\t' '{n[$$1]++; t[$$1]=$$2} END {for (r in n) printf "!!!   %s (%d tests, e.g. %s)\n", r, n[r], t[r]}' $(SKIP_LOG) >&2; \
	fi; \
	exit $$status

## bench: the benchmarks in the README, side by side in one run, ending
## with the table of their goals: each one's value and whether it is met.
## BENCH='-bench Query' runs some of them.
bench:
	@scripts/ensure-postgres.sh
	scripts/bench.sh $(BENCH)

## fuzz: each fuzz target for FUZZTIME inputs (default 20000x). `go test
## -fuzz` takes one target of one package per run, so this loops over them;
## the targets need no Postgres. The budget is a count, not a duration: with
## a duration, Go 1.26's fuzz coordinator can report "context deadline
## exceeded" as a failure when the time runs out on a busy machine
## (golang/go#75804). A failing input lands in the package's
## testdata/fuzz/<target>/: commit it with the fix, and plain `go test`
## replays it from then on.
FUZZTIME ?= 20000x
FUZZ_PKGS = ./internal/egress ./internal/connectors ./internal/orchestrator
fuzz:
	@set -e; for pkg in $(FUZZ_PKGS); do \
	  list=$$($(GO) test -list '^Fuzz' $$pkg); \
	  targets=$$(echo "$$list" | grep '^Fuzz' || true); \
	  if [ -z "$$targets" ]; then echo "no fuzz targets in $$pkg" >&2; exit 1; fi; \
	  for target in $$targets; do \
	    echo "--- $$pkg $$target ($(FUZZTIME))"; \
	    $(GO) test -run '^$$' -fuzz "^$$target\$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; \
	done

## chart: the Helm chart deploy/helm/connector-svc, offline (no cluster):
## the pinned helm (scripts/tools.sh helm), helm lint --strict and helm
## template with the default values and with every option on
## (deploy/helm/ci/all-on-values.yaml), then deploy/helm's test, which decodes
## every rendered object strictly into k8s.io/api types and checks probes,
## shutdown timing, security and settings. The test runs with CI=true here: it
## fails, never skips, if helm is missing.
CHART = deploy/helm/connector-svc
CHART_ALL_ON = deploy/helm/ci/all-on-values.yaml
# image.repository, which has no default; and a Kubernetes version, since a
# helm built with go install (no release ldflags) assumes 1.20 for template
# and lint, below the chart's kubeVersion.
CHART_ARGS = -f deploy/helm/ci/required-values.yaml --kube-version 1.33.0
chart:
	@scripts/tools.sh helm
	.tools/bin/helm lint --strict $(CHART) $(CHART_ARGS)
	.tools/bin/helm lint --strict $(CHART) $(CHART_ARGS) -f $(CHART_ALL_ON)
	.tools/bin/helm template connector-svc $(CHART) $(CHART_ARGS) >/dev/null
	.tools/bin/helm template connector-svc $(CHART) $(CHART_ARGS) -f $(CHART_ALL_ON) >/dev/null
	CI=true $(GO) test -race -count=1 ./deploy/helm/

## image: the service's container image, built with the pinned ko (no
## Docker engine) into .dev/image/connector-svc.tar (docker load / podman
## load take it) on a base scripts/image.sh makes (no registry with base
## images is needed; IMAGE_BASE=<reference> names one), then checked offline
## by deploy/image: OCI labels, a non-root user, the entrypoint and its
## version. image-push: the same image pushed to KO_DOCKER_REPO.
image:
	scripts/image.sh
image-push:
	scripts/image.sh --push

## lint: gofmt, go vet and buf lint.
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	scripts/gen.sh --lint

## gen: regenerate gen/ from proto/ with the pinned tools.
gen:
	scripts/gen.sh
	scripts/gen-ts.sh
