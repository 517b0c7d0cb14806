# The release image is built by `make release` without a Docker daemon
# (test/tools/release); this file builds the same image with one:
#   docker build --build-arg VERSION=$(git describe --tags --match 'v*') -t hubsync .
# It runs `hubsync run --config /etc/hubsync/config.yaml` as user 65532;
# the chart mounts the configuration there.

# The toolchain go.mod names (go 1.27.3), as the Makefile and CI use.
FROM golang:1.27.3 AS build
ENV GOTOOLCHAIN=go1.27.3
WORKDIR /src
# Modules first, so that this layer is reused until go.mod or go.sum change.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=unknown
ARG DATE=unknown
# http2legacy: the tunnel pool needs x/net's own HTTP/2 client (see the Makefile).
RUN CGO_ENABLED=0 go build -tags http2legacy -trimpath -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT} -X main.date=${DATE}" -o /out/hubsync ./cmd/hubsync
# The rest of the image's files, as the release image holds them.
RUN mkdir -p /out/etc /out/tmp && chmod 1777 /out/tmp && \
    printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > /out/etc/passwd && \
    printf 'root:x:0:\nnonroot:x:65532:\n' > /out/etc/group

# No base image: the static binary carries its own CA roots
# (golang.org/x/crypto/x509roots/fallback); nothing else is needed, so
# nothing of anyone else's is there to pin or patch.
FROM scratch
COPY --from=build /out/ /
USER 65532:65532
ENTRYPOINT ["/hubsync"]
CMD ["run", "--config", "/etc/hubsync/config.yaml"]
