package kubetest

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
	"time"
)

// pki is what the cluster's TLS and service accounts need, written in dir:
// a CA, the apiserver's serving certificate signed by it (127.0.0.1,
// localhost and the in-cluster names), and the service-account key pair.
type pki struct {
	caCert            []byte // PEM, also inlined in the kubeconfigs
	caFile            string
	servingCert       string
	servingKey        string
	serviceAccountKey string // private, for signing (apiserver) and tokens (controller-manager)
	serviceAccountPub string
	caKey             *ecdsa.PrivateKey // signs issueServing's certificates
	ca                *x509.Certificate
}

func makePKI(dir string) (pki, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return pki{}, fmt.Errorf("kubetest: generate the CA key: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "reaper-kubetest-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return pki{}, fmt.Errorf("kubetest: make the CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return pki{}, fmt.Errorf("kubetest: parse the CA certificate: %w", err)
	}

	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return pki{}, fmt.Errorf("kubetest: generate the serving key: %w", err)
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default",
			"kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		// Loopback; the pod network's gateway and the kubernetes
		// Service's ClusterIP, where an in-cluster cluster serves.
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, net.ParseIP(NodeGateway), net.ParseIP(KubernetesServiceIP)},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		return pki{}, fmt.Errorf("kubetest: make the serving certificate: %w", err)
	}

	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return pki{}, fmt.Errorf("kubetest: generate the service-account key: %w", err)
	}
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return pki{}, fmt.Errorf("kubetest: encode the service-account public key: %w", err)
	}

	p := pki{
		caCert:            pemBlock("CERTIFICATE", caDER),
		caFile:            filepath.Join(dir, "ca.crt"),
		servingCert:       filepath.Join(dir, "apiserver.crt"),
		servingKey:        filepath.Join(dir, "apiserver.key"),
		serviceAccountKey: filepath.Join(dir, "sa.key"),
		serviceAccountPub: filepath.Join(dir, "sa.pub"),
		caKey:             caKey,
		ca:                ca,
	}
	srvKeyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		return pki{}, fmt.Errorf("kubetest: encode the serving key: %w", err)
	}
	saKeyDER, err := x509.MarshalECPrivateKey(saKey)
	if err != nil {
		return pki{}, fmt.Errorf("kubetest: encode the service-account key: %w", err)
	}
	files := []struct {
		path string
		data []byte
	}{
		{p.caFile, p.caCert},
		{p.servingCert, pemBlock("CERTIFICATE", srvDER)},
		{p.servingKey, pemBlock("EC PRIVATE KEY", srvKeyDER)},
		{p.serviceAccountKey, pemBlock("EC PRIVATE KEY", saKeyDER)},
		{p.serviceAccountPub, pemBlock("PUBLIC KEY", saPub)},
	}
	for _, f := range files {
		if err := os.WriteFile(f.path, f.data, 0o600); err != nil {
			return pki{}, fmt.Errorf("kubetest: write %s: %w", f.path, err)
		}
	}
	return p, nil
}

// issueServing writes a serving certificate signed by the cluster's CA
// for ip and loopback into dir as NAME.crt and NAME.key.
func (p pki) issueServing(dir, name, ip string) (certFile, keyFile string, err error) {
	cert, key, err := p.issue(name, []string{"localhost"}, []net.IP{net.ParseIP(ip), net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return "", "", err
	}
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := os.WriteFile(certFile, cert, 0o600); err != nil {
		return "", "", fmt.Errorf("kubetest: write %s: %w", certFile, err)
	}
	if err := os.WriteFile(keyFile, key, 0o600); err != nil {
		return "", "", fmt.Errorf("kubetest: write %s: %w", keyFile, err)
	}
	return certFile, keyFile, nil
}

// issue makes a serving certificate signed by the cluster's CA for the
// names and addresses given, and returns it and its key, PEM.
func (p pki) issue(name string, dnsNames []string, ips []net.IP) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("kubetest: generate the %s key: %w", name, err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     dnsNames,
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("kubetest: make the %s certificate: %w", name, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("kubetest: encode the %s key: %w", name, err)
	}
	return pemBlock("CERTIFICATE", der), pemBlock("EC PRIVATE KEY", keyDER), nil
}

// ServingCert is a serving certificate for a Service's DNS names, signed
// by the cluster's CA (an operator's certificate, as cert-manager would
// issue it): the certificate, its key and the CA, PEM.
type ServingCert struct{ Cert, Key, CA []byte }

// IssueServingCert issues a ServingCert for dnsNames.
func (c *Cluster) IssueServingCert(name string, dnsNames ...string) (ServingCert, error) {
	cert, key, err := c.pki.issue(name, dnsNames, nil)
	if err != nil {
		return ServingCert{}, err
	}
	return ServingCert{Cert: cert, Key: key, CA: append([]byte(nil), c.pki.caCert...)}, nil
}

func pemBlock(kind string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der})
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}
