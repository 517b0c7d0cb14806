// Package pki issues the certificates end-to-end tests need: a CA, serving
// certificates for addresses and names, and client certificates, written
// as PEM files.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"
)

// CA is a certificate authority.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	// PEM is the CA certificate.
	PEM    []byte
	serial atomic.Int64
}

// NewCA makes a CA valid for a day.
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	ca := &CA{Cert: cert, Key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
	ca.serial.Store(1)
	return ca, nil
}

// Pair is a certificate and its key, PEM-encoded.
type Pair struct {
	Cert, Key []byte
}

// Serving issues a server certificate for names (IP addresses or DNS
// names); it is also valid as a client certificate.
func (ca *CA) Serving(names ...string) (Pair, error) {
	return ca.issue(names[0], nil, names, true)
}

// Client issues a client certificate for user cn in groups orgs.
func (ca *CA) Client(cn string, orgs ...string) (Pair, error) {
	return ca.issue(cn, orgs, nil, false)
}

func (ca *CA) issue(cn string, orgs, names []string, server bool) (Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial.Add(1)),
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return Pair{}, err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return Pair{}, err
	}
	return Pair{
		Cert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		Key:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}),
	}, nil
}

// Write writes the pair as <dir>/<name>.crt and <dir>/<name>.key (0600)
// and returns their paths.
func (p Pair) Write(dir, name string) (cert, key string, err error) {
	cert, key = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := os.WriteFile(cert, p.Cert, 0o600); err != nil {
		return "", "", fmt.Errorf("write %s: %w", cert, err)
	}
	if err := os.WriteFile(key, p.Key, 0o600); err != nil {
		return "", "", fmt.Errorf("write %s: %w", key, err)
	}
	return cert, key, nil
}

// WriteCA writes the CA certificate as <dir>/<name>.crt.
func (ca *CA) WriteCA(dir, name string) (string, error) {
	p := filepath.Join(dir, name+".crt")
	if err := os.WriteFile(p, ca.PEM, 0o600); err != nil {
		return "", fmt.Errorf("write %s: %w", p, err)
	}
	return p, nil
}
