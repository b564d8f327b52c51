# Builds connector-svc into a small image. The runtime image carries Node.js
# so that stdio connectors launched with npx (on STDIO_ALLOWED_COMMANDS) can run.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -o /out/connector-svc ./cmd/connector-svc

FROM node:20-bookworm-slim
COPY --from=build /out/connector-svc /usr/local/bin/connector-svc
USER node
ENV GRPC_ADDR=0.0.0.0:50051
EXPOSE 50051
ENTRYPOINT ["/usr/local/bin/connector-svc"]
