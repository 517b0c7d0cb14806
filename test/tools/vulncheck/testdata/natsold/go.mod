// A program that pins the embedded bus's server at v2.12.1, before the
// fixes of GO-2026-4533 and GO-2026-4826 to -4841: the gate must refuse it
// unless the allow-list accepts each one (vulncheck_test.go).
module example.com/natsold

go 1.27.3

require github.com/nats-io/nats-server/v2 v2.12.1

require (
	github.com/antithesishq/antithesis-sdk-go v0.4.3-default-no-op // indirect
	github.com/google/go-tpm v0.9.6 // indirect
	github.com/klauspost/compress v1.18.0 // indirect
	github.com/minio/highwayhash v1.0.3 // indirect
	github.com/nats-io/jwt/v2 v2.8.0 // indirect
	github.com/nats-io/nkeys v0.4.11 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	golang.org/x/crypto v0.43.0 // indirect
	golang.org/x/sys v0.37.0 // indirect
	golang.org/x/time v0.14.0 // indirect
)
