//! A bounded store of the paths finished requests were served on (for same-path replay).

use crate::engine::ReplayPath;
use std::collections::{HashMap, VecDeque};

/// A finished request's path and the tokens it was served.
#[derive(Debug, Clone, PartialEq)]
pub struct FinishedPath {
    /// The prompt's tokens.
    pub prompt: Vec<u32>,
    /// The path.
    pub path: ReplayPath,
    /// The tokens generated (what the client was sent, before any stop-string cut).
    pub tokens: Vec<u32>,
}

impl FinishedPath {
    /// Cuts the path to its first `n` generated tokens (what the client was sent when a stop
    /// string ended its stream): the first comes from the last prefill piece, each further one
    /// from a decode step.
    pub fn cut(&mut self, n: usize) {
        self.tokens.truncate(n);
        self.path.decode.truncate(n.saturating_sub(1));
    }
}

/// Keeps the last `cap` finished paths by request id; the oldest go first.
///
/// ```
/// use server::paths::{PathStore, FinishedPath};
/// let mut s = PathStore::new(1);
/// let p = FinishedPath { prompt: vec![1], path: Default::default(), tokens: vec![2] };
/// s.insert("a".into(), p.clone());
/// s.insert("b".into(), p);
/// assert!(s.get("a").is_none() && s.get("b").is_some());
/// ```
#[derive(Debug, Default)]
pub struct PathStore {
    cap: usize,
    map: HashMap<String, FinishedPath>,
    order: VecDeque<String>,
}

impl PathStore {
    /// A store of at most `cap` paths (`0` keeps none).
    pub fn new(cap: usize) -> PathStore {
        PathStore { cap, map: HashMap::new(), order: VecDeque::new() }
    }

    /// Records the path of request `id`, dropping the oldest beyond the capacity.
    pub fn insert(&mut self, id: String, path: FinishedPath) {
        if self.cap == 0 {
            return;
        }
        if self.map.insert(id.clone(), path).is_none() {
            self.order.push_back(id);
        }
        while self.order.len() > self.cap {
            if let Some(old) = self.order.pop_front() {
                self.map.remove(&old);
            }
        }
    }

    /// The path of request `id`, if kept.
    pub fn get(&self, id: &str) -> Option<&FinishedPath> {
        self.map.get(id)
    }

    /// Cuts the path of `id`, if kept, to its first `n` tokens ([`FinishedPath::cut`]).
    pub fn cut(&mut self, id: &str, n: usize) {
        if let Some(p) = self.map.get_mut(id) {
            p.cut(n);
        }
    }

    /// Paths kept.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}
