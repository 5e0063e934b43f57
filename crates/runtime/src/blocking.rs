//! Blocking file work (reads, fsync, renames, locks) run off the async workers: an
//! async caller awaits [`unblock`], and the work runs on tokio's blocking pool.
//!
//! An awaiting future that is dropped does not stop the work (a blocking closure runs to
//! its end): callers whose work must never overlap a later generation of the same
//! writer own their files on a thread they join instead (see [`crate::deadletter`]).

/// Runs `work` on the blocking pool and returns its result; a panic in it resumes here.
pub(crate) async fn unblock<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    match spawn(work).await {
        Ok(out) => out,
        Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
        // Only a runtime shutting down cancels a blocking task, and it drops this
        // future first.
        Err(err) => unreachable!("a blocking task was cancelled: {err}"),
    }
}

/// `tokio::task::spawn_blocking` in the caller's span, so that what `work` logs names
/// its materialization and transaction.
pub(crate) fn spawn<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> tokio::task::JoinHandle<T> {
    let span = tracing::Span::current();
    tokio::task::spawn_blocking(move || span.in_scope(work))
}
