//! TLS for every listener (docs/security.md): one certificate (`[tls] cert`,
//! `key`), optionally requiring client certificates signed by `client_ca`.
//!
//! Every listener (gRPC, HTTP, data plane) completes its handshakes with a
//! rustls acceptor built from the *current* configuration, so
//! [`Tls::reload`] (SIGHUP) swaps certificate, key and client CA without a
//! restart: connections accepted afterwards use the new files, connections
//! already open keep the session they negotiated. A reload that fails (a
//! file missing, a key that does not match) changes nothing and says why.
use crate::config::TlsSection;
use anyhow::Context;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::sync::{Arc, RwLock};

/// ALPN of the gRPC listeners.
const ALPN_GRPC: &[u8] = b"h2";
/// ALPN of the HTTP listener; the data plane names no protocol and accepts it.
const ALPN_HTTP: &[u8] = b"http/1.1";

/// The rustls configurations built from one reading of the files.
struct Loaded {
    grpc: Arc<rustls::ServerConfig>,
    http: Arc<rustls::ServerConfig>,
}

/// The files of `[tls]` and the configurations currently served.
pub struct Tls {
    files: TlsSection,
    current: RwLock<Arc<Loaded>>,
}

/// Which listener an [`Acceptor`] serves.
#[derive(Clone, Copy)]
enum Front {
    Grpc,
    Http,
}

/// Accepts TLS connections with whatever configuration is current at accept time.
#[derive(Clone)]
pub struct Acceptor {
    tls: Arc<Tls>,
    front: Front,
}

impl Acceptor {
    /// Starts the server side of a handshake on `io`.
    pub fn accept<IO>(&self, io: IO) -> tokio_rustls::Accept<IO>
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let cur = self.tls.current();
        let config = match self.front {
            Front::Grpc => cur.grpc.clone(),
            Front::Http => cur.http.clone(),
        };
        tokio_rustls::TlsAcceptor::from(config).accept(io)
    }
}

fn read(path: &str, what: &str) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read tls.{what} {path:?}"))
}

fn build(cfg: &TlsSection) -> anyhow::Result<Loaded> {
    let cert_pem = read(&cfg.cert, "cert")?;
    let key_pem = read(&cfg.key, "key")?;
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
    let builder = match cfg.client_ca.as_str() {
        "" => builder.with_no_client_auth(),
        path => {
            let pem = read(path, "client_ca")?;
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(&pem) {
                let c = c.with_context(|| format!("tls.client_ca {path:?} is not a PEM bundle"))?;
                roots
                    .add(c)
                    .with_context(|| format!("tls.client_ca {path:?}"))?;
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .with_context(|| format!("tls.client_ca {path:?}"))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let base = builder
        .with_single_cert(certs, key)
        .context("tls.cert and tls.key do not make a usable identity")?;
    let with_alpn = |alpn: &[u8]| {
        let mut c = base.clone();
        c.alpn_protocols = vec![alpn.to_vec()];
        Arc::new(c)
    };
    Ok(Loaded {
        grpc: with_alpn(ALPN_GRPC),
        http: with_alpn(ALPN_HTTP),
    })
}

impl Tls {
    /// Reads and checks `[tls]`; `None` when TLS is off.
    pub fn load(cfg: &TlsSection) -> anyhow::Result<Option<Arc<Tls>>> {
        if !cfg.enabled() {
            return Ok(None);
        }
        let loaded = build(cfg)?;
        Ok(Some(Arc::new(Tls {
            files: cfg.clone(),
            current: RwLock::new(Arc::new(loaded)),
        })))
    }

    fn current(&self) -> Arc<Loaded> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Reads the files again and serves them to every connection accepted
    /// from now on. On error the previous certificate stays in service.
    pub fn reload(&self) -> anyhow::Result<()> {
        let loaded =
            build(&self.files).context("TLS reload refused; the previous certificate stays")?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(loaded);
        Ok(())
    }

    /// The acceptor of the gRPC listeners (ALPN `h2`).
    pub fn grpc_acceptor(self: &Arc<Self>) -> Acceptor {
        Acceptor {
            tls: self.clone(),
            front: Front::Grpc,
        }
    }

    /// The acceptor of the HTTP listener and the data plane (ALPN `http/1.1`,
    /// which data-plane clients do not ask for).
    pub fn acceptor(self: &Arc<Self>) -> Acceptor {
        Acceptor {
            tls: self.clone(),
            front: Front::Http,
        }
    }
}
