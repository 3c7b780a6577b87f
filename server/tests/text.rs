//! The text side on the fixture tokenizer: round trip, chat template, incremental
//! detokenisation, stop strings.

use server::detok::{Detokenizer, StopMatcher};
use server::tokenizer::{ChatMessage, TextTokenizer};

/// GPT-2's byte-to-character map of byte-level BPE.
fn byte_char(b: u8) -> char {
    let printable =
        |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
    if printable(b) {
        return char::from(b);
    }
    let n = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).unwrap()
}

#[test]
fn fixture_round_trip_and_specials() {
    let t = TextTokenizer::fixture().unwrap();
    assert_eq!(t.vocab_size(), 2048);
    for s in ["hello world", "Ünïcödé ✓ 日本語 🎉", "  spaces\tand\nnewlines ", "a"] {
        let ids = t.encode(s, false).unwrap();
        assert!(!ids.is_empty() && ids.iter().all(|&i| i < 2048));
        assert_eq!(t.decode(&ids).unwrap(), s, "{ids:?}");
    }
    for (i, name) in
        ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
            .iter()
            .enumerate()
    {
        assert_eq!(t.token_to_id(name), Some(i as u32));
    }
    // eos_token (<|eot_id|>) and <|end_of_text|> end generation; BOS does not.
    let mut eos = t.eos_ids().to_vec();
    eos.sort();
    assert_eq!(eos, [1, 4]);
    // A special token in the text is one token.
    assert_eq!(t.encode("<|eot_id|>", false).unwrap(), [4]);
}

#[test]
fn chat_template_renders_llama3_layout() {
    let t = TextTokenizer::fixture().unwrap();
    let msgs = vec![
        ChatMessage { role: "system".into(), content: "Be brief. ".into(), name: None },
        ChatMessage { role: "user".into(), content: "Hi!".into(), name: None },
    ];
    let s = t.render_chat(&msgs, true).unwrap();
    assert_eq!(
        s,
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    );
    let no_gen = t.render_chat(&msgs, false).unwrap();
    assert!(!no_gen.ends_with("assistant<|end_header_id|>\n\n"));
    let ids = t.encode(&s, false).unwrap();
    assert_eq!(ids[0], 0);
    assert_eq!(ids.iter().filter(|&&i| i == 4).count(), 2);
}

#[test]
fn chat_template_raise_exception_is_an_error() {
    let cfg = r#"{"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "chat_template": "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok"}"#;
    let t = TextTokenizer::from_json(server::tokenizer::FIXTURE_TOKENIZER, cfg, &[]).unwrap();
    let m = |r: &str| vec![ChatMessage { role: r.into(), content: "x".into(), name: None }];
    assert_eq!(t.render_chat(&m("user"), true).unwrap(), "ok");
    let e = t.render_chat(&m("system"), true).unwrap_err().to_string();
    assert!(e.contains("first must be user"), "{e}");
}

#[test]
fn detokenizer_never_emits_half_a_character() {
    let t = TextTokenizer::fixture().unwrap();
    for ch in ["é", "€", "日", "🎉"] {
        let ids: Vec<u32> = ch
            .bytes()
            .map(|b| {
                t.token_to_id(&byte_char(b).to_string()).unwrap_or_else(|| panic!("byte {b:#x} has no token"))
            })
            .collect();
        assert_eq!(ids.len(), ch.len());
        let mut d = Detokenizer::new();
        // A prefix of plain text first, so the character follows other text.
        let mut out = d.push(&t, t.token_to_id("a").unwrap()).unwrap();
        assert_eq!(out, "a");
        for (i, &id) in ids.iter().enumerate() {
            let delta = d.push(&t, id).unwrap();
            assert!(!delta.contains('\u{FFFD}'), "{ch}: byte {i} emitted {delta:?}");
            if i + 1 < ids.len() {
                assert_eq!(delta, "", "{ch}: byte {i} of {} emitted text early", ids.len());
            }
            out.push_str(&delta);
        }
        assert_eq!(out, format!("a{ch}"));
        assert_eq!(d.flush(&t).unwrap(), "");
    }
    // An incomplete character at the very end comes out on flush (as U+FFFD), not before.
    let mut d = Detokenizer::new();
    assert_eq!(d.push(&t, t.token_to_id(&byte_char(0xE2).to_string()).unwrap()).unwrap(), "");
    assert_eq!(d.flush(&t).unwrap(), "\u{FFFD}");
}

#[test]
fn detokenizer_window_stays_small_on_tokens_that_decode_to_nothing() {
    let t = TextTokenizer::fixture().unwrap();
    let mut d = Detokenizer::new();
    let a = t.token_to_id("a").unwrap();
    let mut out = d.push(&t, a).unwrap();
    // <|start_header_id|> decodes to nothing (a special token): 5,000 of them, then text.
    for _ in 0..5000 {
        out.push_str(&d.push(&t, 2).unwrap());
        assert!(d.window() <= 3, "the window grew to {} tokens", d.window());
    }
    out.push_str(&d.push(&t, a).unwrap());
    out.push_str(&d.flush(&t).unwrap());
    assert_eq!(out, "aa");
    // A run of text ending in U+FFFD, then a character split over byte tokens: the stream equals
    // the full decode (a review of an earlier version of the fix, which emitted a held tail after
    // 8 tokens, found the stream went silent here).
    let mut ids = t.encode("\u{FFFD}\u{FFFD}\u{FFFD}\u{FFFD}\u{FFFD}", false).unwrap();
    ids.extend("😀".bytes().map(|b| t.token_to_id(&byte_char(b).to_string()).unwrap()));
    ids.extend(t.encode("x", false).unwrap());
    let mut d = Detokenizer::new();
    let mut out = String::new();
    for &id in &ids {
        out.push_str(&d.push(&t, id).unwrap());
    }
    out.push_str(&d.flush(&t).unwrap());
    assert_eq!(out, t.decode(&ids).unwrap());
}

/// A long run of a byte that is never valid UTF-8 (0xFF): the window stays bounded (found by
/// review: it grew with every token, each push decoding all of it), the stream equals the full
/// decode, and a character split over byte tokens after the run still comes out whole.
#[test]
fn detokenizer_window_stays_small_on_invalid_bytes() {
    let t = TextTokenizer::fixture().unwrap();
    let ff = t.token_to_id(&byte_char(0xFF).to_string()).unwrap();
    let mut ids = vec![ff; 4000];
    ids.extend("😀".bytes().map(|b| t.token_to_id(&byte_char(b).to_string()).unwrap()));
    ids.push(ff);
    ids.extend("é".bytes().map(|b| t.token_to_id(&byte_char(b).to_string()).unwrap()));
    ids.extend(t.encode("x", false).unwrap());
    let mut d = Detokenizer::new();
    let mut out = String::new();
    for &id in &ids {
        out.push_str(&d.push(&t, id).unwrap());
        assert!(d.window() <= 16, "the window grew to {} tokens", d.window());
    }
    out.push_str(&d.flush(&t).unwrap());
    assert_eq!(out, t.decode(&ids).unwrap());
    assert!(out.ends_with("\u{FFFD}😀\u{FFFD}éx"), "{:?}", &out[out.len() - 16..]);
}

#[test]
fn detokenizer_matches_full_decode_on_random_ids() {
    let t = TextTokenizer::fixture().unwrap();
    let mut x = 12345u64;
    for _ in 0..20 {
        let mut d = Detokenizer::new();
        let mut ids = Vec::new();
        let mut out = String::new();
        for _ in 0..60 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let id = ((x >> 33) % 2048) as u32;
            ids.push(id);
            out.push_str(&d.push(&t, id).unwrap());
        }
        out.push_str(&d.flush(&t).unwrap());
        assert_eq!(out, t.decode(&ids).unwrap());
    }
}

#[test]
fn stop_strings_across_boundaries_are_never_emitted() {
    // Every way of cutting the text into deltas gives the text before the stop string.
    let text = "The quick brown fox STOP jumps";
    for cut1 in 0..text.len() {
        for cut2 in cut1..text.len() {
            let mut m = StopMatcher::new(vec!["STOP".into(), "zzz".into()]);
            let mut out = String::new();
            let mut stopped = false;
            for part in [&text[..cut1], &text[cut1..cut2], &text[cut2..]] {
                let (o, s) = m.push(part);
                out.push_str(&o);
                if s {
                    stopped = true;
                    break;
                }
            }
            assert!(stopped, "cuts {cut1} {cut2}");
            assert_eq!(out, "The quick brown fox ", "cuts {cut1} {cut2}");
        }
    }
    // A partial match that turns out not to be one is emitted in full.
    let mut m = StopMatcher::new(vec!["STOP".into()]);
    let (a, _) = m.push("xST");
    let (b, _) = m.push("Oy");
    assert_eq!(format!("{a}{b}{}", m.flush()), "xSTOy");
    // The earliest of several stop strings wins.
    let mut m = StopMatcher::new(vec!["cd".into(), "b".into()]);
    assert_eq!(m.push("abcd"), ("a".to_string(), true));
}
