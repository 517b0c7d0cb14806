# Build:  docker build --build-arg VERSION=$(git describe --tags --always --dirty) -t hubsync .
# The image runs `hubsync run --config /etc/hubsync/config.yaml` as user
# 65532; deploy/ mounts the configuration there.

# The toolchain go.mod names (go 1.27.3), as the Makefile and CI use.
FROM golang:1.27.3 AS build
ENV GOTOOLCHAIN=go1.27.3
WORKDIR /src
# Modules first, so that this layer is reused until go.mod or go.sum change.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
# http2legacy: the tunnel pool needs x/net's own HTTP/2 client (see the Makefile).
RUN CGO_ENABLED=0 go build -tags http2legacy -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /hubsync ./cmd/hubsync

# Static binary: no libc, no shell, non-root.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /hubsync /hubsync
USER 65532:65532
ENTRYPOINT ["/hubsync"]
CMD ["run", "--config", "/etc/hubsync/config.yaml"]
