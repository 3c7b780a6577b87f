//! Per-request sampling parameters ([`Sampling`]) and the decode steps that use them
//! ([`LlamaModel::step_sampled`] and its variants): greedy and sampled rows in one batch, the
//! sampling done on the GPU inside the step's CUDA graph ([`kernels::sample`]).

use super::model::{LlamaModel, Row};
use cuda_async::{DeviceError, Result};
use kernels::sample::SampleParams;

/// How a request picks its tokens: greedy (`temperature == 0`) or sampled from
/// `softmax(logits / temperature)` restricted to the `top_k` largest logits (`0`: all) and to the
/// nucleus of mass `top_p` (`1`: all), with draws from `seed` (see [`kernels::sample`] for the
/// exact rules, ties included).
///
/// The draw for the token after position `p` depends only on `seed` and `p`
/// ([`Sampling::params`]), so a request's tokens are reproducible from its seed alone, whatever
/// batch or bucket its steps run in.
///
/// ```
/// use models::llama::Sampling;
/// let s = Sampling { temperature: 0.7, top_p: 0.9, top_k: 40, seed: 1234 };
/// assert!(s.validate().is_ok() && !s.is_greedy());
/// assert!(Sampling::default().is_greedy());
/// assert!(Sampling { top_p: 0.0, ..s }.validate().is_err());
/// assert_eq!(s.params(17).counter, 17);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// Softmax temperature: `0` is greedy (argmax); must be finite and `>= 0`.
    pub temperature: f32,
    /// Nucleus mass, finite in `(0, 1]`; `1` keeps every token.
    pub top_p: f32,
    /// Keep only the `top_k` largest logits (and any equal to the last); `0` keeps every token.
    pub top_k: u32,
    /// The seed of the request's random draws.
    pub seed: u64,
}

impl Sampling {
    /// Greedy decoding: the argmax at every step.
    pub const GREEDY: Sampling = Sampling { temperature: 0.0, top_p: 1.0, top_k: 0, seed: 0 };

    /// Whether this picks the argmax (`temperature == 0`).
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// Checks the parameters: `temperature` finite and `>= 0`, `top_p` finite in `(0, 1]`.
    ///
    /// # Errors
    /// [`DeviceError::Shape`] naming the bad parameter.
    pub fn validate(&self) -> Result<()> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(bad(format!("temperature {} must be finite and >= 0", self.temperature)));
        }
        if !self.top_p.is_finite() || self.top_p <= 0.0 || self.top_p > 1.0 {
            return Err(bad(format!("top_p {} must be finite, > 0 and <= 1", self.top_p)));
        }
        Ok(())
    }

    /// The kernel's parameters for the row at `position` (the draw for the token after it:
    /// `counter = position`). A greedy setting gives [`SampleParams::GREEDY`].
    pub fn params(&self, position: u32) -> SampleParams {
        if self.is_greedy() {
            return SampleParams::GREEDY;
        }
        SampleParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            counter: position,
            seed: self.seed,
        }
    }
}

impl Default for Sampling {
    /// [`Sampling::GREEDY`].
    fn default() -> Sampling {
        Sampling::GREEDY
    }
}

fn bad(msg: String) -> DeviceError {
    DeviceError::shape("LlamaModel::step_sampled", msg)
}

/// Checks that there is one valid [`Sampling`] per row.
pub(super) fn check_sampling(rows: &[Row], sampling: &[Sampling]) -> Result<()> {
    if sampling.len() != rows.len() {
        return Err(bad(format!("{} sampling settings for {} rows", sampling.len(), rows.len())));
    }
    for (i, s) in sampling.iter().enumerate() {
        s.validate().map_err(|e| bad(format!("row {i}: {e}")))?;
    }
    Ok(())
}

impl LlamaModel {
    /// [`LlamaModel::step`] with a [`Sampling`] per row: greedy rows get the argmax, the others a
    /// token drawn on the GPU inside the step's graph. With every row greedy the tokens are those
    /// of [`LlamaModel::step`], bit for bit.
    ///
    /// ```no_run
    /// use models::llama::{DeviceWeights, LlamaConfig, LlamaModel, ModelOptions, Row, Sampling};
    /// # fn main() -> cuda_async::Result<()> {
    /// let stream = cuda_core::Device::new(0)?.new_stream()?;
    /// let cfg = LlamaConfig::small();
    /// let weights = DeviceWeights::random(&stream, &cfg, 7, 0.02)?;
    /// let mut model = LlamaModel::new(&stream, cfg, weights, ModelOptions { slots: 4, max_seq: 64, ..Default::default() })?;
    /// let rows = [Row { slot: 0, position: 0, token: 1 }, Row { slot: 1, position: 0, token: 5 }];
    /// let sampled = Sampling { temperature: 0.8, top_p: 0.95, top_k: 0, seed: 99 };
    /// let next = model.step_sampled(&rows, &[Sampling::GREEDY, sampled])?;
    /// assert_eq!(next.len(), 2);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// `sampling.len() != rows.len()` or a setting [`Sampling::validate`] refuses
    /// ([`DeviceError::Shape`]); as for [`LlamaModel::step`].
    pub fn step_sampled(&mut self, rows: &[Row], sampling: &[Sampling]) -> Result<Vec<u32>> {
        self.last_rows = None; // refused settings forget the last step too (as `stage`)
        check_sampling(rows, sampling)?;
        self.run_step(rows, Some(sampling), None)
    }

    /// [`LlamaModel::step_sampled`] in a given bucket, as [`LlamaModel::step_in_bucket`]. A row's
    /// token depends only on the row, its sampling and the bucket's kernels.
    ///
    /// # Errors
    /// As for [`LlamaModel::step_sampled`] and [`LlamaModel::step_in_bucket`].
    pub fn step_sampled_in_bucket(
        &mut self,
        rows: &[Row],
        sampling: &[Sampling],
        bucket: usize,
    ) -> Result<Vec<u32>> {
        self.last_rows = None; // as above
        check_sampling(rows, sampling)?;
        self.run_step(rows, Some(sampling), Some(bucket))
    }

    /// [`LlamaModel::step_sampled`] that resolves once the tokens are ready, without blocking the
    /// executor thread.
    ///
    /// # Errors
    /// As for [`LlamaModel::step_sampled`].
    pub async fn step_sampled_async(&mut self, rows: &[Row], sampling: &[Sampling]) -> Result<Vec<u32>> {
        self.last_rows = None; // refused settings forget the last step too (as `stage`)
        check_sampling(rows, sampling)?;
        self.run_step_async(rows, Some(sampling)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Sampling = Sampling { temperature: 0.7, top_p: 0.9, top_k: 40, seed: 1234 };

    #[test]
    fn validation_refuses_bad_parameters() {
        assert!(S.validate().is_ok());
        assert!(Sampling::GREEDY.validate().is_ok());
        assert!(Sampling { top_p: 1.0, top_k: 0, ..S }.validate().is_ok());
        for bad in [
            Sampling { temperature: -0.1, ..S },
            Sampling { temperature: f32::NAN, ..S },
            Sampling { temperature: f32::INFINITY, ..S },
            Sampling { top_p: 0.0, ..S },
            Sampling { top_p: -0.5, ..S },
            Sampling { top_p: 1.0001, ..S },
            Sampling { top_p: f32::NAN, ..S },
        ] {
            assert!(bad.validate().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn conversion_uses_the_position_as_counter() {
        let p = S.params(41);
        assert_eq!(p, SampleParams { temperature: 0.7, top_p: 0.9, top_k: 40, counter: 41, seed: 1234 });
        assert_eq!(Sampling::GREEDY.params(5), SampleParams::GREEDY);
        assert_eq!(Sampling { temperature: 0.0, ..S }.params(5), SampleParams::GREEDY);
        assert!(Sampling::default().is_greedy() && !S.is_greedy());
        assert_eq!(Sampling::default(), Sampling::GREEDY);
    }

    #[test]
    fn one_valid_setting_per_row_is_required() {
        let row = Row { slot: 0, position: 0, token: 0 };
        assert!(check_sampling(&[row, row], &[S, S]).is_ok());
        assert!(check_sampling(&[row, row], &[S]).is_err());
        assert!(check_sampling(&[row], &[S, S]).is_err());
        let e = check_sampling(&[row, row], &[S, Sampling { top_p: 2.0, ..S }]).unwrap_err();
        assert!(e.to_string().contains("row 1"), "{e}");
    }
}
