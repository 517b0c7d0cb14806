package gateway

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// CertSource gives the serving certificate, the current one at every
// handshake.
type CertSource interface {
	GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error)
}

// FileCert serves a certificate and key from PEM files and loads them
// again when either changes (checked at most every CheckEvery, default
// 2s), so that a rotated certificate (a mounted Secret, cert-manager) is
// served without a restart. A pair that does not load is reported and the
// previous one kept.
type FileCert struct {
	CertFile, KeyFile string
	CheckEvery        time.Duration
	Log               *slog.Logger

	mu      sync.Mutex
	cert    *tls.Certificate
	stamp   string
	checked time.Time
}

// NewFileCert loads the pair once, so that a bad pair fails at start.
func NewFileCert(certFile, keyFile string, log *slog.Logger) (*FileCert, error) {
	f := &FileCert{CertFile: certFile, KeyFile: keyFile, Log: log}
	if f.Log == nil {
		f.Log = slog.New(slog.DiscardHandler)
	}
	stamp, err := f.stampNow()
	if err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("gateway serving certificate: %w", err)
	}
	f.cert, f.stamp, f.checked = &cert, stamp, time.Now()
	return f, nil
}

// stampNow identifies the files' current contents by size and time.
func (f *FileCert) stampNow() (string, error) {
	var b bytes.Buffer
	for _, p := range []string{f.CertFile, f.KeyFile} {
		st, err := os.Stat(p)
		if err != nil {
			return "", fmt.Errorf("gateway serving certificate: %w", err)
		}
		fmt.Fprintf(&b, "%d/%d;", st.Size(), st.ModTime().UnixNano())
	}
	return b.String(), nil
}

// GetCertificate is for tls.Config.
func (f *FileCert) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	every := f.CheckEvery
	if every <= 0 {
		every = 2 * time.Second
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if time.Since(f.checked) < every {
		return f.cert, nil
	}
	f.checked = time.Now()
	stamp, err := f.stampNow()
	if err != nil || stamp == f.stamp {
		if err != nil {
			f.Log.Warn("cannot check the gateway's serving certificate; serving the one loaded", "err", err)
		}
		return f.cert, nil
	}
	cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
	if err != nil {
		// Often the two files are mid-rotation: try again at the next check.
		f.Log.Warn("the gateway's serving certificate changed but does not load; serving the previous one", "err", err)
		return f.cert, nil
	}
	f.cert, f.stamp = &cert, stamp
	f.Log.Info("gateway serving certificate reloaded", "certFile", f.CertFile)
	return f.cert, nil
}

// SecretCert serves the certificate of a kubernetes.io/tls Secret on the
// hub (tls.crt, tls.key), following its updates through an informer on
// that one Secret. A Secret that does not load is reported and the
// previous certificate kept.
type SecretCert struct {
	Namespace, Name string
	Log             *slog.Logger

	mu   sync.Mutex
	cert *tls.Certificate
	ca   []byte
}

// Run watches the Secret until ctx ends; it returns once the informer
// has synced.
func (s *SecretCert) Run(ctx context.Context, kube kubernetes.Interface) error {
	if s.Log == nil {
		s.Log = slog.New(slog.DiscardHandler)
	}
	f := informers.NewSharedInformerFactoryWithOptions(kube, 10*time.Minute, informers.WithNamespace(s.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", s.Name).String()
		}))
	inf := f.Core().V1().Secrets().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.load(obj) },
		UpdateFunc: func(_, obj any) { s.load(obj) },
		DeleteFunc: func(any) {
			s.Log.Warn("the gateway's serving certificate Secret was deleted; serving the last certificate", "secret", s.Namespace+"/"+s.Name)
		},
	}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return ctx.Err()
	}
	return nil
}

func (s *SecretCert) load(obj any) {
	sec, ok := obj.(*corev1.Secret)
	if !ok {
		return
	}
	cert, err := tls.X509KeyPair(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		s.Log.Warn("the gateway's serving certificate Secret does not hold a certificate and key; serving the previous one",
			"secret", s.Namespace+"/"+s.Name, "err", err)
		return
	}
	s.mu.Lock()
	first := s.cert == nil
	s.cert, s.ca = &cert, sec.Data["ca.crt"]
	s.mu.Unlock()
	if !first {
		s.Log.Info("gateway serving certificate reloaded", "secret", s.Namespace+"/"+s.Name)
	}
}

// GetCertificate is for tls.Config.
func (s *SecretCert) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cert == nil {
		return nil, fmt.Errorf("no serving certificate yet in Secret %s/%s", s.Namespace, s.Name)
	}
	return s.cert, nil
}

// ServerOptions configure the gateway's HTTPS server. They arrive filled
// (ServerOptionsFor, from the configuration).
type ServerOptions struct {
	Certs CertSource
	// MaxHeaderBytes bounds a request's headers (HTTP/1.1 and HTTP/2).
	MaxHeaderBytes int
	// ReadHeaderTimeout bounds reading a request's headers: a client
	// that sends them slowly is cut off.
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes keep-alive connections left idle.
	IdleTimeout time.Duration
	Log         *slog.Logger
}

// Serve serves h over TLS on ln until ctx ends, then shuts down, letting
// requests finish for a few seconds.
func Serve(ctx context.Context, ln net.Listener, h http.Handler, o ServerOptions) error {
	if o.Certs == nil {
		return errors.New("gateway: no serving certificate")
	}
	if err := o.check(); err != nil {
		return err
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	srv := &http.Server{
		Handler: h,
		TLSConfig: &tls.Config{
			MinVersion:     tls.VersionTLS12,
			GetCertificate: o.Certs.GetCertificate,
			NextProtos:     []string{"h2", "http/1.1"},
		},
		MaxHeaderBytes:    o.MaxHeaderBytes,
		ReadHeaderTimeout: o.ReadHeaderTimeout,
		IdleTimeout:       o.IdleTimeout,
		ErrorLog:          slog.NewLogLogger(o.Log.Handler(), slog.LevelDebug),
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(ln, "", "") }()
	select {
	case err := <-errc:
		return fmt.Errorf("gateway server: %w", err)
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		_ = srv.Close()
	}
	<-errc
	return nil
}
