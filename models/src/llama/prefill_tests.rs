//! CPU tests of the prefill's host side: the bucket choice, the checks and the chunk layout.

use super::*;

fn opts() -> ModelOptions {
    ModelOptions { slots: 4, max_seq: 32, prefill_buckets: vec![4, 8, 16], ..Default::default() }
}

fn piece(slot: u32, start: u32, tokens: &[u32], want_next: bool) -> PrefillSeq<'_> {
    PrefillSeq { slot, start, tokens, want_next }
}

const VOCAB: usize = 100;

fn refused(seqs: &[PrefillSeq<'_>], filled: &[u32], bucket: Option<usize>, needle: &str) {
    let e = plan(seqs, None, &opts(), filled, VOCAB, bucket).expect_err(needle).to_string();
    assert!(e.contains(needle), "{e:?} does not mention {needle:?}");
    assert!(e.contains("LlamaModel::prefill"), "{e}");
}

#[test]
fn bucket_is_the_smallest_holding_the_tokens() {
    let b = [4, 8, 16];
    assert_eq!(bucket_for(&b, 1).unwrap(), 4);
    assert_eq!(bucket_for(&b, 4).unwrap(), 4);
    assert_eq!(bucket_for(&b, 5).unwrap(), 8);
    assert_eq!(bucket_for(&b, 16).unwrap(), 16);
    let e = bucket_for(&b, 17).unwrap_err().to_string();
    assert!(e.contains("17 tokens") && e.contains("(16)"), "{e}");
    assert!(bucket_for(&[], 1).is_err());
}

#[test]
fn default_prefill_buckets() {
    assert_eq!(ModelOptions::default().prefill_buckets, [16, 32, 64, 128, 256, 512]);
}

#[test]
fn packed_pieces_are_laid_out_one_after_another() {
    let filled = [0, 3, 0, 0];
    let (a, b) = ([7u32, 8, 9], [1u32, 2]);
    let p =
        plan(&[piece(1, 3, &a, true), piece(2, 0, &b, false)], None, &opts(), &filled, VOCAB, None).unwrap();
    assert_eq!(p.chunk, 8);
    assert_eq!(p.wanted, 1);
    let want: Vec<(u32, u32, u32)> = vec![
        (7, 1, 3),
        (8, 1, 4),
        (9, 1, 5),
        (1, 2, 0),
        (2, 2, 1),
        (0, INACTIVE, 0),
        (0, INACTIVE, 0),
        (0, INACTIVE, 0),
    ];
    assert_eq!(p.rows, want);
    // Logit rows: min(8, 4 slots) = 4, the wanted piece's last row, the rest inactive.
    assert_eq!(p.logit_idx, [2, INACTIVE, INACTIVE, INACTIVE]);
    // The second piece wants its token too: its last row is 4.
    let p =
        plan(&[piece(1, 3, &a, true), piece(2, 0, &b, true)], None, &opts(), &filled, VOCAB, None).unwrap();
    assert_eq!(p.logit_idx, [2, 4, INACTIVE, INACTIVE]);
    assert_eq!(p.wanted, 2);
}

#[test]
fn given_bucket_must_be_configured_and_large_enough() {
    let filled = [0; 4];
    let t = [1u32; 5];
    assert_eq!(plan(&[piece(0, 0, &t, true)], None, &opts(), &filled, VOCAB, Some(16)).unwrap().chunk, 16);
    assert_eq!(
        plan(&[piece(0, 0, &t, true)], None, &opts(), &filled, VOCAB, Some(16)).unwrap().rows.len(),
        16
    );
    refused(&[piece(0, 0, &t, true)], &filled, Some(4), "not a configured prefill bucket");
    refused(&[piece(0, 0, &t, true)], &filled, Some(12), "not a configured prefill bucket");
}

#[test]
fn every_rule_is_refused_naming_the_problem() {
    let filled = [0, 2, 0, 0];
    let t = [1u32, 2];
    refused(&[], &filled, None, "at least one piece");
    refused(&[piece(0, 0, &[], true)], &filled, None, "has no tokens");
    refused(&[piece(4, 0, &t, true)], &filled, None, "slot 4 out of range");
    refused(&[piece(0, 0, &t, true), piece(0, 2, &t, false)], &filled, None, "appears in two pieces");
    refused(&[piece(1, 0, &t, true)], &filled, None, "must start there");
    refused(&[piece(1, 3, &t, true)], &filled, None, "must start there");
    refused(&[piece(0, 1, &t, true)], &filled, None, "must start there");
    refused(&[piece(0, 0, &[1; 33], true)], &filled, None, "do not fit 32 positions");
    refused(&[piece(0, 0, &[1, 100], true)], &filled, None, "token 100");
    refused(&[piece(0, 0, &[1; 17], true)], &filled, None, "exceed the largest prefill bucket");
    // The position limit counts from the start: 2 + 31 > 32.
    refused(&[piece(1, 2, &[1; 31], true)], &filled, None, "do not fit");
    assert!(plan(&[piece(1, 2, &[1; 16], true)], None, &opts(), &filled, VOCAB, None).is_ok());
}

#[test]
fn logit_rows_are_limited_by_slots_and_chunk() {
    assert_eq!(logit_rows(16, 4), 4);
    assert_eq!(logit_rows(4, 64), 4);
    // Four one-token pieces in bucket 4 of a model with 8 slots: 4 logit rows, all wanted.
    let o = ModelOptions { slots: 8, ..opts() };
    let t = [3u32];
    let seqs: Vec<_> = (0..4).map(|s| piece(s, 0, &t, true)).collect();
    let p = plan(&seqs, None, &o, &[0; 8], VOCAB, None).unwrap();
    assert_eq!((p.chunk, p.wanted), (4, 4));
    assert_eq!(p.logit_idx, [0, 1, 2, 3]);
}

#[test]
fn estimate_grows_with_the_chunk() {
    let c = LlamaConfig::small();
    let a = estimate_bytes(&c, 16, 4);
    let b = estimate_bytes(&c, 32, 4);
    assert!(b > a && a > 16 * c.hidden * 2);
    assert_eq!(estimate_bytes(&c, usize::MAX, usize::MAX), usize::MAX);
}

#[test]
fn sampling_parameters_follow_the_wanted_pieces() {
    let filled = [0, 3, 0, 0];
    let (a, b, c) = ([7u32, 8], [9u32, 10, 11], [12u32]);
    let hot = Sampling { temperature: 0.8, top_p: 0.9, top_k: 5, seed: 77 };
    let warm = Sampling { temperature: 0.5, top_p: 1.0, top_k: 0, seed: 78 };
    let seqs = [piece(1, 3, &a, true), piece(2, 0, &b, false), piece(0, 0, &c, true)];
    let p = plan(&seqs, Some(&[hot, hot, warm]), &opts(), &filled, VOCAB, None).unwrap();
    // Wanted pieces in order; the counter is the position of the piece's last token (3 + 1 and 0),
    // as a decode step at that position would use; the rest of the logit rows stay greedy.
    assert_eq!(p.params[0], hot.params(4));
    assert_eq!(p.params[1], warm.params(0));
    assert!(p.params[2..].iter().all(|x| *x == SampleParams::GREEDY));
    assert_eq!(p.params.len(), p.logit_idx.len());
    // Without sampling every logit row is greedy.
    let g = plan(&seqs, None, &opts(), &filled, VOCAB, None).unwrap();
    assert!(g.params.iter().all(|x| *x == SampleParams::GREEDY));
    // One setting per piece, each valid.
    let e = plan(&seqs, Some(&[hot]), &opts(), &filled, VOCAB, None).unwrap_err().to_string();
    assert!(e.contains("1 sampling parameters for 3 pieces"), "{e}");
    let bad = Sampling { top_p: 0.0, ..hot };
    let e = plan(&seqs, Some(&[hot, bad, hot]), &opts(), &filled, VOCAB, None).unwrap_err().to_string();
    assert!(e.contains("piece 1"), "{e}");
}
