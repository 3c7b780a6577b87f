#!/usr/bin/env python3
"""Writes a small Hugging Face tokenizer (byte-level BPE) and its chat template, with no download.

    python3 scripts/make_test_tokenizer.py --out DIR [--vocab 2048]

Writes ``DIR/tokenizer.json`` (the `tokenizers` format) and ``DIR/tokenizer_config.json`` (special
tokens and a Llama 3 style chat template, the format Hugging Face uses). The tokenizer is trained
with the `tokenizers` package on a corpus generated here from a fixed seed: English-like sentences
over a fixed word list plus words with multi-byte UTF-8 characters (accents, CJK, emoji), so that
tokens that end in the middle of a character exist and incremental detokenisation has something
to get wrong. The vocabulary has exactly ``--vocab`` entries (default 2048, the vocabulary of
``LlamaConfig::small()``): the five special tokens take ids 0..4, so every id below ``--vocab`` has
a token.

The committed fixture ``server/fixtures/test-tokenizer/`` was written by this script (vocab 2048);
``scripts/hf_llama_reference.py --out DIR`` calls it to put a tokenizer next to seeded weights.
"""
import argparse
import json
import os
import random

SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

WORDS = (
    "the of and to in is was for on that with as by at from his her they this which be or an are had "
    "not but have one were all their there been has when who will more no if out so said what up its "
    "about into than them can only other new some could time these two may then do first any my now "
    "such like our over man me even most made after also did many before must through back years where "
    "much your way well down should because each just those people how too little state good very make "
    "world still own see men work long get here between both life being under never day same another "
    "know while last might us great old year off come since against go came right used take three "
    "graph stream kernel device memory buffer token model decode prefill cache tensor layer attention "
    "rust async await future task thread engine replay capture launch event pool server client request"
).split()
UNICODE = ["café", "naïve", "über", "façade", "déjà", "日本語", "東京", "中文", "한국어", "Ωmega", "π≈3.14",
           "emoji🙂", "🚀launch", "ñandú", "Zürich", "Ærø", "добрый", "день", "γειά", "σου"]


def corpus(seed=2026, lines=6000):
    r = random.Random(seed)
    out = []
    for _ in range(lines):
        n = r.randint(4, 18)
        words = [r.choice(UNICODE) if r.random() < 0.08 else r.choice(WORDS) for _ in range(n)]
        s = " ".join(words)
        s = s[0].upper() + s[1:] + r.choice([".", ".", ".", "?", "!", ",", ":"])
        if r.random() < 0.1:
            s += " " + str(r.randint(0, 99999))
        out.append(s)
    return out


CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


def build(vocab):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    n = tok.get_vocab_size()
    if n < vocab:  # a small corpus can run out of merges: fill with added tokens so every id has one
        tok.add_tokens([f"<|filler_{i}|>" for i in range(vocab - n)])
    assert tok.get_vocab_size() == vocab, (tok.get_vocab_size(), vocab)
    return tok


def write(out, vocab=2048):
    os.makedirs(out, exist_ok=True)
    tok = build(vocab)
    tok.save(os.path.join(out, "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
        "model_max_length": 131072,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
        f.write("\n")
    return tok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab", type=int, default=2048)
    a = ap.parse_args()
    tok = write(a.out, a.vocab)
    enc = tok.encode("The café serves 日本語 emoji🙂 tokens.")
    print(f"wrote {a.out}: vocab {tok.get_vocab_size()}, sample ids {enc.ids[:12]}")


if __name__ == "__main__":
    main()
