# Builds connector-svc into a small image, in two stages from pinned bases:
# the Go toolchain the repository builds with, and a runtime that carries
# Node.js (22, an LTS line) so that stdio connectors launched with npx (on
# STDIO_ALLOWED_COMMANDS) can run. The binary is stamped with the version
# and revision (connector-svc version, the start-up log line, the build-info
# metric), and the image carries them as OCI annotations, from the build
# arguments:
#   docker build --build-arg VERSION=$(git describe --tags --always) \
#     --build-arg REVISION=$(git rev-parse HEAD) \
#     --build-arg CREATED=$(date -u +%Y-%m-%dT%H:%M:%SZ) -t connector-svc .
FROM golang:1.26.8-bookworm AS build
ARG VERSION=dev REVISION=unknown
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The context has no .git: the version and revision are stamped in.
RUN CGO_ENABLED=0 go build -trimpath \
      -ldflags "-X main.stampedVersion=${VERSION} -X main.stampedRevision=${REVISION}" \
      -o /out/connector-svc ./cmd/connector-svc

FROM node:22.21.1-bookworm-slim
ARG VERSION=dev REVISION=unknown CREATED=unknown
LABEL org.opencontainers.image.title="connector-svc" \
      org.opencontainers.image.description="Persistent MCP connector agents for a chat backend, over gRPC" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.base.name="docker.io/library/node:22.21.1-bookworm-slim"
COPY --from=build /out/connector-svc /usr/local/bin/connector-svc
USER node
# AUTH=keys: callers need API keys, on by default in the container.
ENV GRPC_ADDR=0.0.0.0:50051 AUTH=keys
EXPOSE 50051
# The gRPC health protocol, asked by the binary itself; it exits 1 unless
# the service answers SERVING within 5 s.
HEALTHCHECK --interval=10s --timeout=10s --start-period=30s --retries=3 \
  CMD ["/usr/local/bin/connector-svc", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/connector-svc"]
