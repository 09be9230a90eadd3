//! TLS on every listener (docs/security.md): gRPC, the data plane and HTTP
//! round-trip over TLS with a CA the test makes; plaintext is refused on all
//! three; with `client_ca`, a client without a certificate is refused.
mod common;

use bytes::Bytes;
use kvtier_client::{Client, ClientConfig, ClientTls, WriteBlock};
use kvtier_core::Key;
use kvtier_proto::wire::Kind;
use kvtier_server::Server;
use std::path::PathBuf;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Pki {
    dir: tempfile::TempDir,
    ca_pem: String,
    client_cert: String,
    client_key: String,
}

impl Pki {
    /// A CA, a server certificate for 127.0.0.1/localhost, a client certificate.
    fn new() -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let dir = tempfile::tempdir().unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "kvtier test CA");
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let leaf = |names: Vec<String>| {
            let key = KeyPair::generate().unwrap();
            let cert = CertificateParams::new(names)
                .unwrap()
                .signed_by(&key, &issuer)
                .unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = leaf(vec!["127.0.0.1".into(), "localhost".into()]);
        let (client_cert, client_key) = leaf(vec!["client.kvtier.test".into()]);
        for (name, pem) in [
            ("ca.pem", ca_cert.pem()),
            ("server.pem", server_cert),
            ("server.key", server_key),
        ] {
            std::fs::write(dir.path().join(name), pem).unwrap();
        }
        Pki {
            dir,
            ca_pem: ca_cert.pem(),
            client_cert,
            client_key,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    async fn server(&self, verify_clients: bool) -> Server {
        let mut cfg = common::test_config();
        let s = |p: PathBuf| p.to_string_lossy().into_owned();
        cfg.tls.cert = s(self.path("server.pem"));
        cfg.tls.key = s(self.path("server.key"));
        if verify_clients {
            cfg.tls.client_ca = s(self.path("ca.pem"));
        }
        Server::start(cfg).await.expect("server starts with TLS")
    }

    fn client_config(&self, server: &Server, with_identity: bool) -> ClientConfig {
        let mut cc = ClientConfig::new(format!("http://{}", server.grpc_addrs[0]));
        cc.timeout = Duration::from_secs(5);
        cc.retries = 0;
        cc.tls = Some(ClientTls {
            ca_pem: self.ca_pem.clone().into_bytes(),
            identity: with_identity.then(|| {
                (
                    self.client_cert.clone().into(),
                    self.client_key.clone().into(),
                )
            }),
            domain: None,
        });
        cc
    }
}

async fn round_trip(c: &Client) {
    let key = Key::new(&b"tls-key-0001"[..]).unwrap();
    let payload = Bytes::from(vec![42u8; 300_000]);
    let w = c
        .write(
            "tls",
            &[WriteBlock {
                token_ids: Vec::new(),
                key: key.clone(),
                parent: None,
                token_count: 0,
                payload: payload.clone(),
                ttl_ms: 0,
            }],
        )
        .await
        .expect("write over TLS");
    assert_eq!(w.stored + w.existing, 1);
    assert_eq!(
        c.lookup("tls", std::slice::from_ref(&key), None)
            .await
            .unwrap()
            .found,
        1
    );
    let r = c.read("tls", &[key], 0).await.expect("read over TLS");
    assert_eq!(r.blocks[0].payload, payload);
}

#[tokio::test]
async fn grpc_and_the_data_plane_round_trip_over_tls_and_refuse_plaintext() {
    let pki = Pki::new();
    let server = pki.server(false).await;
    let c = Client::connect(pki.client_config(&server, false))
        .await
        .expect("TLS client connects");
    assert!(
        c.data_plane().is_some(),
        "the data plane is used over TLS too"
    );
    round_trip(&c).await;

    // gRPC without TLS: no call succeeds.
    let mut plain = ClientConfig::new(format!("http://{}", server.grpc_addrs[0]));
    plain.timeout = Duration::from_secs(3);
    plain.retries = 0;
    plain.data_plane = false;
    let refused = match Client::connect(plain).await {
        Err(_) => true,
        Ok(c) => c
            .lookup("tls", &[Key::new(&b"k"[..]).unwrap()], None)
            .await
            .is_err(),
    };
    assert!(refused, "plaintext gRPC refused");

    // A plaintext data-plane frame: the server never answers with a frame.
    let mut raw = TcpStream::connect(server.data_addr.unwrap()).await.unwrap();
    raw.write_all(&common::frame(Kind::Read, 1, &[], &[]))
        .await
        .unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), raw.read_to_end(&mut buf)).await;
    assert!(
        !buf.starts_with(b"KVW"),
        "a plaintext data-plane request got a data-plane answer"
    );

    // A client trusting another CA refuses the server.
    let other = Pki::new();
    let mut wrong = pki.client_config(&server, false);
    wrong.tls.as_mut().unwrap().ca_pem = other.ca_pem.clone().into_bytes();
    assert!(Client::connect(wrong).await.is_err(), "unknown CA refused");
}

#[tokio::test]
async fn http_is_served_over_tls_only() {
    let pki = Pki::new();
    let server = pki.server(false).await;
    let addr = server.http_addr.unwrap();
    let tls = ClientTls {
        ca_pem: pki.ca_pem.clone().into_bytes(),
        identity: None,
        domain: None,
    }
    .wire(&format!("http://{addr}"))
    .unwrap();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let mut s = tls
        .connector
        .connect(tls.server_name.clone(), tcp)
        .await
        .expect("TLS handshake");
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.ok();
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");

    let mut plain = TcpStream::connect(addr).await.unwrap();
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut out)).await;
    assert!(
        !out.starts_with(b"HTTP/"),
        "plaintext HTTP answered: {:?}",
        String::from_utf8_lossy(&out)
    );
}

#[tokio::test]
async fn client_certificates_are_required_when_client_ca_is_set() {
    let pki = Pki::new();
    let server = pki.server(true).await;
    let c = Client::connect(pki.client_config(&server, true))
        .await
        .expect("a client with a certificate from the CA");
    round_trip(&c).await;
    assert!(
        Client::connect(pki.client_config(&server, false))
            .await
            .is_err(),
        "a client without a certificate is refused"
    );

    // The data plane and HTTP verify client certificates too: over TLS
    // without one, a request gets no answer; with one, HTTP answers.
    let tls = |identity: bool| {
        ClientTls {
            ca_pem: pki.ca_pem.clone().into_bytes(),
            identity: identity.then(|| {
                (
                    pki.client_cert.clone().into(),
                    pki.client_key.clone().into(),
                )
            }),
            domain: None,
        }
        .wire("http://127.0.0.1:1")
        .unwrap()
    };
    let ask = |addr: std::net::SocketAddr, identity: bool, request: Vec<u8>| {
        let tls = tls(identity);
        async move {
            let tcp = TcpStream::connect(addr).await.unwrap();
            let Ok(mut s) = tls.connector.connect(tls.server_name.clone(), tcp).await else {
                return Vec::new(); // refused in the handshake
            };
            let _ = s.write_all(&request).await;
            let mut out = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
            out
        }
    };
    let get = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec();
    let http = server.http_addr.unwrap();
    let out = ask(http, true, get.clone()).await;
    assert!(
        out.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&out)
    );
    let out = ask(http, false, get).await;
    assert!(
        out.is_empty(),
        "HTTP answered a client without a certificate: {:?}",
        String::from_utf8_lossy(&out)
    );
    let frame = common::frame(Kind::Read, 1, &[], &[]);
    let out = ask(server.data_addr.unwrap(), false, frame).await;
    assert!(
        out.is_empty(),
        "the data plane answered a client without a certificate: {out:?}"
    );
}

/// Certificate rotation without a restart: after the files are replaced and
/// `reload` runs (SIGHUP in `kvtier serve`), new connections on gRPC, the data
/// plane and HTTP get the new certificate, connections already open keep
/// working, and a reload from broken files changes nothing.
#[tokio::test]
async fn certificates_rotate_on_reload_without_a_restart() {
    let old = Pki::new();
    let server = old.server(false).await;
    let tls = server.tls.clone().expect("TLS on");
    let open = Client::connect(old.client_config(&server, false))
        .await
        .expect("client of the first CA");
    round_trip(&open).await;

    // New files under the configured names; nothing changes until the reload.
    let new = Pki::new();
    for f in ["server.pem", "server.key"] {
        std::fs::copy(new.path(f), old.path(f)).unwrap();
    }
    assert!(
        Client::connect(new.client_config(&server, false))
            .await
            .is_err(),
        "the new certificate must not be served before the reload"
    );
    tls.reload().expect("reload");

    let c = Client::connect(new.client_config(&server, false))
        .await
        .expect("a client of the new CA connects after the reload");
    assert!(c.data_plane().is_some());
    round_trip(&c).await;
    assert!(
        Client::connect(old.client_config(&server, false))
            .await
            .is_err(),
        "new connections no longer get the old certificate"
    );
    // HTTP too.
    let addr = server.http_addr.unwrap();
    let http_tls = |ca: &Pki| {
        ClientTls {
            ca_pem: ca.ca_pem.clone().into_bytes(),
            identity: None,
            domain: None,
        }
        .wire(&format!("http://{addr}"))
        .unwrap()
    };
    let w = http_tls(&new);
    let tcp = TcpStream::connect(addr).await.unwrap();
    w.connector
        .connect(w.server_name.clone(), tcp)
        .await
        .expect("HTTP handshake with the new certificate");
    let w = http_tls(&old);
    let tcp = TcpStream::connect(addr).await.unwrap();
    assert!(
        w.connector
            .connect(w.server_name.clone(), tcp)
            .await
            .is_err()
    );
    // The connection opened before the rotation still works.
    round_trip(&open).await;

    // A broken key: the reload is refused and the current certificate stays.
    std::fs::write(old.path("server.key"), "not a key").unwrap();
    let e = tls.reload().expect_err("a broken key is refused");
    assert!(format!("{e:#}").contains("tls.key"), "{e:#}");
    let c = Client::connect(new.client_config(&server, false))
        .await
        .expect("still serving the last good certificate");
    round_trip(&c).await;
}
