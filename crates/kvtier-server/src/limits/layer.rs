//! The gRPC server's tower layer that charges request bodies to the request
//! memory (see [`ChargeLayer`]).
use super::charged::{CLIENT_STREAMING, ChargedBody};
use super::reply::InUseBody;
use super::{BoxError, Held, Limits, activity_of, charged};

/// Tower layer for the gRPC server: every request body's bytes are charged to
/// the request memory as its HTTP/2 frames arrive, and held until the
/// response is ready (a unary handler keeps the decoded message that long);
/// a stream of messages (`WriteStream`, kvstore `StreamingRead`) gives each
/// message's bytes back once it was handled and the server asks for more.
/// A frame that does not fit fails the request with RESOURCE_EXHAUSTED, the
/// rest of its body unread. A body must also keep arriving: a unary
/// `kvtier.v1` or `kvstore` call's whole body within `server.read_timeout` of
/// its start; any other call (client streaming, bidirectional, reflection)
/// must not keep the server waiting for its next bytes longer than that
/// (time the server spends answering, before it asks for more, does not
/// count). Past it the request fails with DEADLINE_EXCEEDED and what it held
/// is given back (a client that announces a large upload and stalls holds
/// its bytes no longer). A response body the client takes nothing of for
/// `server.write_timeout` is dropped, with what it holds (see
/// [`reply::InUseBody`]).
#[derive(Clone)]
pub struct ChargeLayer(pub Limits);

impl<S> tower::Layer<S> for ChargeLayer {
    type Service = ChargeService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        ChargeService {
            inner,
            limits: self.0.clone(),
        }
    }
}

/// See [`ChargeLayer`].
#[derive(Clone)]
pub struct ChargeService<S> {
    inner: S,
    limits: Limits,
}

impl<S, B> tower::Service<http::Request<B>> for ChargeService<S>
where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
        >,
    S::Future: Send + 'static,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        // The connection is in use until the response's body has been sent
        // (a streamed Read is served while its body goes out).
        let in_use = activity_of(req.extensions()).map(|a| a.start());
        let held: Held = Default::default();
        let limits = self.limits.clone();
        let h = held.clone();
        let path = req.uri().path();
        let whole_body = (path.starts_with("/kvtier.v1.KvTier/")
            || path.starts_with("/kvstore.KVStoreService/"))
            && !CLIENT_STREAMING.contains(&path);
        // A stream of messages is charged for the messages it holds, not all it sent.
        let per_message = CLIENT_STREAMING.contains(&path);
        let factor = charged::charge_factor(path);
        let req = req.map(move |b| {
            tonic::body::Body::new(ChargedBody {
                inner: Box::pin(b),
                limits,
                held: h,
                factor,
                stall: None,
                start: tokio::time::Instant::now(),
                whole_body,
                waiting: whole_body,
                framing: per_message.then(Default::default),
                sized: false,
            })
        });
        let idle = self.limits.write_timeout;
        let fut = self.inner.call(req);
        Box::pin(async move {
            let r = fut.await;
            drop(held);
            r.map(|resp| {
                resp.map(|inner| tonic::body::Body::new(InUseBody::new(inner, in_use, idle)))
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{Activity, Capped, ConnInfo, DRAIN_IDLE};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// A streamed reply (a Read) is served while its body goes out: the
    /// connection must count as in use until the body is done, or the idle
    /// timeout and the shutdown drain could close it mid-reply.
    #[tokio::test]
    async fn a_connection_stays_in_use_until_its_reply_body_is_done() {
        use tower::{Layer, Service, ServiceExt};
        let activity = Arc::new(Activity::new(Default::default()));
        /// A reply body still being produced (as a streamed Read's is).
        struct Streaming;
        impl http_body::Body for Streaming {
            type Data = bytes::Bytes;
            type Error = tonic::Status;
            fn poll_frame(
                self: std::pin::Pin<&mut Self>,
                _: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>>
            {
                std::task::Poll::Pending
            }
        }
        let inner = tower::service_fn(|_req: http::Request<tonic::body::Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(tonic::body::Body::new(
                Streaming,
            )))
        });
        let mut charged = ChargeLayer(Limits::unlimited()).layer(inner);
        let mut req = http::Request::new(tonic::body::Body::empty());
        req.extensions_mut().insert(ConnInfo {
            tcp: tonic::transport::server::TcpConnectInfo {
                local_addr: None,
                remote_addr: None,
            },
            activity: activity.clone(),
        });
        let reply = ServiceExt::<http::Request<tonic::body::Body>>::ready(&mut charged)
            .await
            .unwrap()
            .call(req)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(
            activity.idle_for(),
            Duration::ZERO,
            "reply body not sent yet"
        );
        drop(reply);
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(activity.idle_for() >= Duration::from_millis(20));
    }

    /// A client that stops reading blocks the server's writes, and HTTP/2
    /// does not read while its writes are blocked: the idle timeout and the
    /// shutdown drain are also checked when a write would wait, or such a
    /// client holds its connection slot, and a shutdown, as long as it likes.
    #[tokio::test]
    async fn a_connection_whose_client_stopped_reading_is_closed_when_idle() {
        use tokio::io::AsyncWriteExt;
        for shutting_down in [false, true] {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let sock = tokio::net::TcpSocket::new_v4().unwrap();
            sock.set_recv_buffer_size(4096).unwrap();
            let _client = sock.connect(listener.local_addr().unwrap()).await.unwrap();
            let (io, _) = listener.accept().await.unwrap();
            socket2::SockRef::from(&io)
                .set_send_buffer_size(4096)
                .unwrap();
            let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
            let slot = crate::limits::Conns::new(1, 1, 0).admit(None).unwrap();
            let (idle, at_least) = if shutting_down {
                (Duration::from_secs(3600), DRAIN_IDLE)
            } else {
                (Duration::from_millis(300), Duration::from_millis(300))
            };
            let started = Instant::now();
            let mut conn = Capped::new(io, slot, idle, stop_rx);
            if shutting_down {
                stop_tx.send(true).unwrap();
            }
            let chunk = vec![0u8; 1 << 20];
            let wrote = tokio::time::timeout(Duration::from_secs(10), async {
                loop {
                    conn.write_all(&chunk).await?;
                }
            })
            .await;
            let err: std::io::Result<()> =
                wrote.expect("a write to a client that stopped reading waited for ever");
            assert_eq!(
                err.unwrap_err().kind(),
                std::io::ErrorKind::TimedOut,
                "shutting down: {shutting_down}"
            );
            assert!(started.elapsed() >= at_least, "closed before its time");
        }
    }

    /// A streaming call's body is only late while the server waits for it:
    /// time the server spends answering, before it asks for the next
    /// message, does not count (a kvstore StreamingRead client sends its
    /// next request once it has the previous answer). A wait past
    /// `read_timeout` still fails.
    #[tokio::test]
    async fn a_streaming_body_is_late_only_while_the_server_waits_for_it() {
        use tower::{Layer, Service, ServiceExt};
        /// A request body fed by the test.
        struct Fed(tokio::sync::mpsc::Receiver<bytes::Bytes>);
        impl http_body::Body for Fed {
            type Data = bytes::Bytes;
            type Error = tonic::Status;
            fn poll_frame(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>>
            {
                self.0
                    .poll_recv(cx)
                    .map(|b| b.map(|b| Ok(http_body::Frame::data(b))))
            }
        }
        let read_timeout = Duration::from_millis(200);
        for (answering, waiting, late) in [(600, 50, false), (0, 400, true)] {
            // The service: reads a message, answers for `answering` ms, reads the next.
            let inner =
                tower::service_fn(move |req: http::Request<tonic::body::Body>| async move {
                    let mut body = req.into_body();
                    let mut next = async || {
                        std::future::poll_fn(|cx| {
                            http_body::Body::poll_frame(std::pin::Pin::new(&mut body), cx)
                        })
                        .await
                    };
                    assert!(matches!(next().await, Some(Ok(_))), "the first message");
                    tokio::time::sleep(Duration::from_millis(answering)).await;
                    let second = match next().await {
                        Some(Ok(_)) => "ok".to_string(),
                        Some(Err(e)) => e.to_string(),
                        None => "ended".to_string(),
                    };
                    Ok::<_, std::convert::Infallible>(http::Response::new(tonic::body::Body::new(
                        second,
                    )))
                });
            let limits = Limits::new(1 << 20, 10, Duration::from_secs(3600), read_timeout);
            let mut charged = ChargeLayer(limits).layer(inner);
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            let mut req = http::Request::new(tonic::body::Body::new(Fed(rx)));
            *req.uri_mut() = "/kvstore.KVStoreService/StreamingRead".parse().unwrap();
            tx.send(bytes::Bytes::from_static(b"one")).await.unwrap();
            let feeder = tokio::spawn(async move {
                // The next message comes `waiting` ms after the server asked for it.
                tokio::time::sleep(Duration::from_millis(answering + waiting)).await;
                let _ = tx.send(bytes::Bytes::from_static(b"two")).await;
                tx // the body stays open
            });
            let reply = ServiceExt::<http::Request<tonic::body::Body>>::ready(&mut charged)
                .await
                .unwrap()
                .call(req)
                .await
                .unwrap();
            let mut body = reply.into_body();
            let frame = std::future::poll_fn(|cx| {
                http_body::Body::poll_frame(std::pin::Pin::new(&mut body), cx)
            })
            .await
            .unwrap()
            .unwrap();
            let second = String::from_utf8(frame.into_data().unwrap().to_vec()).unwrap();
            if late {
                assert!(
                    second.contains("read_timeout"),
                    "a {waiting} ms wait: {second}"
                );
            } else {
                assert_eq!(
                    second, "ok",
                    "{answering} ms answering, then {waiting} ms waiting"
                );
            }
            drop(feeder.await);
        }
    }
}
