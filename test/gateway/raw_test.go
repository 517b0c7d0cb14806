package gateway

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// field is one header field as sent on the wire: any name, any case, as
// often as given.
type field struct{ name, value string }

// rawAnswer is what came back: a status code (0: none, the stream or
// connection was reset) and the body or the reset's reason.
type rawAnswer struct {
	code int
	body string
}

// rawHTTP1 sends one request written byte by byte over TLS (http/1.1
// only) and reads the answer.
func rawHTTP1(addr string, roots *x509.CertPool, method, target string, fields []field, body string) (rawAnswer, error) {
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, NextProtos: []string{"http/1.1"}})
	if err != nil {
		return rawAnswer{}, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\n", method, target, addr)
	for _, f := range fields {
		fmt.Fprintf(&b, "%s: %s\r\n", f.name, f.value)
	}
	b.WriteString("\r\n")
	b.WriteString(body)
	if _, err := conn.Write(b.Bytes()); err != nil {
		return rawAnswer{}, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return rawAnswer{}, err
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return rawAnswer{code: resp.StatusCode, body: string(out)}, nil
}

// rawHTTP2 sends one request over HTTP/2 with the header fields given,
// duplicates kept and fields HTTP/2 forbids (connection, upgrade)
// included, and reads the answer on stream 1.
func rawHTTP2(addr string, roots *x509.CertPool, method, target string, fields []field) (rawAnswer, error) {
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, NextProtos: []string{"h2"}})
	if err != nil {
		return rawAnswer{}, err
	}
	defer conn.Close()
	if conn.ConnectionState().NegotiatedProtocol != "h2" {
		return rawAnswer{}, fmt.Errorf("the server did not agree to h2")
	}
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		return rawAnswer{}, err
	}
	fr := http2.NewFramer(conn, conn)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if err := fr.WriteSettings(); err != nil {
		return rawAnswer{}, err
	}
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range append([]field{{":method", method}, {":scheme", "https"}, {":authority", addr}, {":path", target}}, fields...) {
		// HTTP/2 field names are lower case (Go's server resets a stream
		// with any other): the attacks here are in what the fields are.
		if err := enc.WriteField(hpack.HeaderField{Name: strings.ToLower(f.name), Value: f.value}); err != nil {
			return rawAnswer{}, err
		}
	}
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block.Bytes(), EndStream: true, EndHeaders: true}); err != nil {
		return rawAnswer{}, err
	}
	var ans rawAnswer
	var body strings.Builder
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return ans, fmt.Errorf("reading the answer: %w", err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			_ = fr.WritePing(true, f.Data)
		case *http2.MetaHeadersFrame:
			if f.StreamID == 1 {
				if s := f.PseudoValue("status"); s != "" {
					ans.code, _ = strconv.Atoi(s)
				}
				if f.StreamEnded() {
					ans.body = body.String()
					return ans, nil
				}
			}
		case *http2.DataFrame:
			if f.StreamID == 1 {
				body.Write(f.Data())
				if f.StreamEnded() {
					ans.body = body.String()
					return ans, nil
				}
			}
		case *http2.RSTStreamFrame:
			if f.StreamID == 1 {
				return rawAnswer{body: "stream reset: " + f.ErrCode.String()}, nil
			}
		case *http2.GoAwayFrame:
			return rawAnswer{body: "connection closed: " + f.ErrCode.String()}, nil
		}
	}
}
