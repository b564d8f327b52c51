# Builds connector-svc into a small image. The runtime image carries Node.js
# (22, an LTS line) so that stdio connectors launched with npx (on
# STDIO_ALLOWED_COMMANDS) can run.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -o /out/connector-svc ./cmd/connector-svc

FROM node:22-bookworm-slim
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
