# Build:  docker build --build-arg VERSION=$(git describe --tags --always --dirty) -t hubsync .
# The image runs `hubsync run --config /etc/hubsync/config.yaml` as user
# 65532; deploy/ mounts the configuration there.

FROM golang:1.26 AS build
# The image pins GOTOOLCHAIN=local; go.mod asks for a patch release, which
# an older cached golang:1.26 may lack. auto fetches it only in that case.
ENV GOTOOLCHAIN=auto
WORKDIR /src
# Modules first, so that this layer is reused until go.mod or go.sum change.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /hubsync ./cmd/hubsync

# Static binary: no libc, no shell, non-root.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /hubsync /hubsync
USER 65532:65532
ENTRYPOINT ["/hubsync"]
CMD ["run", "--config", "/etc/hubsync/config.yaml"]
