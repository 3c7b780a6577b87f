//! Cross-rank checks of one communicator group: the k-th collective of every rank must agree
//! (kind, element type, count, root), and one thread must not drive several ranks one by one.

use super::collective::Collective;
use crate::error::{Error, Result};
use std::collections::VecDeque;
use std::sync::Mutex;
use std::thread::ThreadId;

/// What NCCL pairs across ranks: the collective, its element type and its count argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Desc {
    pub(super) kind: Collective,
    pub(super) dtype: u32,
    pub(super) count: usize,
}

#[derive(Default)]
struct State {
    /// How many collectives each rank has issued.
    issued: Vec<u64>,
    /// Collectives issued by some ranks but not all yet: (sequence number, what, ranks so far).
    pending: VecDeque<(u64, Desc, usize)>,
    /// Every thread that has issued a per-rank collective on each rank (not only the last one:
    /// thread A on rank 0, then B on rank 0, must still keep A off rank 1).
    owners: Vec<Vec<ThreadId>>,
    /// Set once NCCL failed part-way: the ranks' sequences can no longer be trusted.
    poisoned: Option<String>,
}

/// The checks of one group of `n` ranks.
pub(super) struct Matching {
    n: usize,
    state: Mutex<State>,
}

impl Matching {
    pub(super) fn new(n: usize) -> Matching {
        let state = State { issued: vec![0; n], owners: vec![Vec::new(); n], ..State::default() };
        Matching { n, state: Mutex::new(state) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records that the calling thread issues a per-rank collective on `rank`; refused if it has
    /// issued one on another rank of this group (it could block there forever, see the module
    /// docs of `nccl`).
    pub(super) fn claim_thread(&self, rank: usize) -> Result<()> {
        if self.n == 1 {
            return Ok(());
        }
        let me = std::thread::current().id();
        let mut st = self.lock();
        if let Some(other) = st.owners.iter().enumerate().position(|(r, ts)| r != rank && ts.contains(&me)) {
            return Err(Error::InvalidArgument(format!(
                "this thread already issued a collective on rank {other} of this communicator group; \
                 issuing rank {rank} from the same thread could block forever: use one thread per rank, \
                 or cuda_core::nccl::grouped"
            )));
        }
        if !st.owners[rank].contains(&me) {
            st.owners[rank].push(me);
        }
        Ok(())
    }

    /// Checks `desc` against the collectives the other ranks issued at the same position in their
    /// sequences, then counts it as issued by every rank of `ranks`. Nothing is recorded on error.
    pub(super) fn reserve(&self, ranks: &[usize], desc: Desc) -> Result<()> {
        let mut st = self.lock();
        if let Some(why) = &st.poisoned {
            return Err(Error::InvalidArgument(format!(
                "this communicator group is unusable after an earlier NCCL failure ({why})"
            )));
        }
        for &r in ranks {
            let seq = st.issued[r];
            if let Some((_, other, _)) = st.pending.iter().find(|(s, _, _)| *s == seq) {
                if *other != desc {
                    return Err(Error::InvalidArgument(format!(
                        "collective #{seq} of rank {r} ({desc:?}) does not match the one the other ranks \
                         issued at that position ({other:?})"
                    )));
                }
            }
        }
        for &r in ranks {
            let seq = st.issued[r];
            st.issued[r] += 1;
            match st.pending.iter_mut().find(|(s, _, _)| *s == seq) {
                Some(entry) => entry.2 += 1,
                None => st.pending.push_back((seq, desc, 1)),
            }
        }
        let n = self.n;
        st.pending.retain(|(_, _, seen)| *seen < n);
        Ok(())
    }

    /// Makes every later collective of the group fail (NCCL failed after the sequence moved on).
    pub(super) fn poison(&self, why: &Error) {
        self.lock().poisoned.get_or_insert_with(|| why.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nccl::ReduceOp;

    fn desc(count: usize) -> Desc {
        Desc { kind: Collective::AllReduce(ReduceOp::Sum), dtype: 7, count }
    }

    #[test]
    fn sequences_match_across_ranks() {
        let m = Matching::new(2);
        m.reserve(&[0], desc(10)).unwrap();
        m.reserve(&[0], desc(20)).unwrap();
        // Rank 1's first collective must be the 10-element one.
        assert!(m.reserve(&[1], desc(20)).is_err());
        m.reserve(&[1], desc(10)).unwrap();
        m.reserve(&[1], desc(20)).unwrap();
        assert!(m.lock().pending.is_empty());
        m.reserve(&[0, 1], desc(5)).unwrap();
        assert!(m.lock().pending.is_empty());
        m.poison(&Error::InvalidArgument("x".into()));
        assert!(m.reserve(&[0, 1], desc(5)).is_err());
    }

    #[test]
    fn one_thread_one_rank() {
        let m = Matching::new(2);
        m.claim_thread(0).unwrap();
        m.claim_thread(0).unwrap();
        assert!(m.claim_thread(1).is_err());
        std::thread::scope(|s| s.spawn(|| m.claim_thread(1).unwrap()).join().unwrap());
        // Another thread taking over rank 0 does not clear this thread's claim on it.
        std::thread::scope(|s| s.spawn(|| m.claim_thread(0).unwrap()).join().unwrap());
        assert!(m.claim_thread(1).is_err());
        let single = Matching::new(1);
        single.claim_thread(0).unwrap();
    }
}
