//! TLS for every listener (docs/security.md): one certificate (`[tls] cert`,
//! `key`), optionally requiring client certificates signed by `client_ca`.
//! gRPC gets it through tonic's rustls integration; HTTP and the data plane
//! through a rustls acceptor on each accepted connection.
use crate::config::TlsSection;
use anyhow::Context;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::sync::Arc;

/// The files of `[tls]`, read once at start-up.
#[derive(Clone)]
pub struct Tls {
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    client_ca_pem: Option<Vec<u8>>,
    /// rustls' view, for HTTP and the data plane.
    pub config: Arc<rustls::ServerConfig>,
}

fn read(path: &str, what: &str) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read tls.{what} {path:?}"))
}

impl Tls {
    /// Reads and checks `[tls]`; `None` when TLS is off.
    pub fn load(cfg: &TlsSection) -> anyhow::Result<Option<Tls>> {
        if !cfg.enabled() {
            return Ok(None);
        }
        let cert_pem = read(&cfg.cert, "cert")?;
        let key_pem = read(&cfg.key, "key")?;
        let client_ca_pem = match cfg.client_ca.as_str() {
            "" => None,
            p => Some(read(p, "client_ca")?),
        };
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<_, _>>()
            .with_context(|| format!("tls.cert {:?} is not a PEM certificate chain", cfg.cert))?;
        if certs.is_empty() {
            anyhow::bail!("tls.cert {:?} holds no certificate", cfg.cert);
        }
        let key = PrivateKeyDer::from_pem_slice(&key_pem)
            .with_context(|| format!("tls.key {:?} holds no PEM private key", cfg.key))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?;
        let builder = match &client_ca_pem {
            None => builder.with_no_client_auth(),
            Some(pem) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in CertificateDer::pem_slice_iter(pem) {
                    let c = c.with_context(|| {
                        format!("tls.client_ca {:?} is not a PEM bundle", cfg.client_ca)
                    })?;
                    roots
                        .add(c)
                        .with_context(|| format!("tls.client_ca {:?}", cfg.client_ca))?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    roots.into(),
                    provider,
                )
                .build()
                .with_context(|| format!("tls.client_ca {:?}", cfg.client_ca))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder
            .with_single_cert(certs, key)
            .context("tls.cert and tls.key do not make a usable identity")?;
        // HTTP/1.1 for the HTTP listener; the data plane names no protocol.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Some(Tls {
            cert_pem,
            key_pem,
            client_ca_pem,
            config: Arc::new(config),
        }))
    }

    /// tonic's server TLS settings.
    pub fn grpc(&self) -> tonic::transport::ServerTlsConfig {
        let mut t = tonic::transport::ServerTlsConfig::new().identity(
            tonic::transport::Identity::from_pem(&self.cert_pem, &self.key_pem),
        );
        if let Some(ca) = &self.client_ca_pem {
            t = t.client_ca_root(tonic::transport::Certificate::from_pem(ca));
        }
        t
    }

    /// The acceptor for HTTP and data-plane connections.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.config.clone())
    }
}
