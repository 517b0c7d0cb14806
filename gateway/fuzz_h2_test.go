package gateway

import (
	"bytes"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// FuzzGatewayIdentityHTTP2 is FuzzGatewayIdentity over HTTP/2, written
// frame by frame: a header block the fuzzer fills (any names, upper case,
// pseudo-headers out of place, connection-specific headers), split over
// HEADERS and CONTINUATION frames, with or without a body, and sometimes
// cancelled with RST_STREAM at once. The invariant is the same: the
// cluster sees exactly the identity the gateway decided, or nothing, and
// never a hub token.
func FuzzGatewayIdentityHTTP2(f *testing.F) {
	r := newFuzzRig(f)
	w := r.w
	srv := httptest.NewUnstartedServer(r.g)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	f.Cleanup(srv.Close)
	tlsConfig := srv.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	tlsConfig.NextProtos = []string{"h2"}

	for _, seed := range []struct {
		kind   uint8
		path   string
		fields string
		shape  uint8
	}{
		{0, "", "", 0},
		{1, "/v1/pods", "accept: application/json", 1},
		{0, "", "connection: authorization", 0},
		{0, "", "impersonate-user: system:admin", 2},
		{0, "", "Impersonate-User: system:admin", 3},
		{1, "", "x-remote-user: admin\nx-remote-group: system:masters", 1},
		{0, "", "authorization: Bearer " + w.c1Token, 2},
		{5, "", "authorization: Bearer hub-alice-token-0123456789", 0},
		{0, "", ":path: /c2/api", 1},
		{0, "", "te: trailers\ncontent-length: 2", 0x10},
		{0, "", "trailer: authorization", 0x10},
		{1, "", "sec-websocket-protocol: base64url.bearer.authorization.k8s.io.eA", 0},
		{0, "?watch=true", "", 0x20},
		{0, "", "x-forwarded-user: admin", 3},
		{0, "", "proxy-authorization: Basic eDp5", 0},
		{0, "", ":method: CONNECT\n:protocol: websocket", 0},
	} {
		f.Add(seed.kind, seed.path, seed.fields, seed.shape)
	}
	f.Fuzz(func(t *testing.T, kind uint8, path, fields string, shape uint8) {
		token := r.token(kind)
		var block bytes.Buffer
		enc := hpack.NewEncoder(&block)
		write := func(name, value string) { _ = enc.WriteField(hpack.HeaderField{Name: name, Value: value}) }
		write(":method", "GET")
		write(":scheme", "https")
		write(":authority", "gw")
		write(":path", "/c1/api"+path)
		if token != "" {
			write("authorization", "Bearer "+token)
		}
		for line := range strings.Lines(fields) {
			name, value, _ := strings.Cut(strings.TrimRight(line, "\r\n"), ": ")
			write(name, value)
		}
		before := len(r.pool.requests())
		sendH2(t, srv.Listener.Addr().String(), tlsConfig, block.Bytes(), shape)
		if plain := fields == "" && path == "" && shape == 0; plain && (token == w.hubToken || token == w.c1Token) && len(r.pool.requests()) == before {
			t.Fatal("a plain request with a good token did not reach the cluster: the frames are not a request")
		}
		r.check(t, before, token, fields)
	})
}

// sendH2 opens an HTTP/2 connection and sends one request on stream 1:
// the header block split in 1 to 4 fragments (HEADERS, then CONTINUATION
// frames) by shape's low bits, a 2-byte body when shape has 0x10, and an
// RST_STREAM right after when it has 0x20. It returns once the server has
// answered the stream, reset it, or gone away, or after a few seconds.
func sendH2(t *testing.T, addr string, cfg *tls.Config, block []byte, shape uint8) {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		return
	}
	fr := http2.NewFramer(conn, conn)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	_ = fr.WriteSettings()
	parts, body := 1+int(shape&3), shape&0x10 != 0
	size := (len(block) + parts - 1) / parts
	var chunks [][]byte
	for len(block) > 0 {
		n := min(size, len(block))
		chunks, block = append(chunks, block[:n]), block[n:]
	}
	if len(chunks) == 0 {
		chunks = [][]byte{nil}
	}
	_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: chunks[0], EndStream: !body, EndHeaders: len(chunks) == 1})
	for i, c := range chunks[1:] {
		_ = fr.WriteContinuation(1, i == len(chunks)-2, c)
	}
	if body {
		_ = fr.WriteData(1, true, []byte("{}"))
	}
	if shape&0x20 != 0 {
		_ = fr.WriteRSTStream(1, http2.ErrCodeCancel)
		// The server need not answer a stream the client reset.
		_ = conn.SetDeadline(time.Now().Add(300 * time.Millisecond))
	}
	for {
		frame, err := fr.ReadFrame()
		if err != nil {
			return
		}
		switch fm := frame.(type) {
		case *http2.MetaHeadersFrame:
			if fm.StreamID == 1 {
				return
			}
		case *http2.RSTStreamFrame:
			if fm.StreamID == 1 {
				return
			}
		case *http2.GoAwayFrame:
			return
		case *http2.SettingsFrame:
			if !fm.IsAck() {
				_ = fr.WriteSettingsAck()
			}
		}
	}
}
