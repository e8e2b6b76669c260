//! Thread priorities: the background threads that serve many requests at once (the writer, the
//! spool's appender) run at a higher nice value than the request threads, so that under a full
//! core the scheduler runs ready request work first and the background thread takes more of it
//! per turn.

/// Raises the calling thread's nice value by `by` (Linux: per thread; to at most 19), for the
/// thread named `who` in the log. A failure (a seccomp profile that forbids it) costs only the
/// priority, and is logged once at info level.
pub fn lower_this_thread(by: i32, who: &str) {
    let tid = rustix::thread::gettid();
    let set = rustix::process::getpriority_process(Some(tid))
        .and_then(|now| rustix::process::setpriority_process(Some(tid), (now + by).min(19)));
    if let Err(e) = set {
        tracing::info!(error = %e, "{who}: cannot lower the thread's priority; it runs at the request threads' priority");
    }
}
