//! The accept loop: HTTP/1 connections served with a bound on how many are open and on how long a
//! request's head may take to arrive.
//!
//! `axum::serve` runs hyper without a timer, so hyper's header-read timeout is off, and it accepts
//! without bound. Found by review: about 1,000 connections that each sent half a request head and
//! then nothing exhausted the process's file descriptors, after which `accept` failed (EMFILE) and
//! every new client hung until the attacker left. Here each connection holds a permit of
//! [`ConnLimits::max_connections`] (the loop waits for one before it accepts: new clients queue in
//! the kernel's backlog rather than failing the process's other file operations), and hyper closes a
//! connection whose request head has not fully arrived within [`ConnLimits::header_read_timeout`].
//!
//! Graceful shutdown is axum's: once the signal resolves, no connection is accepted, each open one
//! finishes the request in flight and closes, and the returned future resolves when all are closed.

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

/// Bounds on connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Connections open at once; more wait in the listener's backlog.
    pub max_connections: usize,
    /// Time for a request's head (request line and headers) to arrive, from the connection's start
    /// or the end of its previous response; a connection that exceeds it is closed. This is also
    /// how long an idle keep-alive connection stays open: a client should keep idle pooled
    /// connections for less (`reqwest`'s default is 90 s; the load tool uses 20 s), or a request
    /// sent on one just as the server closes it fails.
    /// Longer than [`MAX_TIMEOUT`] (e.g. `Duration::MAX`) is [`MAX_TIMEOUT`].
    pub header_read_timeout: Duration,
    /// Time for a request's body to arrive once its head has: a body still arriving then fails to
    /// read (the request is answered 400, `invalid_body`), so a body sent a byte at a time cannot
    /// hold its connection (see [`crate::http::router`]). At most [`MAX_TIMEOUT`], as above.
    pub body_read_timeout: Duration,
}

impl Default for ConnLimits {
    /// 512 connections (half the usual soft limit of 1,024 file descriptors), 30 s for a head, 30 s
    /// for a body.
    fn default() -> Self {
        ConnLimits {
            max_connections: 512,
            header_read_timeout: Duration::from_secs(30),
            body_read_timeout: Duration::from_secs(30),
        }
    }
}

/// The longest timeout the server uses: longer ones, `Duration::MAX` included, mean "no bound" and
/// are cut to this. Found by review: hyper adds the head's timeout to the current instant on every
/// request head, and `Duration::MAX` made that addition panic in every connection's task, so the
/// server answered nothing.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(365 * 86_400);

/// `d`, at most [`MAX_TIMEOUT`].
pub(crate) fn bounded(d: Duration) -> Duration {
    d.min(MAX_TIMEOUT)
}

/// A request body that fails once `deadline` has passed (see [`ConnLimits::body_read_timeout`]).
pub(crate) struct DeadlineBody {
    inner: axum::body::Body,
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
    timeout: Duration,
}

impl DeadlineBody {
    /// `inner`, failing if it has not ended within `timeout` from now.
    pub(crate) fn new(inner: axum::body::Body, timeout: Duration) -> DeadlineBody {
        let timeout = bounded(timeout);
        DeadlineBody { inner, deadline: Box::pin(tokio::time::sleep(timeout)), timeout }
    }
}

impl http_body::Body for DeadlineBody {
    type Data = axum::body::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        // What has arrived is read first; only a body still waiting past its time fails.
        let polled = std::pin::Pin::new(&mut this.inner).poll_frame(cx).map_err(Into::into);
        if polled.is_pending() && this.deadline.as_mut().poll(cx).is_ready() {
            let msg = format!("the request body did not arrive within {:?}", this.timeout);
            return std::task::Poll::Ready(Some(Err(msg.into())));
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Serves `router` on `listener` within `limits` until `shutdown` resolves, then drains (see the
/// module docs).
///
/// # Errors
/// None today: accept errors are retried (after 1 s for errors other than a connection's own).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    // Closed (sender dropped) to tell the connections to finish; they hold `close_rx` until done.
    let (signal_tx, signal_rx) = watch::channel(());
    let (close_tx, close_rx) = watch::channel(());
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break, // never closed
            },
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => stream,
                Err(e) => {
                    if !is_connection_error(&e) {
                        // EMFILE and the like: give the process a moment, as axum does.
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let mut signal_rx = signal_rx.clone();
        let close_rx = close_rx.clone();
        let timeout = bounded(limits.header_read_timeout);
        tokio::spawn(async move {
            let mut builder = http1::Builder::new();
            builder.timer(TokioTimer::new()).header_read_timeout(timeout);
            let conn = builder.serve_connection(TokioIo::new(stream), service).with_upgrades();
            tokio::pin!(conn);
            let mut signalled = false;
            loop {
                tokio::select! {
                    r = conn.as_mut() => {
                        drop(r); // a connection's own error ends only that connection
                        break;
                    }
                    _ = signal_rx.changed(), if !signalled => {
                        signalled = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
            drop(close_rx);
            drop(permit);
        });
    }
    drop(listener);
    drop(signal_tx);
    drop(close_rx);
    close_tx.closed().await;
    Ok(())
}

/// Errors of one accepted connection, not of the listener (retried at once).
fn is_connection_error(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}
