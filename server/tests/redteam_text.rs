//! Red team, text out: incremental detokenisation equals decoding everything at once (no
//! U+FFFD emitted for a character that later completes), and stop strings are found across
//! any split of the text and never emitted.

use rand::{Rng, SeedableRng};
use server::detok::{Detokenizer, StopMatcher};
use server::tokenizer::TextTokenizer;

#[test]
fn incremental_detokenisation_equals_whole_decoding() {
    let t = TextTokenizer::fixture().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    // Multi-byte text (its tokens split characters), then random ids (bytes that never complete).
    let texts = ["日本語のテキスト 🎉🎉 ünïcödé ✓✓", "a🎉b€c", "😀😃😄😁😆😅🤣😂"];
    let mut seqs: Vec<Vec<u32>> = texts.iter().map(|s| t.encode(s, false).unwrap()).collect();
    for _ in 0..200 {
        let n = rng.random_range(1..40);
        seqs.push((0..n).map(|_| rng.random_range(5..2048)).collect());
    }
    for ids in &seqs {
        let mut d = Detokenizer::new();
        let mut out = String::new();
        for &id in ids {
            out.push_str(&d.push(&t, id).unwrap());
        }
        out.push_str(&d.flush(&t).unwrap());
        assert_eq!(out, t.decode(ids).unwrap(), "{ids:?}");
    }
}

#[test]
fn stop_strings_across_any_split() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let alphabet: Vec<char> = "ab€🎉 x".chars().collect();
    for _ in 0..2000 {
        let len = rng.random_range(1..30);
        let text: String = (0..len).map(|_| alphabet[rng.random_range(0..alphabet.len())]).collect();
        let chars: Vec<char> = text.chars().collect();
        let mut stops: Vec<String> = Vec::new();
        for _ in 0..rng.random_range(1..4) {
            let a = rng.random_range(0..chars.len());
            let b = rng.random_range(a + 1..=chars.len().min(a + 4));
            let mut s: String = chars[a..b].iter().collect();
            if rng.random_bool(0.3) {
                s.push('z'); // never appears
            }
            stops.push(s);
        }
        // Random deltas on character boundaries.
        let mut cuts = vec![0];
        while *cuts.last().unwrap() < text.len() {
            let mut k = cuts.last().unwrap() + rng.random_range(1..=4);
            while k < text.len() && !text.is_char_boundary(k) {
                k += 1;
            }
            cuts.push(k.min(text.len()));
        }
        // Generation ends at the first delta after which some stop string occurs in the text;
        // the output is the text before the earliest occurrence then.
        let want = cuts[1..]
            .iter()
            .find_map(|&k| stops.iter().filter_map(|s| text[..k].find(s.as_str())).min())
            .map_or((text.clone(), false), |at| (text[..at].to_string(), true));
        let mut m = StopMatcher::new(stops.clone());
        let (mut out, mut stopped) = (String::new(), false);
        for w in cuts.windows(2) {
            let (o, s) = m.push(&text[w[0]..w[1]]);
            out.push_str(&o);
            stopped = s;
            if s {
                break;
            }
        }
        if !stopped {
            out.push_str(&m.flush());
        }
        assert_eq!((out, stopped), want, "{text:?} {stops:?}");
    }
}
