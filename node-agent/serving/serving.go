// SPDX-License-Identifier: Apache-2.0

// Package serving secures the node agent's HTTP endpoints the way kube-scheduler secures
// its port: HTTPS, the caller's bearer token checked by the API server (TokenReview), and
// its permission to get the request's non-resource URL (/metrics) checked there too
// (SubjectAccessReview). The health paths stay open without credentials for kubelet's
// probes.
//
// It is assembled from k8s.io/apiserver's parts (authenticatorfactory,
// authorizerfactory, endpoints/filters, dynamiccertificates), which is what
// apiserver's server/options package does for kube-scheduler; that package itself
// would also link the generic API server's etcd, admission and audit options into a
// binary that runs on every GPU node.
package serving

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/apis/apiserver"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/apiserver/pkg/authorization/path"
	"k8s.io/apiserver/pkg/authorization/union"
	genericfilters "k8s.io/apiserver/pkg/endpoints/filters"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	certutil "k8s.io/client-go/util/cert"
)

// OpenPaths are served to anyone, without credentials: kubelet's HTTP probes carry none.
// They must reveal nothing about the node's tenants.
var OpenPaths = []string{"/healthz", "/livez", "/readyz"}

// The delegation's caches and timeouts are kube-scheduler's defaults
// (DelegatingAuthenticationOptions, DelegatingAuthorizationOptions): a scrape every
// 30 s costs at most one TokenReview and one SubjectAccessReview.
const (
	cacheTTL      = 10 * time.Second
	reviewTimeout = 10 * time.Second
)

// retryBackoff is apiserver's DefaultAuthWebhookRetryBackoff.
var retryBackoff = wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}

// Auth decides who a request comes from and whether it may have what it asks for.
type Auth struct {
	Authenticator authenticator.Request
	Authorizer    authorizer.Authorizer
}

// Delegated asks the API server behind client: TokenReview for the bearer token,
// SubjectAccessReview for the request's path and verb. Requests without credentials
// are anonymous on OpenPaths only (401 elsewhere); OpenPaths are allowed to everyone,
// and system:masters everything, as kube-scheduler does. Client certificates are not
// accepted: that would need the cluster's client CA from kube-system's
// extension-apiserver-authentication ConfigMap, and the right to read it on every node.
func Delegated(client kubernetes.Interface) (*Auth, error) {
	anonymous := &apiserver.AnonymousAuthConfig{Enabled: true}
	for _, p := range OpenPaths {
		anonymous.Conditions = append(anonymous.Conditions, apiserver.AnonymousAuthCondition{Path: p})
	}
	backoff := retryBackoff
	authn, _, err := authenticatorfactory.DelegatingAuthenticatorConfig{
		Anonymous:                anonymous,
		TokenAccessReviewClient:  client.AuthenticationV1(),
		TokenAccessReviewTimeout: reviewTimeout,
		WebhookRetryBackoff:      &backoff,
		CacheTTL:                 cacheTTL,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("delegated authentication: %w", err)
	}
	sar, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: client.AuthorizationV1(),
		AllowCacheTTL:             cacheTTL,
		DenyCacheTTL:              cacheTTL,
		WebhookRetryBackoff:       &backoff,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("delegated authorization: %w", err)
	}
	authz, err := withOpenPaths(sar)
	if err != nil {
		return nil, err
	}
	return &Auth{Authenticator: authn, Authorizer: authz}, nil
}

// withOpenPaths puts kube-scheduler's always-allow rules in front of authz.
func withOpenPaths(authz authorizer.Authorizer) (authorizer.Authorizer, error) {
	open, err := path.NewAuthorizer(OpenPaths)
	if err != nil {
		return nil, err
	}
	return union.New(
		union.NamedAuthorizer{AuthorizerName: "kubernetes.io/always-allow-groups", Authorizer: authorizerfactory.NewPrivilegedGroups("system:masters")},
		union.NamedAuthorizer{AuthorizerName: "kubernetes.io/always-allow-paths", Authorizer: open},
		union.NamedAuthorizer{AuthorizerName: "kubernetes.io/webhook", Authorizer: authz},
	)
}

// Handler wraps h as kube-scheduler wraps its port's handler: a request whose
// credentials do not authenticate gets 401, one its caller may not make 403 (both as a
// Kubernetes Status), before h sees it.
func (a *Auth) Handler(h http.Handler) http.Handler {
	h = genericfilters.WithAuthorization(h, a.Authorizer, scheme.Codecs)
	h = genericfilters.WithAuthentication(h, a.Authenticator, genericfilters.Unauthorized(scheme.Codecs), nil, nil)
	h = genericfilters.WithRequestInfo(h, &request.RequestInfoFactory{})
	return genericfilters.WithCacheControl(h)
}

// TLSConfig returns the server side of TLS: the certificate and key in certFile and
// keyFile, re-read when they change (a rotated certificate is served without a
// restart), or, when both are empty, a self-signed certificate generated in memory for
// hosts (names or IP addresses). The reloading stops with ctx.
func TLSConfig(ctx context.Context, certFile, keyFile string, hosts []string) (*tls.Config, error) {
	var cert dynamiccertificates.CertKeyContentProvider
	var files *dynamiccertificates.DynamicCertKeyPairContent
	switch {
	case certFile != "" && keyFile != "":
		var err error
		files, err = dynamiccertificates.NewDynamicServingContentFromFiles("serving-cert", certFile, keyFile)
		if err != nil {
			return nil, err
		}
		cert = files
	case certFile == "" && keyFile == "":
		var ips []net.IP
		var names []string
		for _, h := range hosts {
			if ip := net.ParseIP(h); ip != nil {
				ips = append(ips, ip)
			} else if h != "" {
				names = append(names, h)
			}
		}
		if len(names) == 0 {
			names = []string{"localhost"}
		}
		crt, key, err := certutil.GenerateSelfSignedCertKey(names[0], ips, names[1:])
		if err != nil {
			return nil, fmt.Errorf("generating a self-signed certificate: %w", err)
		}
		cert, err = dynamiccertificates.NewStaticCertKeyContent("self-signed", crt, key)
		if err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("a certificate file needs its key file and the other way round")
	}
	base := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}
	ctrl := dynamiccertificates.NewDynamicServingCertificateController(base, nil, cert, nil, nil)
	if files != nil {
		files.AddListener(ctrl)
		if err := files.RunOnce(ctx); err != nil {
			return nil, err
		}
		go files.Run(ctx, 1)
	}
	if err := ctrl.RunOnce(); err != nil {
		return nil, err
	}
	go ctrl.Run(1, ctx.Done())
	return &tls.Config{MinVersion: tls.VersionTLS12, GetConfigForClient: ctrl.GetConfigForClient}, nil
}
