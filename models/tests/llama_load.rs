//! CPU tests of the Llama weight loader and configuration parser (no GPU needed): a generated
//! safetensors file round-trips, and every kind of bad input is a clear error.

use half::bf16;
use models::llama::{write_random_safetensors, HostWeights, Layer, LlamaConfig, LoadError, Weights};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use std::path::Path;

fn tiny() -> LlamaConfig {
    LlamaConfig {
        vocab: 64,
        hidden: 64,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        head_dim: 32,
        intermediate: 96,
        tie_embeddings: false,
        ..LlamaConfig::small()
    }
}

/// Rewrites `src` into `dst`, with `edit` applied to the list of (name, dtype, shape, bytes).
fn rewrite(src: &Path, dst: &Path, edit: impl FnOnce(&mut Vec<(String, Dtype, Vec<usize>, Vec<u8>)>)) {
    let bytes = std::fs::read(src).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut list: Vec<_> = st
        .tensors()
        .into_iter()
        .map(|(n, t)| (n, t.dtype(), t.shape().to_vec(), t.data().to_vec()))
        .collect();
    edit(&mut list);
    let views: Vec<_> =
        list.iter().map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    safetensors::serialize_to_file(views, None, dst).unwrap();
}

#[test]
fn generated_file_loads_with_stacked_layouts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let cfg = tiny();
    write_random_safetensors(&path, &cfg, 3, 0.02).unwrap();
    let w = HostWeights::from_safetensors(&path, &cfg).unwrap();
    assert_eq!(w.layers.len(), 2);
    assert_eq!(w.embed.len(), 64 * 64);
    assert_eq!(w.layers[0].wqkv.len(), cfg.qkv_dim() * cfg.hidden);
    assert_eq!(w.layers[1].w_gate_up.len(), 2 * 96 * 64);
    assert!(w.layers[0].attn_norm.iter().all(|&v| v == bf16::ONE));
    assert!(w.lm_head.is_some());
    // The stacking order is q, k, v: the first rows of wqkv are q_proj's.
    let bytes = std::fs::read(&path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let k = st.tensor("model.layers.1.self_attn.k_proj.weight").unwrap();
    let k0 = bf16::from_le_bytes([k.data()[0], k.data()[1]]);
    assert_eq!(w.layers[1].wqkv[cfg.heads * cfg.head_dim * cfg.hidden], k0);
    // Deterministic in the seed, and the values are N(0, 0.02²)-like.
    let m: f64 = w.embed.iter().map(|v| f64::from(v.to_f32()).powi(2)).sum::<f64>() / w.embed.len() as f64;
    assert!((m.sqrt() - 0.02).abs() < 0.003, "std {}", m.sqrt());
    // Tied: lm_head is not needed (and absent is fine).
    let tied = LlamaConfig { tie_embeddings: true, ..cfg.clone() };
    assert!(HostWeights::from_safetensors(&path, &tied).unwrap().lm_head.is_none());
}

#[test]
fn bad_files_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.safetensors");
    let cfg = tiny();
    write_random_safetensors(&good, &cfg, 1, 0.02).unwrap();
    let bad = dir.path().join("bad.safetensors");

    rewrite(&good, &bad, |l| l.retain(|t| t.0 != "model.layers.1.mlp.up_proj.weight"));
    let e = HostWeights::from_safetensors(&bad, &cfg).unwrap_err();
    assert!(matches!(&e, LoadError::Missing { name } if name == "model.layers.1.mlp.up_proj.weight"), "{e}");
    assert!(e.to_string().contains("up_proj"), "{e}");

    rewrite(&good, &bad, |l| {
        let t = l.iter_mut().find(|t| t.0 == "model.layers.0.self_attn.o_proj.weight").unwrap();
        t.2 = vec![t.2[1], t.2[0]]; // [128][64] instead of [64][128]: same bytes, transposed shape
    });
    let e = HostWeights::from_safetensors(&bad, &cfg).unwrap_err();
    assert!(matches!(&e, LoadError::Shape { name, .. } if name.ends_with("o_proj.weight")), "{e}");

    rewrite(&good, &bad, |l| {
        let t = l.iter_mut().find(|t| t.0 == "model.norm.weight").unwrap();
        t.1 = Dtype::I16;
    });
    let e = HostWeights::from_safetensors(&bad, &cfg).unwrap_err();
    assert!(matches!(&e, LoadError::Dtype { name, .. } if name == "model.norm.weight"), "{e}");

    // f32 tensors are accepted and rounded to bf16.
    rewrite(&good, &bad, |l| {
        let t = l.iter_mut().find(|t| t.0 == "model.norm.weight").unwrap();
        t.1 = Dtype::F32;
        t.3 = [1.5f32; 64].iter().flat_map(|v| v.to_le_bytes()).collect();
    });
    let w = HostWeights::from_safetensors(&bad, &cfg).unwrap();
    assert!(w.final_norm.iter().all(|&v| v == bf16::from_f32(1.5)));

    let bytes = std::fs::read(&good).unwrap();
    std::fs::write(&bad, &bytes[..bytes.len() - 100]).unwrap();
    let e = HostWeights::from_safetensors(&bad, &cfg).unwrap_err();
    assert!(matches!(e, LoadError::Format { .. }), "{e}");
    std::fs::write(&bad, b"not a safetensors file").unwrap();
    assert!(matches!(HostWeights::from_safetensors(&bad, &cfg).unwrap_err(), LoadError::Format { .. }));
    let e = HostWeights::from_safetensors(&dir.path().join("absent"), &cfg).unwrap_err();
    assert!(matches!(e, LoadError::Io { .. }), "{e}");

    // A configuration the kernels cannot run is refused before the file is read.
    let odd = LlamaConfig { head_dim: 48, ..cfg.clone() };
    assert!(matches!(HostWeights::from_safetensors(&good, &odd).unwrap_err(), LoadError::Config(_)));
}

#[test]
fn hf_config_json_both_rope_spellings() {
    let v4 = r#"{"vocab_size": 128256, "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 8192, "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0, "tie_word_embeddings": true,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"}}"#;
    assert_eq!(LlamaConfig::from_hf_json(v4).unwrap(), LlamaConfig::llama_3_2_1b());
    let v5 = r#"{"vocab_size": 128256, "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 8192, "rms_norm_eps": 1e-05, "tie_word_embeddings": true,
        "rope_parameters": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0, "rope_theta": 500000.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"}}"#;
    assert_eq!(LlamaConfig::from_hf_json(v5).unwrap(), LlamaConfig::llama_3_2_1b());
    assert!(LlamaConfig::from_hf_json("{").is_err());
    let no_vocab = v4.replace("\"vocab_size\": 128256,", "");
    assert!(LlamaConfig::from_hf_json(&no_vocab).unwrap_err().to_string().contains("vocab_size"));
    let yarn = v4.replace("llama3", "yarn");
    assert!(LlamaConfig::from_hf_json(&yarn).unwrap_err().to_string().contains("yarn"));
    let bad_heads = v4.replace("\"num_key_value_heads\": 8", "\"num_key_value_heads\": 3");
    assert!(LlamaConfig::from_hf_json(&bad_heads).is_err());
}

#[test]
fn llama3_inv_freq_matches_hugging_face() {
    // Hugging Face's `_compute_llama3_parameters` for Llama-3.2-1B, head_dim 64 (values from
    // transformers, rounded): the first is unscaled, the last divided by the factor 32.
    let f = LlamaConfig::llama_3_2_1b().inv_freq();
    assert_eq!(f.len(), 32);
    assert!((f[0] - 1.0).abs() < 1e-7);
    let plain_last = 1.0 / 500000f64.powf(62.0 / 64.0);
    assert!((f64::from(f[31]) - plain_last / 32.0).abs() < 1e-12 + plain_last * 1e-6);
    assert!(f.windows(2).all(|w| w[1] < w[0]), "decreasing");
    let p = LlamaConfig::llama_3_2_1b().parameters();
    assert!((1_235_000_000..1_236_000_000).contains(&p), "{p} parameters (Llama-3.2-1B has 1.236 B)");
}

#[test]
fn file_with_more_or_fewer_layers_than_the_config_is_a_layer_count_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("three.safetensors");
    let cfg = tiny();
    // A file of num_hidden_layers + 1 layers: the extra layer used to be ignored at load, and a
    // model built over more layers than its KV cache has panicked in its first step.
    write_random_safetensors(&path, &LlamaConfig { layers: 3, ..cfg.clone() }, 5, 0.02).unwrap();
    let e = HostWeights::from_safetensors(&path, &cfg).unwrap_err();
    assert!(matches!(e, LoadError::LayerCount { config: 2, weights: 3 }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("num_hidden_layers") && msg.contains('3') && msg.contains('2'), "{msg}");
    // Fewer layers than the configuration: the same error (not a missing tensor of layer 3).
    let e = HostWeights::from_safetensors(&path, &LlamaConfig { layers: 4, ..cfg.clone() }).unwrap_err();
    assert!(matches!(e, LoadError::LayerCount { config: 4, weights: 3 }), "{e}");
    // A stray tensor of a layer beyond the configuration counts too.
    let good = dir.path().join("two.safetensors");
    write_random_safetensors(&good, &cfg, 5, 0.02).unwrap();
    let bad = dir.path().join("stray.safetensors");
    rewrite(&good, &bad, |l| {
        let norm = l.iter().find(|t| t.0 == "model.layers.1.input_layernorm.weight").unwrap().clone();
        l.push(("model.layers.7.input_layernorm.weight".into(), norm.1, norm.2, norm.3));
    });
    let e = HostWeights::from_safetensors(&bad, &cfg).unwrap_err();
    assert!(matches!(e, LoadError::LayerCount { config: 2, weights: 8 }), "{e}");
    assert!(HostWeights::from_safetensors(&good, &cfg).is_ok());
}

/// Element counts of weights that match `cfg`.
fn counts(cfg: &LlamaConfig) -> Weights<usize> {
    let h = cfg.hidden;
    let layer = Layer {
        attn_norm: h,
        wqkv: cfg.qkv_dim() * h,
        wo: h * cfg.attn_dim(),
        mlp_norm: h,
        w_gate_up: 2 * cfg.intermediate * h,
        w_down: h * cfg.intermediate,
    };
    Weights {
        embed: cfg.vocab * h,
        layers: vec![layer; cfg.layers],
        final_norm: h,
        lm_head: (!cfg.tie_embeddings).then_some(cfg.vocab * h),
    }
}

#[test]
fn weights_check_refuses_every_mismatch_with_the_config() {
    // `LlamaModel::new` runs this check (it needs a GPU to be built, so the check is tested here).
    let cfg = tiny();
    counts(&cfg).check(&cfg).unwrap();
    let tied = LlamaConfig { tie_embeddings: true, ..cfg.clone() };
    counts(&tied).check(&tied).unwrap();

    let mut w = counts(&cfg);
    w.layers.push(w.layers[0].clone());
    let e = w.check(&cfg).unwrap_err();
    assert!(matches!(e, LoadError::LayerCount { config: 2, weights: 3 }), "{e}");
    w.layers.truncate(1);
    assert!(matches!(w.check(&cfg).unwrap_err(), LoadError::LayerCount { config: 2, weights: 1 }));

    let mut w = counts(&cfg);
    w.layers[1].wqkv -= 1;
    let e = w.check(&cfg).unwrap_err();
    assert!(matches!(&e, LoadError::Elements { name, .. } if name == "layers[1].wqkv"), "{e}");
    for (name, edit) in [
        ("embed", (|w: &mut Weights<usize>| w.embed += 1) as fn(&mut Weights<usize>)),
        ("layers[0].attn_norm", |w| w.layers[0].attn_norm += 1),
        ("layers[0].wo", |w| w.layers[0].wo += 1),
        ("layers[1].mlp_norm", |w| w.layers[1].mlp_norm += 1),
        ("layers[1].w_gate_up", |w| w.layers[1].w_gate_up += 1),
        ("layers[1].w_down", |w| w.layers[1].w_down += 1),
        ("final_norm", |w| w.final_norm += 1),
        ("lm_head", |w| w.lm_head = Some(1)),
    ] {
        let mut w = counts(&cfg);
        edit(&mut w);
        let e = w.check(&cfg).unwrap_err();
        assert!(matches!(&e, LoadError::Elements { name: n, .. } if n == name), "{name}: {e}");
    }
    // lm_head against tie_word_embeddings, both ways.
    let e = counts(&cfg).check(&tied).unwrap_err();
    assert!(matches!(e, LoadError::OutputHead { tied: true }), "{e}");
    let e = counts(&tied).check(&cfg).unwrap_err();
    assert!(matches!(e, LoadError::OutputHead { tied: false }), "{e}");
    // Host weights loaded for one configuration do not pass for another.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    write_random_safetensors(&path, &cfg, 2, 0.02).unwrap();
    let host = HostWeights::from_safetensors(&path, &cfg).unwrap();
    host.check(&cfg).unwrap();
    let wider = LlamaConfig { intermediate: 128, ..cfg.clone() };
    assert!(matches!(host.check(&wider).unwrap_err(), LoadError::Elements { .. }));
}

#[test]
fn huge_dimensions_are_validation_errors_not_overflows() {
    let big = usize::MAX / 2;
    let base = tiny();
    let cases = [
        ("vocab", LlamaConfig { vocab: big, ..base.clone() }),
        ("layers", LlamaConfig { layers: big, ..base.clone() }),
        ("intermediate", LlamaConfig { intermediate: big, ..base.clone() }),
        ("kv_heads", LlamaConfig { heads: big, kv_heads: big, ..base.clone() }),
        ("heads", LlamaConfig { heads: big - big % 2, kv_heads: 2, ..base.clone() }),
        (
            "heads 8 per group",
            LlamaConfig { heads: 8 * (usize::MAX / 16), kv_heads: usize::MAX / 16, ..base.clone() },
        ),
        ("layers x kv", LlamaConfig { layers: usize::MAX / 64, ..base.clone() }),
        (
            "all",
            LlamaConfig {
                vocab: big,
                layers: big,
                heads: big,
                kv_heads: big,
                intermediate: big,
                ..base.clone()
            },
        ),
    ];
    for (what, c) in cases {
        let e = c.validate().expect_err(what);
        assert!(!e.to_string().is_empty());
        // The derived sizes saturate instead of wrapping (or panicking in debug builds).
        let _ = (c.qkv_dim(), c.attn_dim(), c.parameters(), c.step_weight_bytes(), c.kv_bytes(1 << 20));
        let mut w = counts(&base);
        w.layers.clear();
        assert!(matches!(w.check(&c), Err(LoadError::Config(_))), "{what}");
    }
    let c = LlamaConfig { layers: big, ..base.clone() };
    assert_eq!(c.parameters(), usize::MAX);
    assert_eq!(c.checked_parameters(), None);
    assert_eq!(c.kv_bytes(usize::MAX), usize::MAX);
    // Through config.json as well: u64 values beyond what the sizes can hold.
    let json = format!(
        r#"{{"vocab_size": 64, "hidden_size": 64, "num_hidden_layers": {}, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 96}}"#,
        u64::MAX / 2
    );
    let e = LlamaConfig::from_hf_json(&json).unwrap_err();
    assert!(e.to_string().contains("overflow"), "{e}");
    // The sizes of a real model are unchanged.
    let one_b = LlamaConfig::llama_3_2_1b();
    assert_eq!(one_b.checked_parameters(), Some(one_b.parameters()));
    assert_eq!(one_b.kv_bytes(10), 4 * 16 * 8 * 64 * 10);
}
