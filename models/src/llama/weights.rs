//! The weights of a Llama-style decoder: read from a safetensors file in Hugging Face's tensor
//! names (memory-mapped, validated on the host), or drawn at random on the device.

use super::config::LlamaConfig;
use cuda_core::{DeviceBuffer, Stream};
use half::bf16;
use kernels::llama::LlamaKernels;
use safetensors::{Dtype, SafeTensors};
use std::path::Path;

/// Why weights could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be opened or mapped.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The file is not a valid safetensors file (bad header, truncated data, ...).
    #[error("{path} is not a valid safetensors file: {reason}")]
    Format {
        /// The file.
        path: String,
        /// What the parser said.
        reason: String,
    },
    /// A tensor the configuration needs is absent.
    #[error("tensor `{name}` is missing")]
    Missing {
        /// Hugging Face's name of the tensor.
        name: String,
    },
    /// A tensor has another shape than the configuration implies.
    #[error("tensor `{name}` has shape {actual:?}, the configuration needs {expected:?}")]
    Shape {
        /// The tensor.
        name: String,
        /// The shape the configuration implies.
        expected: Vec<usize>,
        /// The shape in the file.
        actual: Vec<usize>,
    },
    /// A tensor has a type other than bf16, f16 or f32.
    #[error("tensor `{name}` has dtype {dtype}; bf16, f16 or f32 is needed")]
    Dtype {
        /// The tensor.
        name: String,
        /// Its type in the file.
        dtype: String,
    },
    /// The weights have another number of decoder layers than the configuration's
    /// `num_hidden_layers`.
    #[error("the weights have {weights} decoder layers, the configuration's num_hidden_layers is {config}")]
    LayerCount {
        /// `num_hidden_layers` of the configuration.
        config: usize,
        /// Decoder layers in the weights (in a file: one more than the highest `model.layers.{i}`).
        weights: usize,
    },
    /// A weight has another number of elements than the configuration implies.
    #[error("weight `{name}` has {actual} elements, the configuration needs {expected}")]
    Elements {
        /// The weight (e.g. `layers[3].wqkv`).
        name: String,
        /// The number the configuration implies.
        expected: usize,
        /// The number it has.
        actual: usize,
    },
    /// `lm_head` is present although the configuration ties the embeddings, or absent although
    /// it does not.
    #[error("the configuration has tie_word_embeddings = {tied}, but the weights {}", if *tied { "have an lm_head" } else { "have no lm_head" })]
    OutputHead {
        /// `tie_word_embeddings` of the configuration.
        tied: bool,
    },
    /// The configuration itself is invalid (or, from [`super::LlamaModel::from_hf_dir`],
    /// `config.json` is not a Llama configuration this crate supports).
    #[error(transparent)]
    Config(#[from] cuda_async::DeviceError),
    /// The weights were read and checked, but putting them on the device or building the model
    /// there failed (allocation, kernel compilation, cuBLAS missing, invalid [`super::ModelOptions`],
    /// ...): from [`super::LlamaModel::from_hf_dir`].
    #[error("building the model on the device: {0}")]
    Device(#[source] cuda_async::DeviceError),
}

/// A weight whose number of elements can be checked against a configuration
/// ([`Weights::check`]).
pub trait Elements {
    /// The number of elements.
    fn elements(&self) -> usize;
}

impl<T> Elements for Vec<T> {
    fn elements(&self) -> usize {
        self.len()
    }
}

impl<T: cuda_core::DeviceRepr> Elements for DeviceBuffer<T> {
    fn elements(&self) -> usize {
        self.len()
    }
}

/// A bare element count (for checking shapes without data).
impl Elements for usize {
    fn elements(&self) -> usize {
        *self
    }
}

impl<B: Elements> Weights<B> {
    /// Checks the weights against `config`: as many layers as `num_hidden_layers`, every weight
    /// with the number of elements the configuration implies, and `lm_head` present exactly when
    /// the embeddings are not tied. [`super::LlamaModel::new`] calls it, so that weights that do
    /// not match their configuration are refused before any step indexes them.
    ///
    /// # Errors
    /// [`LoadError::Config`] for an invalid configuration, [`LoadError::LayerCount`],
    /// [`LoadError::Elements`] or [`LoadError::OutputHead`] naming the first mismatch.
    pub fn check(&self, config: &LlamaConfig) -> Result<(), LoadError> {
        config.validate()?;
        let c = config;
        if self.layers.len() != c.layers {
            return Err(LoadError::LayerCount { config: c.layers, weights: self.layers.len() });
        }
        // Validated: none of these products overflows.
        let h = c.hidden;
        let want = |name: String, b: &B, expected: usize| {
            let actual = b.elements();
            if actual == expected {
                Ok(())
            } else {
                Err(LoadError::Elements { name, expected, actual })
            }
        };
        want("embed".into(), &self.embed, c.vocab * h)?;
        for (i, l) in self.layers.iter().enumerate() {
            want(format!("layers[{i}].attn_norm"), &l.attn_norm, h)?;
            want(format!("layers[{i}].wqkv"), &l.wqkv, c.qkv_dim() * h)?;
            want(format!("layers[{i}].wo"), &l.wo, h * c.attn_dim())?;
            want(format!("layers[{i}].mlp_norm"), &l.mlp_norm, h)?;
            want(format!("layers[{i}].w_gate_up"), &l.w_gate_up, 2 * c.intermediate * h)?;
            want(format!("layers[{i}].w_down"), &l.w_down, h * c.intermediate)?;
        }
        want("final_norm".into(), &self.final_norm, h)?;
        match (&self.lm_head, c.tie_embeddings) {
            (Some(head), false) => want("lm_head".into(), head, c.vocab * h),
            (None, true) => Ok(()),
            (_, tied) => Err(LoadError::OutputHead { tied }),
        }
    }
}

/// The weights of one decoder layer, in the layouts the decode step uses (host or device).
#[derive(Debug, Clone)]
pub struct Layer<B> {
    /// `input_layernorm.weight` `[hidden]`.
    pub attn_norm: B,
    /// `q_proj`, `k_proj`, `v_proj` stacked: `[(heads + 2 kv_heads) * head_dim][hidden]`.
    pub wqkv: B,
    /// `o_proj` `[hidden][heads * head_dim]`.
    pub wo: B,
    /// `post_attention_layernorm.weight` `[hidden]`.
    pub mlp_norm: B,
    /// `gate_proj` and `up_proj` stacked: `[2 * intermediate][hidden]`.
    pub w_gate_up: B,
    /// `down_proj` `[hidden][intermediate]`.
    pub w_down: B,
}

/// All weights of a decoder, as host vectors or device buffers.
#[derive(Debug, Clone)]
pub struct Weights<B> {
    /// `model.embed_tokens.weight` `[vocab][hidden]`.
    pub embed: B,
    /// The layers, in order.
    pub layers: Vec<Layer<B>>,
    /// `model.norm.weight` `[hidden]`.
    pub final_norm: B,
    /// `lm_head.weight` `[vocab][hidden]`, `None` when tied to the embedding.
    pub lm_head: Option<B>,
}

/// Host weights (bf16), validated against a configuration.
pub type HostWeights = Weights<Vec<bf16>>;

/// Device weights.
pub type DeviceWeights = Weights<DeviceBuffer<bf16>>;

struct File<'a> {
    st: SafeTensors<'a>,
}

impl File<'_> {
    fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<bf16>, LoadError> {
        let t = self.st.tensor(name).map_err(|_| LoadError::Missing { name: name.into() })?;
        if t.shape() != shape {
            return Err(LoadError::Shape {
                name: name.into(),
                expected: shape.to_vec(),
                actual: t.shape().to_vec(),
            });
        }
        let d = t.data();
        let bytes2 = |f: fn([u8; 2]) -> bf16| d.chunks_exact(2).map(|c| f([c[0], c[1]])).collect();
        Ok(match t.dtype() {
            Dtype::BF16 => bytes2(bf16::from_le_bytes),
            Dtype::F16 => bytes2(|b| bf16::from_f32(half::f16::from_le_bytes(b).to_f32())),
            Dtype::F32 => d
                .chunks_exact(4)
                .map(|c| bf16::from_f32(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .collect(),
            other => return Err(LoadError::Dtype { name: name.into(), dtype: format!("{other:?}") }),
        })
    }

    fn stacked(&self, parts: &[(&str, usize)], cols: usize) -> Result<Vec<bf16>, LoadError> {
        let mut out = Vec::with_capacity(parts.iter().map(|p| p.1).sum::<usize>() * cols);
        for &(name, rows) in parts {
            out.extend(self.get(name, &[rows, cols])?);
        }
        Ok(out)
    }
}

impl HostWeights {
    /// Reads and checks every tensor `config` needs from a safetensors file with Hugging Face's
    /// Llama names (`model.embed_tokens.weight`, `model.layers.{i}.self_attn.q_proj.weight`, ...,
    /// `lm_head.weight` unless tied). The file is memory-mapped; bf16 is taken as is, f16 and f32
    /// are rounded to bf16. Tensors the configuration does not use (e.g. `lm_head.weight` when
    /// tied) are ignored, but decoder layers are not: the file must hold exactly
    /// `num_hidden_layers` of them.
    ///
    /// # Errors
    /// [`LoadError`]: the file cannot be read, is not safetensors (e.g. truncated), has more or
    /// fewer decoder layers than the configuration ([`LoadError::LayerCount`]), or a tensor is
    /// missing or has the wrong shape or type; an invalid configuration.
    pub fn from_safetensors(path: &Path, config: &LlamaConfig) -> Result<HostWeights, LoadError> {
        config.validate()?;
        let shown = path.display().to_string();
        let file =
            std::fs::File::open(path).map_err(|source| LoadError::Io { path: shown.clone(), source })?;
        // SAFETY: the map is read-only and private to this call; the file is not modified by this
        // process while mapped (another process truncating it is outside what Rust can protect
        // against, as for every mmap-based reader).
        let map = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|source| LoadError::Io { path: shown.clone(), source })?;
        let st = SafeTensors::deserialize(&map)
            .map_err(|e| LoadError::Format { path: shown, reason: e.to_string() })?;
        // Decoder layers in the file: one more than the highest `model.layers.{i}.` index. A file
        // with more or fewer layers than the configuration is a mismatch, not a subset to pick.
        let in_file = st
            .names()
            .iter()
            .filter_map(|n| n.strip_prefix("model.layers.")?.split('.').next()?.parse::<usize>().ok())
            .map(|i| i.saturating_add(1))
            .max()
            .unwrap_or(0);
        if in_file != config.layers {
            return Err(LoadError::LayerCount { config: config.layers, weights: in_file });
        }
        let f = File { st };
        let c = config;
        let (h, hd) = (c.hidden, c.head_dim);
        let layers = (0..c.layers)
            .map(|i| {
                let p = format!("model.layers.{i}");
                Ok(Layer {
                    attn_norm: f.get(&format!("{p}.input_layernorm.weight"), &[h])?,
                    wqkv: f.stacked(
                        &[
                            (&format!("{p}.self_attn.q_proj.weight"), c.heads * hd),
                            (&format!("{p}.self_attn.k_proj.weight"), c.kv_heads * hd),
                            (&format!("{p}.self_attn.v_proj.weight"), c.kv_heads * hd),
                        ],
                        h,
                    )?,
                    wo: f.get(&format!("{p}.self_attn.o_proj.weight"), &[h, c.heads * hd])?,
                    mlp_norm: f.get(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
                    w_gate_up: f.stacked(
                        &[
                            (&format!("{p}.mlp.gate_proj.weight"), c.intermediate),
                            (&format!("{p}.mlp.up_proj.weight"), c.intermediate),
                        ],
                        h,
                    )?,
                    w_down: f.get(&format!("{p}.mlp.down_proj.weight"), &[h, c.intermediate])?,
                })
            })
            .collect::<Result<Vec<_>, LoadError>>()?;
        let w = Weights {
            embed: f.get("model.embed_tokens.weight", &[c.vocab, h])?,
            layers,
            final_norm: f.get("model.norm.weight", &[h])?,
            lm_head: if c.tie_embeddings { None } else { Some(f.get("lm_head.weight", &[c.vocab, h])?) },
        };
        w.check(c)?;
        Ok(w)
    }

    /// Copies the weights to the device on `stream`.
    ///
    /// # Errors
    /// Allocation and copy errors.
    pub fn upload(&self, stream: &Stream) -> cuda_core::Result<DeviceWeights> {
        let up = |v: &Vec<bf16>| DeviceBuffer::from_host(stream, v);
        Ok(Weights {
            embed: up(&self.embed)?,
            layers: self
                .layers
                .iter()
                .map(|l| {
                    Ok(Layer {
                        attn_norm: up(&l.attn_norm)?,
                        wqkv: up(&l.wqkv)?,
                        wo: up(&l.wo)?,
                        mlp_norm: up(&l.mlp_norm)?,
                        w_gate_up: up(&l.w_gate_up)?,
                        w_down: up(&l.w_down)?,
                    })
                })
                .collect::<cuda_core::Result<Vec<_>>>()?,
            final_norm: up(&self.final_norm)?,
            lm_head: self.lm_head.as_ref().map(up).transpose()?,
        })
    }
}

impl DeviceWeights {
    /// Random weights drawn on the device (Hugging Face's initialisation: every matrix
    /// `N(0, std²)`, norms 1), deterministic in `seed`: for benchmarks and for the main job when
    /// no weights file is given.
    ///
    /// # Errors
    /// An invalid configuration, kernel compilation, allocation and launch errors.
    pub fn random(
        stream: &Stream,
        config: &LlamaConfig,
        seed: u64,
        std: f32,
    ) -> cuda_async::Result<DeviceWeights> {
        config.validate()?;
        let k = LlamaKernels::get(stream.device())?;
        let mut n = 0u64;
        let mut randn = |len: usize| -> cuda_core::Result<DeviceBuffer<bf16>> {
            let mut b = DeviceBuffer::zeros(stream, len)?;
            n += 1;
            k.randn(stream, &mut b, seed.wrapping_mul(1000).wrapping_add(n), 0.0, std)?;
            Ok(b)
        };
        let c = config;
        let h = c.hidden;
        let embed = randn(c.vocab * h)?;
        let mut layers = super::config::per_layer(c.layers)?;
        for _ in 0..c.layers {
            layers.push(Layer {
                attn_norm: DeviceBuffer::filled(stream, h, bf16::ONE)?,
                wqkv: randn(c.qkv_dim() * h)?,
                wo: randn(h * c.attn_dim())?,
                mlp_norm: DeviceBuffer::filled(stream, h, bf16::ONE)?,
                w_gate_up: randn(2 * c.intermediate * h)?,
                w_down: randn(h * c.intermediate)?,
            });
        }
        let lm_head = if c.tie_embeddings { None } else { Some(randn(c.vocab * h)?) };
        Ok(Weights { embed, layers, final_norm: DeviceBuffer::filled(stream, h, bf16::ONE)?, lm_head })
    }

    /// Bytes of device memory the weights take.
    pub fn bytes(&self) -> usize {
        let l: usize = self
            .layers
            .iter()
            .map(|l| {
                [&l.attn_norm, &l.wqkv, &l.wo, &l.mlp_norm, &l.w_gate_up, &l.w_down]
                    .iter()
                    .map(|b| b.size_bytes())
                    .sum::<usize>()
            })
            .sum();
        self.embed.size_bytes()
            + l
            + self.final_norm.size_bytes()
            + self.lm_head.as_ref().map_or(0, |b| b.size_bytes())
    }

    /// The output projection: `lm_head`, or the embedding table when tied.
    pub fn output(&self) -> &DeviceBuffer<bf16> {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }
}

/// Writes random weights for `config` to a safetensors file in Hugging Face's names and layout
/// (bf16, `N(0, std²)` matrices, unit norms; deterministic in `seed`): test fixtures and small
/// demo models without a download.
///
/// # Errors
/// An invalid configuration; I/O errors.
pub fn write_random_safetensors(
    path: &Path,
    config: &LlamaConfig,
    seed: u64,
    std: f32,
) -> Result<(), LoadError> {
    use rand::{Rng, SeedableRng};
    config.validate()?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let c = config;
    let h = c.hidden;
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut add = |name: String, shape: Vec<usize>, ones: bool| {
        let n: usize = shape.iter().product();
        let mut bytes = Vec::with_capacity(2 * n);
        for _ in 0..n {
            let v = if ones {
                1.0
            } else {
                // Box-Muller from two uniforms.
                let (u1, u2): (f64, f64) = (rng.random_range(f64::EPSILON..1.0), rng.random());
                (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos() * f64::from(std)
            };
            bytes.extend_from_slice(&bf16::from_f64(v).to_le_bytes());
        }
        tensors.push((name, shape, bytes));
    };
    add("model.embed_tokens.weight".into(), vec![c.vocab, h], false);
    for i in 0..c.layers {
        let p = format!("model.layers.{i}");
        add(format!("{p}.input_layernorm.weight"), vec![h], true);
        add(format!("{p}.self_attn.q_proj.weight"), vec![c.heads * c.head_dim, h], false);
        add(format!("{p}.self_attn.k_proj.weight"), vec![c.kv_heads * c.head_dim, h], false);
        add(format!("{p}.self_attn.v_proj.weight"), vec![c.kv_heads * c.head_dim, h], false);
        add(format!("{p}.self_attn.o_proj.weight"), vec![h, c.heads * c.head_dim], false);
        add(format!("{p}.post_attention_layernorm.weight"), vec![h], true);
        add(format!("{p}.mlp.gate_proj.weight"), vec![c.intermediate, h], false);
        add(format!("{p}.mlp.up_proj.weight"), vec![c.intermediate, h], false);
        add(format!("{p}.mlp.down_proj.weight"), vec![h, c.intermediate], false);
    }
    add("model.norm.weight".into(), vec![h], true);
    if !c.tie_embeddings {
        add("lm_head.weight".into(), vec![c.vocab, h], false);
    }
    let views = tensors
        .iter()
        .map(|(name, shape, bytes)| {
            let v = safetensors::tensor::TensorView::new(Dtype::BF16, shape.clone(), bytes)
                .map_err(|e| LoadError::Format { path: name.clone(), reason: e.to_string() })?;
            Ok((name.clone(), v))
        })
        .collect::<Result<Vec<_>, LoadError>>()?;
    let shown = path.display().to_string();
    safetensors::serialize_to_file(views, None, path)
        .map_err(|e| LoadError::Format { path: shown, reason: e.to_string() })
}
