//! The shape of a Llama-style decoder, from Hugging Face's `config.json` or built in.

use cuda_async::{DeviceError, Result};
use serde_json::Value;

/// Llama 3's rotary frequency scaling (`rope_type: "llama3"`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3Rope {
    /// `factor`.
    pub factor: f64,
    /// `low_freq_factor`.
    pub low_freq_factor: f64,
    /// `high_freq_factor`.
    pub high_freq_factor: f64,
    /// `original_max_position_embeddings`.
    pub original_max_position: f64,
}

/// The dimensions and constants of a Llama-style decoder (RMSNorm, rotary embeddings,
/// grouped-query attention, SwiGLU MLP), with Hugging Face's names in the docs.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    /// `vocab_size`.
    pub vocab: usize,
    /// `hidden_size`.
    pub hidden: usize,
    /// `num_hidden_layers`.
    pub layers: usize,
    /// `num_attention_heads`.
    pub heads: usize,
    /// `num_key_value_heads`.
    pub kv_heads: usize,
    /// `head_dim` (default `hidden / heads`).
    pub head_dim: usize,
    /// `intermediate_size`.
    pub intermediate: usize,
    /// `rms_norm_eps`.
    pub rms_eps: f64,
    /// `rope_theta`.
    pub rope_theta: f64,
    /// `rope_scaling` / `rope_parameters` of type `llama3`, if any.
    pub rope_llama3: Option<Llama3Rope>,
    /// `tie_word_embeddings`: the output projection is the embedding table.
    pub tie_embeddings: bool,
}

fn bad(msg: String) -> DeviceError {
    cuda_core::Error::InvalidArgument(msg).into()
}

impl LlamaConfig {
    /// The Llama-3.2-1B configuration: hidden 2048, 16 layers, 32 heads, 8 KV heads, intermediate
    /// 8192, vocabulary 128256, tied embeddings, rope theta 500000 with Llama 3 scaling (32×).
    pub fn llama_3_2_1b() -> LlamaConfig {
        LlamaConfig {
            vocab: 128_256,
            hidden: 2048,
            layers: 16,
            heads: 32,
            kv_heads: 8,
            head_dim: 64,
            intermediate: 8192,
            rms_eps: 1e-5,
            rope_theta: 500_000.0,
            rope_llama3: Some(Llama3Rope {
                factor: 32.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position: 8192.0,
            }),
            tie_embeddings: true,
        }
    }

    /// A small shape for fast tests (about 7 M parameters): hidden 256, 4 layers, 8 heads of 32,
    /// 2 KV heads (groups of 4, as the 1B model), intermediate 768, vocabulary 2048, untied
    /// embeddings (so both output paths are exercised between the two shapes), Llama 3 rope.
    pub fn small() -> LlamaConfig {
        LlamaConfig {
            vocab: 2048,
            hidden: 256,
            layers: 4,
            heads: 8,
            kv_heads: 2,
            head_dim: 32,
            intermediate: 768,
            rms_eps: 1e-5,
            rope_theta: 500_000.0,
            rope_llama3: Some(Llama3Rope {
                factor: 32.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position: 8192.0,
            }),
            tie_embeddings: false,
        }
    }

    /// Parses Hugging Face's `config.json` of a `LlamaForCausalLM` (transformers 4 and 5 spell
    /// the rope settings differently; both are read).
    ///
    /// # Errors
    /// Invalid JSON, a missing or non-numeric field, an unsupported rope type, or dimensions
    /// that [`LlamaConfig::validate`] refuses ([`cuda_core::Error::InvalidArgument`]).
    pub fn from_hf_json(text: &str) -> Result<LlamaConfig> {
        let v: Value = serde_json::from_str(text).map_err(|e| bad(format!("config.json: {e}")))?;
        architecture_is_llama(&v)?;
        let num = |k: &str| -> Result<usize> {
            v.get(k)
                .and_then(Value::as_u64)
                .map(|x| x as usize)
                .ok_or_else(|| bad(format!("config.json: `{k}` is missing or not an unsigned integer")))
        };
        let rope = v.get("rope_parameters").or_else(|| v.get("rope_scaling")).filter(|r| !r.is_null());
        let float = |obj: &Value, k: &str| obj.get(k).and_then(Value::as_f64);
        let rope_theta =
            float(&v, "rope_theta").or_else(|| rope.and_then(|r| float(r, "rope_theta"))).unwrap_or(10_000.0);
        let rope_llama3 = match rope {
            None => None,
            Some(r) => match r.get("rope_type").or_else(|| r.get("type")).and_then(Value::as_str) {
                None | Some("default") => None,
                Some("llama3") => {
                    let f =
                        |k: &str| float(r, k).ok_or_else(|| bad(format!("config.json: rope `{k}` missing")));
                    Some(Llama3Rope {
                        factor: f("factor")?,
                        low_freq_factor: f("low_freq_factor")?,
                        high_freq_factor: f("high_freq_factor")?,
                        original_max_position: f("original_max_position_embeddings")?,
                    })
                }
                Some(other) => return Err(bad(format!("config.json: rope type `{other}` is not supported"))),
            },
        };
        let (hidden, heads) = (num("hidden_size")?, num("num_attention_heads")?);
        let head_dim = match v.get("head_dim") {
            Some(h) if !h.is_null() => num("head_dim")?,
            _ => hidden / heads.max(1),
        };
        let cfg = LlamaConfig {
            vocab: num("vocab_size")?,
            hidden,
            layers: num("num_hidden_layers")?,
            heads,
            kv_heads: v
                .get("num_key_value_heads")
                .and_then(Value::as_u64)
                .map(|x| x as usize)
                .unwrap_or(heads),
            head_dim,
            intermediate: num("intermediate_size")?,
            rms_eps: float(&v, "rms_norm_eps").unwrap_or(1e-6),
            rope_theta,
            rope_llama3,
            tie_embeddings: v.get("tie_word_embeddings").and_then(Value::as_bool).unwrap_or(false),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks what the kernels need: every dimension positive, `heads` a multiple of `kv_heads`
    /// with groups of at most 8, `head_dim` a multiple of 32 up to 128, and sizes that fit the
    /// kernels' 32-bit indices.
    ///
    /// # Errors
    /// [`cuda_core::Error::InvalidArgument`] saying which rule is broken.
    pub fn validate(&self) -> Result<()> {
        let dims = [
            self.vocab,
            self.hidden,
            self.layers,
            self.heads,
            self.kv_heads,
            self.head_dim,
            self.intermediate,
        ];
        if dims.contains(&0) {
            return Err(bad(format!("config {self:?}: every dimension must be positive")));
        }
        if !self.heads.is_multiple_of(self.kv_heads) || self.heads / self.kv_heads > kernels::llama::MAX_GROUP
        {
            return Err(bad(format!(
                "config: {} heads over {} KV heads: heads must be a multiple of kv_heads, at most {} per group",
                self.heads,
                self.kv_heads,
                kernels::llama::MAX_GROUP
            )));
        }
        if !self.hidden.is_multiple_of(8) || self.hidden > kernels::llama::MAX_NORM_HIDDEN {
            return Err(bad(format!(
                "config: hidden {} must be a multiple of 8 up to {}",
                self.hidden,
                kernels::llama::MAX_NORM_HIDDEN
            )));
        }
        if !self.head_dim.is_multiple_of(32) || self.head_dim > kernels::llama::MAX_HEAD_DIM {
            return Err(bad(format!(
                "config: head_dim {} must be a multiple of 32 up to 128",
                self.head_dim
            )));
        }
        // Every size derived from the dimensions, with checked arithmetic: a configuration whose
        // sizes overflow `usize` is refused here, so nothing later computes them wrapped.
        let overflow = |what: &str| bad(format!("config {self:?}: {what} overflows usize"));
        let qkv = self.checked_qkv_dim().ok_or_else(|| overflow("(heads + 2 * kv_heads) * head_dim"))?;
        let attn = self.checked_attn_dim().ok_or_else(|| overflow("heads * head_dim"))?;
        let matrices = [
            ("the embedding (vocab x hidden)", self.vocab.checked_mul(self.hidden)),
            (
                "the gate/up projection (2 x intermediate x hidden)",
                self.intermediate.checked_mul(self.hidden).and_then(|n| n.checked_mul(2)),
            ),
            ("the q/k/v projection (qkv_dim x hidden)", qkv.checked_mul(self.hidden)),
            ("the output projection (hidden x heads * head_dim)", attn.checked_mul(self.hidden)),
        ];
        for (what, n) in matrices {
            match n {
                None => return Err(overflow(what)),
                Some(n) if n > u32::MAX as usize => {
                    return Err(bad(format!("config: {what} has {n} elements, more than 2^32")))
                }
                Some(_) => {}
            }
        }
        if self.checked_step_weight_bytes().is_none() {
            return Err(overflow("the weights' size in bytes (layers x per-layer parameters)"));
        }
        if self.checked_kv_bytes(1).is_none() {
            return Err(overflow("the KV cache's bytes per position (4 x layers x kv_heads x head_dim)"));
        }
        if !(self.rms_eps > 0.0 && self.rope_theta > 0.0) {
            return Err(bad("config: rms_norm_eps and rope_theta must be positive".into()));
        }
        if let Some(r) = self.rope_llama3 {
            let finite = [r.factor, r.low_freq_factor, r.high_freq_factor, r.original_max_position];
            if !(finite.iter().all(|v| v.is_finite() && *v > 0.0) && r.low_freq_factor < r.high_freq_factor) {
                return Err(bad(format!(
                    "config: rope_scaling {r:?}: factor, the frequency factors and \
                     original_max_position_embeddings must be finite and positive, low_freq_factor \
                     below high_freq_factor"
                )));
            }
        }
        // Every rotary frequency finite and positive (found by review: a zero scaling factor or
        // a tiny rope_theta made them infinite, every logit NaN, and every step's token u32::MAX).
        if let Some(f) = self.inv_freq().into_iter().find(|f| !(f.is_finite() && *f > 0.0)) {
            return Err(bad(format!(
                "config: rope_theta {} gives a rotary frequency of {f}: every frequency must be finite and positive",
                self.rope_theta
            )));
        }
        Ok(())
    }

    /// Rows of the stacked q/k/v projection: `(heads + 2 * kv_heads) * head_dim` (saturating at
    /// `usize::MAX` for a configuration that [`LlamaConfig::validate`] refuses).
    pub fn qkv_dim(&self) -> usize {
        self.checked_qkv_dim().unwrap_or(usize::MAX)
    }

    /// Width of the attention output: `heads * head_dim` (saturating, as [`LlamaConfig::qkv_dim`]).
    pub fn attn_dim(&self) -> usize {
        self.checked_attn_dim().unwrap_or(usize::MAX)
    }

    /// Parameters (embeddings counted once when tied; saturating at `usize::MAX` for a
    /// configuration that [`LlamaConfig::validate`] refuses).
    pub fn parameters(&self) -> usize {
        self.checked_parameters().unwrap_or(usize::MAX)
    }

    /// Bytes of weights one decode step reads (bf16): everything but the embedding table, which
    /// is read again in full as the output projection when tied (one row per token otherwise).
    /// Saturates at `usize::MAX` for a configuration that [`LlamaConfig::validate`] refuses.
    pub fn step_weight_bytes(&self) -> usize {
        self.checked_step_weight_bytes().unwrap_or(usize::MAX)
    }

    /// Bytes of key/value cache one decode step reads for a sequence at `len` positions
    /// (saturating at `usize::MAX`).
    pub fn kv_bytes(&self, len: usize) -> usize {
        self.checked_kv_bytes(len).unwrap_or(usize::MAX)
    }

    /// [`LlamaConfig::qkv_dim`], `None` on overflow.
    pub fn checked_qkv_dim(&self) -> Option<usize> {
        self.kv_heads.checked_mul(2)?.checked_add(self.heads)?.checked_mul(self.head_dim)
    }

    /// [`LlamaConfig::attn_dim`], `None` on overflow.
    pub fn checked_attn_dim(&self) -> Option<usize> {
        self.heads.checked_mul(self.head_dim)
    }

    /// Parameters of one decoder layer, `None` on overflow.
    fn checked_per_layer(&self) -> Option<usize> {
        let h = self.hidden;
        self.checked_qkv_dim()?
            .checked_mul(h)?
            .checked_add(self.checked_attn_dim()?.checked_mul(h)?)?
            .checked_add(self.intermediate.checked_mul(h)?.checked_mul(3)?)?
            .checked_add(h.checked_mul(2)?)
    }

    /// [`LlamaConfig::parameters`], `None` on overflow.
    pub fn checked_parameters(&self) -> Option<usize> {
        let embed = self.vocab.checked_mul(self.hidden)?;
        let head = if self.tie_embeddings { 0 } else { embed };
        self.layers
            .checked_mul(self.checked_per_layer()?)?
            .checked_add(embed)?
            .checked_add(self.hidden)?
            .checked_add(head)
    }

    /// [`LlamaConfig::step_weight_bytes`], `None` on overflow.
    pub fn checked_step_weight_bytes(&self) -> Option<usize> {
        self.layers
            .checked_mul(self.checked_per_layer()?)?
            .checked_add(self.hidden)?
            .checked_add(self.vocab.checked_mul(self.hidden)?)?
            .checked_mul(2)
    }

    /// [`LlamaConfig::kv_bytes`], `None` on overflow.
    pub fn checked_kv_bytes(&self, len: usize) -> Option<usize> {
        4usize
            .checked_mul(self.layers)?
            .checked_mul(self.kv_heads)?
            .checked_mul(self.head_dim)?
            .checked_mul(len)
    }

    /// The rotary inverse frequencies (`head_dim / 2` of them), as Hugging Face computes them
    /// (with Llama 3 scaling when configured).
    pub fn inv_freq(&self) -> Vec<f32> {
        let d = self.head_dim as f64;
        (0..self.head_dim / 2)
            .map(|i| {
                let f = 1.0 / self.rope_theta.powf((2 * i) as f64 / d);
                let Some(r) = self.rope_llama3 else { return f as f32 };
                let low_wavelen = r.original_max_position / r.low_freq_factor;
                let high_wavelen = r.original_max_position / r.high_freq_factor;
                let wavelen = 2.0 * std::f64::consts::PI / f;
                let scaled = if wavelen > low_wavelen { f / r.factor } else { f };
                let medium = wavelen >= high_wavelen && wavelen <= low_wavelen;
                if medium {
                    let smooth = (r.original_max_position / wavelen - r.low_freq_factor)
                        / (r.high_freq_factor - r.low_freq_factor);
                    ((1.0 - smooth) * scaled / r.factor + smooth * scaled) as f32
                } else {
                    scaled as f32
                }
            })
            .collect()
    }
}

/// Refuses a `config.json` of another model family, or a Llama variant this decoder does not
/// compute (found by review: Qwen2's config uses Llama's field names and passed, and its q/k/v
/// biases were never read, so every step gave wrong tokens without an error): a `model_type` other
/// than `llama`, `architectures` other than `LlamaForCausalLM`, attention or MLP biases, or an
/// activation other than SiLU. Absent fields are taken as Llama's.
fn architecture_is_llama(v: &Value) -> Result<()> {
    if let Some(t) = v.get("model_type").and_then(Value::as_str) {
        if t != "llama" {
            return Err(bad(format!("config.json: model_type `{t}` is not supported (only `llama`)")));
        }
    }
    if let Some(a) = v.get("architectures").and_then(Value::as_array) {
        if let Some(other) = a.iter().find(|x| x.as_str() != Some("LlamaForCausalLM")) {
            return Err(bad(format!(
                "config.json: `architectures` names {other}, which is not supported (only LlamaForCausalLM)"
            )));
        }
    }
    for k in ["attention_bias", "mlp_bias"] {
        if v.get(k).and_then(Value::as_bool) == Some(true) {
            return Err(bad(format!("config.json: `{k}` is true: biases are not supported")));
        }
    }
    if let Some(act) = v.get("hidden_act").and_then(Value::as_str) {
        // transformers maps `swish` to the same function as `silu`.
        if act != "silu" && act != "swish" {
            return Err(bad(format!("config.json: hidden_act `{act}` is not supported (only `silu`)")));
        }
    }
    Ok(())
}

/// An empty vector with room for one item per layer, or [`cuda_core::Error::InvalidArgument`]
/// where the host cannot hold that many (`Vec::with_capacity` aborted the process instead: found
/// by review, `DeviceWeights::random` with `layers: 1 << 52` and tiny layers, a configuration
/// `validate` accepts).
pub(crate) fn per_layer<T>(layers: usize) -> cuda_core::Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(layers).map_err(|_| {
        cuda_core::Error::InvalidArgument(format!(
            "{layers} layers: the host cannot hold one entry per layer"
        ))
    })?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Another family's config (Qwen2's field names are Llama's), biases, or another activation
    /// are refused; a plain Llama config, with or without the optional fields, is read.
    #[test]
    fn other_architectures_are_refused() {
        let base = serde_json::json!({"vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 128});
        let with = |k: &str, x: serde_json::Value| {
            let mut v = base.clone();
            v[k] = x;
            LlamaConfig::from_hf_json(&v.to_string())
        };
        assert!(LlamaConfig::from_hf_json(&base.to_string()).is_ok());
        assert!(with("model_type", "llama".into()).is_ok());
        assert!(with("architectures", serde_json::json!(["LlamaForCausalLM"])).is_ok());
        assert!(with("hidden_act", "silu".into()).is_ok());
        assert!(with("hidden_act", "swish".into()).is_ok());
        assert!(with("attention_bias", false.into()).is_ok());
        for (k, x) in [
            ("model_type", serde_json::json!("qwen2")),
            ("architectures", serde_json::json!(["Qwen2ForCausalLM"])),
            ("attention_bias", serde_json::json!(true)),
            ("mlp_bias", serde_json::json!(true)),
            ("hidden_act", serde_json::json!("gelu")),
        ] {
            let e = with(k, x).unwrap_err().to_string();
            assert!(e.contains(k), "{k}: {e}");
        }
    }

    /// One entry per layer for more layers than the host can hold is an error, not an abort.
    #[test]
    fn per_layer_room_the_host_lacks_is_an_error() {
        let e = per_layer::<[u8; 144]>(1 << 52).unwrap_err();
        assert!(matches!(e, cuda_core::Error::InvalidArgument(_)), "{e}");
        assert!(per_layer::<[u8; 144]>(usize::MAX).is_err());
        assert!(per_layer::<u64>(16).unwrap().capacity() >= 16);
    }

    #[test]
    fn rotary_settings_that_give_non_finite_frequencies_are_refused() {
        let ok = LlamaConfig::llama_3_2_1b();
        assert!(ok.validate().is_ok());
        let mut c = ok.clone();
        c.rope_llama3 = c.rope_llama3.map(|r| Llama3Rope { factor: 0.0, ..r });
        assert!(c.validate().is_err(), "a zero scaling factor");
        let mut c = ok.clone();
        c.rope_llama3 =
            c.rope_llama3.map(|r| Llama3Rope { low_freq_factor: 4.0, high_freq_factor: 4.0, ..r });
        assert!(c.validate().is_err(), "equal frequency factors");
        let mut c = ok.clone();
        c.rope_llama3 = None;
        c.rope_theta = 1e-300;
        assert!(c.validate().is_err(), "a tiny rope_theta");
        c.rope_theta = f64::INFINITY;
        assert!(c.validate().is_err(), "an infinite rope_theta");
    }

    /// Llama 3's scaled inverse frequency of index `i`, in `f64`, written from its definition
    /// (Meta's `apply_scaling`): with `wavelen = 2π / freq`, keep high frequencies
    /// (`wavelen < original / high_freq_factor`), divide low ones by `factor`
    /// (`wavelen > original / low_freq_factor`), and in between interpolate with
    /// `smooth = (original / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)`:
    /// `(1 - smooth) * freq / factor + smooth * freq`. Returns the frequency, the band (0 high,
    /// 1 middle, 2 low) and `smooth` (middle band only).
    fn reference(theta: f64, head_dim: usize, i: usize, r: &Llama3Rope) -> (f64, u8, f64) {
        let freq = 1.0 / theta.powf(2.0 * i as f64 / head_dim as f64);
        let wavelen = 2.0 * std::f64::consts::PI / freq;
        let (high_wavelen, low_wavelen) =
            (r.original_max_position / r.high_freq_factor, r.original_max_position / r.low_freq_factor);
        if wavelen < high_wavelen {
            (freq, 0, 0.0)
        } else if wavelen > low_wavelen {
            (freq / r.factor, 2, 0.0)
        } else {
            let smooth = (r.original_max_position / wavelen - r.low_freq_factor)
                / (r.high_freq_factor - r.low_freq_factor);
            ((1.0 - smooth) * freq / r.factor + smooth * freq, 1, smooth)
        }
    }

    /// `inv_freq` against the reference in all three bands, for both built-in shapes, with at
    /// least one middle-band index whose `smooth` is far from 0 and 1 (so both terms of the
    /// interpolation matter), and the middle band strictly between its neighbours' rules.
    #[test]
    fn llama3_rope_bands_match_the_definition() {
        for cfg in [LlamaConfig::llama_3_2_1b(), LlamaConfig::small()] {
            let r = cfg.rope_llama3.expect("llama3 rope");
            let got = cfg.inv_freq();
            assert_eq!(got.len(), cfg.head_dim / 2);
            let mut bands = [0usize; 3];
            let mut interior_smooth = 0;
            for (i, &g) in got.iter().enumerate() {
                let (want, band, smooth) = reference(cfg.rope_theta, cfg.head_dim, i, &r);
                bands[band as usize] += 1;
                let rel = ((g as f64) - want).abs() / want;
                assert!(rel < 1e-6, "head_dim {} index {i} (band {band}): {g} vs {want}", cfg.head_dim);
                if band == 1 {
                    let freq = 1.0 / cfg.rope_theta.powf(2.0 * i as f64 / cfg.head_dim as f64);
                    assert!(want > freq / r.factor && want < freq, "index {i}: middle band not between");
                    // Distinguishes the interpolation from either end rule by far more than f32
                    // rounding.
                    let to_low = ((g as f64) - freq / r.factor).abs() / want;
                    let to_high = ((g as f64) - freq).abs() / want;
                    assert!(to_low > 1e-3 && to_high > 1e-3, "index {i}: {g} is one of the end rules");
                    if smooth > 0.1 && smooth < 0.9 {
                        interior_smooth += 1;
                    }
                }
            }
            assert!(bands.iter().all(|&b| b > 0), "head_dim {}: bands {bands:?}", cfg.head_dim);
            assert!(
                interior_smooth > 0,
                "head_dim {}: no middle index with 0.1 < smooth < 0.9",
                cfg.head_dim
            );
        }
    }

    /// Without Llama 3 scaling the frequencies are plain `theta^(-2i/d)`.
    #[test]
    fn unscaled_rope_is_plain() {
        let mut cfg = LlamaConfig::small();
        cfg.rope_llama3 = None;
        for (i, &g) in cfg.inv_freq().iter().enumerate() {
            let want = 1.0 / cfg.rope_theta.powf(2.0 * i as f64 / cfg.head_dim as f64);
            assert!(((g as f64) - want).abs() / want < 1e-6, "index {i}: {g} vs {want}");
        }
    }
}
