// Package access builds client-go configurations for the clusters of a
// namespace's ClusterProfiles that authenticate with the credential copies
// hubsync keeps next to them, without an exec credential plugin.
//
// A Source serves one consumer namespace and one ManagedServiceAccount. It
// follows the namespace's credential copies with one informer, so every
// rest.Config it hands out sends the token the copy holds now: a long-lived
// client switches to a rotated token as soon as the copy changes, instead of
// keeping the old one until a request fails. When a request is refused with
// 401 anyway (the old token was revoked before the informer saw the new
// one), the transport retries it once with the newer token, reading the copy
// from the API server if the informer has not caught up yet.
//
//	src, err := access.New(hubConfig, access.Options{Namespace: "team-ml", ManagedServiceAccount: "app"})
//	go src.Start(ctx) // or mgr.Add(src) in a controller-runtime manager
//	cfg, err := src.ConfigForName(ctx, "eu-prod-01")
//	client, err := kubernetes.NewForConfig(cfg)
//
// The Source's hub identity needs get, list and watch on Secrets in the
// namespace (and get on ClusterProfiles for ConfigForName). With get
// alone, as the exec plugin needs, do not Start it: configs then read
// their copy on the first request and again after a 401, and still fail
// no request when the copy holds the new token before the old one is
// refused.
//
// The package imports no NATS: a consumer that follows hubsync's events can
// call Refresh on io.hubsync.credential.rotated, which the subpackage
// access/rotations does. Tokens never appear in its logs or errors.
package access
