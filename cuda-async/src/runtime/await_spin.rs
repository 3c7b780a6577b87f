//! How long the first poll of an awaited op spins on the executor thread before it hands the op to
//! the completion engine: the [`AwaitSpin`] policy.
//!
//! Spinning pays only when the work finishes soon and nothing else could use the thread's time.
//! Handing off costs a cross-thread wake-up when the work completes (about 10 µs on the H100 host,
//! `docs/results/completion.md`); spinning costs CPU time for as long as it lasts. The policy
//! therefore spins
//! * **not at all** while at least [`AwaitSpin::busy`] other awaited ops of the device are pending
//!   in the engine: many concurrent awaiters keep the engine polling anyway, and a spin would
//!   only burn CPU that the other tasks need (measured: 5 µs of CPU per op for nothing with 64
//!   tasks);
//! * otherwise up to the **predicted** duration of the op (the last uncontended await on the
//!   device, plus 1/8 and 2 µs of margin) when that prediction is at most
//!   [`AwaitSpin::adaptive_max`], so a loop awaiting a 50 µs kernel resolves on its own thread as
//!   quickly as a blocking `cuStreamSynchronize` would;
//! * and in every other case up to [`AwaitSpin::base`] (default 5 µs), which is enough for tiny ops.
//!
//! The spin never exceeds `max(base, adaptive_max)`, so an executor thread is held for a bounded
//! time (at most 1 ms, the clamp of [`set_await_spin_policy`]). A policy of all zeros never spins.
//!
//! **Early wake.** A lone awaiter whose op is predicted to take longer than `adaptive_max` (a
//! decode step of a millisecond, say) does not spin on its first poll: it hands the op to the
//! completion engine, and its executor thread is free (or goes to sleep). A thread that went to
//! sleep takes the operating system's wake-up latency to run again after the engine wakes it
//! (tens of microseconds in a VM), which a blocking caller spinning in the driver does not pay.
//! So the engine also sets an alarm: it wakes the task [`AwaitSpin::early_wake`] before the
//! predicted end, and that poll spins — for at most twice `early_wake` — until the engine sees the
//! work complete. The thread is awake when the work ends and spins only for the last stretch of
//! the op, not for all of it. A wrong prediction costs at most that bounded spin: an op still
//! running when it ends is completed by the engine as usual.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// The first-poll spin policy (see the module docs). Set it with [`set_await_spin_policy`].
///
/// ```
/// use cuda_async::scheduling::{await_spin_policy, set_await_spin_policy, AwaitSpin};
/// use std::time::Duration;
/// // Latency first: spin for anything predicted to finish within 200 µs.
/// set_await_spin_policy(AwaitSpin { adaptive_max: Duration::from_micros(200), ..AwaitSpin::default() });
/// assert_eq!(await_spin_policy().adaptive_max, Duration::from_micros(200));
/// // CPU first: never spin; every pending op is completed by the engine thread.
/// set_await_spin_policy(AwaitSpin::NEVER);
/// assert_eq!(await_spin_policy(), AwaitSpin::NEVER);
/// set_await_spin_policy(AwaitSpin::default());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AwaitSpin {
    /// The spin of a first poll with no usable prediction (default 5 µs; at most 50 µs).
    pub base: Duration,
    /// The longest predicted duration for which the first poll spins until the op is done
    /// (default 100 µs; at most 1 ms). Zero turns the prediction off.
    pub adaptive_max: Duration,
    /// No spin at all while this many other awaited ops of the same device are pending (default
    /// 1: spin only for a lone awaiter). Zero means "always spin".
    pub busy: usize,
    /// For a lone awaiter whose op is predicted to take longer than `adaptive_max`: how long
    /// before the predicted end the engine wakes the task, which then spins for at most twice
    /// this (see the module docs; default 100 µs, at most 1 ms). Zero turns the early wake off.
    pub early_wake: Duration,
}

impl AwaitSpin {
    /// Never spin: every op still pending after its submission is completed by the engine.
    pub const NEVER: AwaitSpin =
        AwaitSpin { base: Duration::ZERO, adaptive_max: Duration::ZERO, busy: 0, early_wake: Duration::ZERO };
}

impl Default for AwaitSpin {
    fn default() -> Self {
        AwaitSpin {
            base: Duration::from_micros(5),
            adaptive_max: Duration::from_micros(100),
            busy: 1,
            early_wake: Duration::from_micros(100),
        }
    }
}

const MAX_BASE: Duration = Duration::from_micros(50);
const MAX_ADAPTIVE: Duration = Duration::from_millis(1);

static BASE_NS: AtomicU64 = AtomicU64::new(5_000);
static ADAPTIVE_NS: AtomicU64 = AtomicU64::new(100_000);
static BUSY: AtomicUsize = AtomicUsize::new(1);
static EARLY_NS: AtomicU64 = AtomicU64::new(100_000);

/// Sets the first-poll spin policy for every device (takes effect at the next first poll).
/// `base` is clamped to 50 µs, `adaptive_max` and `early_wake` to 1 ms: an executor thread is never
/// held longer (an early wake's spin is at most twice `early_wake`).
pub fn set_await_spin_policy(policy: AwaitSpin) {
    EARLY_NS.store(policy.early_wake.min(MAX_ADAPTIVE).as_nanos() as u64, Ordering::Relaxed);
    BASE_NS.store(policy.base.min(MAX_BASE).as_nanos() as u64, Ordering::Relaxed);
    ADAPTIVE_NS.store(policy.adaptive_max.min(MAX_ADAPTIVE).as_nanos() as u64, Ordering::Relaxed);
    BUSY.store(policy.busy, Ordering::Relaxed);
}

/// The current first-poll spin policy (see [`set_await_spin_policy`]).
pub fn await_spin_policy() -> AwaitSpin {
    AwaitSpin {
        base: Duration::from_nanos(BASE_NS.load(Ordering::Relaxed)),
        adaptive_max: Duration::from_nanos(ADAPTIVE_NS.load(Ordering::Relaxed)),
        busy: BUSY.load(Ordering::Relaxed),
        early_wake: Duration::from_nanos(EARLY_NS.load(Ordering::Relaxed)),
    }
}

/// Sets only [`AwaitSpin::base`] (clamped to 50 µs); zero turns the spin off for ops with no
/// prediction. Kept for callers of the earlier single-number policy.
pub fn set_await_spin(budget: Duration) {
    BASE_NS.store(budget.min(MAX_BASE).as_nanos() as u64, Ordering::Relaxed);
}

/// The current [`AwaitSpin::base`].
pub fn await_spin() -> Duration {
    Duration::from_nanos(BASE_NS.load(Ordering::Relaxed))
}

impl AwaitSpin {
    /// The spin budget of a first poll that sees `others` awaited ops of its device pending and
    /// the last uncontended await of the device took `predicted` (if any).
    pub(crate) fn budget(&self, others: usize, predicted: Option<Duration>) -> Duration {
        if self.busy > 0 && others >= self.busy {
            return Duration::ZERO;
        }
        let adaptive = predicted
            .map(|p| p + p / 8 + Duration::from_micros(2))
            .filter(|want| !self.adaptive_max.is_zero() && *want <= self.adaptive_max);
        match adaptive {
            Some(want) => want.max(self.base),
            None => self.base,
        }
    }
}

impl AwaitSpin {
    /// When the engine should wake a lone awaiter early, as an offset from the op's submission:
    /// `predicted - early_wake`, for an op predicted to outlast the first-poll spin (`budget`)
    /// by more than `early_wake` (else `None`: nothing to gain).
    pub(crate) fn early_wake_after(
        &self,
        others: usize,
        predicted: Option<Duration>,
        budget: Duration,
    ) -> Option<Duration> {
        if self.early_wake.is_zero() || (self.busy > 0 && others >= self.busy) {
            return None;
        }
        let p = predicted?;
        let at = p.checked_sub(self.early_wake)?;
        (at > budget).then_some(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const US: fn(u64) -> Duration = Duration::from_micros;

    #[test]
    fn budget_follows_the_policy() {
        let p = AwaitSpin::default();
        assert_eq!(p.budget(0, None), US(5), "no prediction: the base spin");
        assert_eq!(p.budget(1, None), Duration::ZERO, "another op pending: no spin");
        assert_eq!(p.budget(3, Some(US(50))), Duration::ZERO);
        assert_eq!(p.budget(0, Some(US(48))), US(48 + 6 + 2), "predicted plus 1/8 and 2 µs");
        assert_eq!(p.budget(0, Some(US(1))), US(5), "never below the base");
        assert_eq!(p.budget(0, Some(US(95))), US(5), "a prediction over the maximum is not spun for");
        assert_eq!(AwaitSpin::NEVER.budget(0, Some(US(10))), Duration::ZERO);
        let always = AwaitSpin { busy: 0, ..p };
        assert_eq!(always.budget(1000, None), US(5), "busy = 0 spins whatever is pending");
        let no_adaptive = AwaitSpin { adaptive_max: Duration::ZERO, ..p };
        assert_eq!(no_adaptive.budget(0, Some(US(10))), US(5));
    }

    #[test]
    fn early_wake_follows_the_policy() {
        let p = AwaitSpin::default();
        assert_eq!(p.early_wake_after(0, Some(US(1300)), US(5)), Some(US(1200)), "predicted minus 100 µs");
        assert_eq!(
            p.early_wake_after(1, Some(US(1300)), US(5)),
            None,
            "another op pending: the engine is busy anyway"
        );
        assert_eq!(p.early_wake_after(0, None, US(5)), None, "no prediction");
        assert_eq!(p.early_wake_after(0, Some(US(90)), US(5)), None, "shorter than the lead");
        assert_eq!(p.early_wake_after(0, Some(US(150)), US(60)), None, "the first poll spins past the alarm");
        assert_eq!(AwaitSpin::NEVER.early_wake_after(0, Some(US(1300)), US(0)), None);
        let off = AwaitSpin { early_wake: Duration::ZERO, ..p };
        assert_eq!(off.early_wake_after(0, Some(US(1300)), US(5)), None);
    }
}
