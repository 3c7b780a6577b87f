//! Serving until a signal, then shutting down in bounded time.
//!
//! On the signal the batcher stops admitting ([`BatcherHandle::shutdown`]): new requests are
//! answered 503 with `Retry-After` and `/health` reports `shutting_down`, while the listener keeps
//! accepting. Running streams finish, or are cancelled when the grace period ends. Only then does
//! the listener close. Connections still open get [`CLOSE_BOUND`] to end; then [`serve_until`]
//! returns regardless, so a client that never completes its request (a half-sent head, a body
//! that never comes) cannot keep the process alive. Such a connection's task (`crate::listen` runs each
//! connection in a task of its own) is not ended by the return: it ends with the runtime, which
//! `llama-serve` drops at once.
//!
//! [`BatcherHandle::shutdown`]: crate::batcher::BatcherHandle::shutdown

use crate::http::{router, AppState};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// How long connections still open may take to close once the batcher has stopped.
pub const CLOSE_BOUND: Duration = Duration::from_secs(2);

/// How long past `grace` the batcher task may take to end (its last step, the aborts) before the
/// listener closes anyway.
const BATCHER_MARGIN: Duration = Duration::from_secs(5);

/// Serves `state` on `listener` until `signal` resolves, then shuts down as the module docs say:
/// returns at most `grace` + 5 s + [`CLOSE_BOUND`] after the signal. `batcher` is the batcher's
/// task (from [`crate::batcher::spawn`]), awaited here.
///
/// ```no_run
/// # async fn f(listener: tokio::net::TcpListener, state: std::sync::Arc<server::http::AppState>,
/// #            task: tokio::task::JoinHandle<()>) -> std::io::Result<()> {
/// let stop = async { let _ = tokio::signal::ctrl_c().await; };
/// server::shutdown::serve_until(listener, state, stop, std::time::Duration::from_secs(30), task).await
/// # }
/// ```
///
/// # Errors
/// I/O errors of the listener.
pub async fn serve_until(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    signal: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
    batcher: tokio::task::JoinHandle<()>,
) -> std::io::Result<()> {
    let h = state.batcher.clone();
    let (stopped_tx, stopped_rx) = tokio::sync::oneshot::channel::<()>();
    let stop = async move {
        signal.await;
        h.shutdown(grace);
        // The listener keeps answering (503s) until the batcher has ended its streams.
        // Saturating: a grace of `Duration::MAX` means "no bound" (found by review: the sum
        // panicked, in the future that stops the server).
        let _ = tokio::time::timeout(grace.saturating_add(BATCHER_MARGIN), batcher).await;
        let _ = stopped_tx.send(());
    };
    let limits = state.cfg.conn;
    let server = crate::listen::serve(listener, router(state), limits, stop);
    tokio::pin!(server);
    tokio::select! {
        r = &mut server => return r,
        _ = stopped_rx => {}
    }
    // The listener is closed; connections still open get a bound (their tasks then end with the
    // runtime).
    tokio::time::timeout(CLOSE_BOUND, server).await.unwrap_or(Ok(()))
}
