# Developer entry points; the README names `make run` and `make test`.
GO ?= go

.PHONY: run test bench lint gen fuzz

## run: start Postgres if needed, then the service on 127.0.0.1:50051.
## A development SECRET_KEY is generated once into .dev/secret_key.
## The binary is built into .dev/bin and exec'd by the recipe's shell (not
## go run), so a signal to make or Ctrl-C reaches the service itself, and
## nothing is left holding the port.
run: .dev/secret_key
	@scripts/ensure-postgres.sh
	$(GO) build -o .dev/bin/connector-svc ./cmd/connector-svc
	SECRET_KEY="$${SECRET_KEY:-$$(cat .dev/secret_key)}" \
	STDIO_ALLOWED_COMMANDS="$${STDIO_ALLOWED_COMMANDS-npx}" \
	exec .dev/bin/connector-svc

.dev/secret_key:
	@mkdir -p .dev && umask 077 && head -c 32 /dev/urandom | base64 > $@

## test: start Postgres if needed, install the reference MCP server and
## grpcurl for the interop and README tests (they skip loudly without them,
## except under CI=true), then every test under the race detector.
test:
	@scripts/ensure-postgres.sh
	@scripts/install-mcp-everything.sh || echo "!!! could not install the reference MCP server; interop tests will skip" >&2
	@scripts/tools.sh grpcurl || echo "!!! could not install grpcurl; the README test will skip" >&2
	$(GO) test -race -count=1 -timeout 20m ./...

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
FUZZ_PKGS = ./internal/egress ./internal/server ./internal/orchestrator
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

## lint: gofmt, go vet and buf lint.
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	scripts/gen.sh --lint

## gen: regenerate gen/ from proto/ with the pinned tools.
gen:
	scripts/gen.sh
