//! A table's memory of `insert_deduplication_token`s: an INSERT whose token it holds is
//! answered `200` and stores nothing, as a (replicated) MergeTree table does within its
//! deduplication window
//! (<https://clickhouse.com/docs/operations/settings/settings#insert_deduplication_token>).

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};

/// Tokens a replicated table remembers by default in current releases:
/// `replicated_deduplication_window`, raised from 100 to 1000 by ClickHouse PR 57335
/// (<https://clickhouse.com/docs/reference/settings/merge-tree-settings/replicated-deduplication-window>).
pub const DEDUP_WINDOW: usize = 1000;

/// The last `window` tokens seen; shared (through an `Arc`) by every server of one table,
/// as a replicated table's memory lives in ZooKeeper/Keeper.
#[derive(Debug)]
pub struct TokenMemory {
    window: usize,
    inner: Mutex<(VecDeque<String>, HashSet<String>)>,
}

impl TokenMemory {
    /// An empty memory of the last [`DEDUP_WINDOW`] tokens.
    pub fn new() -> Arc<TokenMemory> {
        TokenMemory::with_window(DEDUP_WINDOW)
    }

    /// An empty memory of the last `window` tokens (`usize::MAX`: without end).
    pub fn with_window(window: usize) -> Arc<TokenMemory> {
        Arc::new(TokenMemory {
            window,
            inner: Mutex::default(),
        })
    }

    /// Whether `token` is remembered.
    pub fn seen(&self, token: &str) -> bool {
        self.inner.lock().unwrap().1.contains(token)
    }

    /// Remembers `token`, forgetting the oldest beyond the window; whether it was new.
    pub fn remember(&self, token: &str) -> bool {
        let mut inner = self.inner.lock().unwrap();
        if !inner.1.insert(token.to_owned()) {
            return false;
        }
        inner.0.push_back(token.to_owned());
        if inner.0.len() > self.window {
            if let Some(old) = inner.0.pop_front() {
                inner.1.remove(&old);
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_token_is_forgotten_beyond_the_window() {
        let memory = TokenMemory::with_window(2);
        assert!(memory.remember("a"));
        assert!(!memory.remember("a"));
        assert!(memory.remember("b") && memory.remember("c"));
        assert!(!memory.seen("a"));
        assert!(memory.seen("b") && memory.seen("c"));
    }
}
