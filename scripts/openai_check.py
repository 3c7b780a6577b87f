#!/usr/bin/env python3
"""Checks an OpenAI-compatible server (`llama-serve`) with the official `openai` Python client.

    python3 scripts/openai_check.py http://127.0.0.1:8000 [--model NAME] [--timeout 120]

Checks, one line each (`PASS name` or `FAIL name: why`), then `N passed, M failed`; exit 1 on any
failure:

- the model list names a model (used for the rest unless `--model` is given);
- completions and chat completions, streamed and not, return text;
- a greedy request's streamed text equals its non-streamed text (completions and chat);
- a sampled request (temperature 0.8, top_p 0.95) with the same seed gives the same text twice;
- `stream_options={"include_usage": True}` ends the stream with a usage chunk (no choices,
  `completion_tokens` = the tokens streamed where `return_token_ids` gives them);
- `stop`: a stop string taken from the middle of a greedy text cuts it there, `finish_reason` "stop";
- bad requests (temperature -1, n=2, an unknown field through `extra_body`) raise
  `openai.BadRequestError`.

Only loopback URLs are accepted. On the GPU host the client comes from the wheels that
`scripts/fetch-wheels.sh` downloads (installed into /tmp/site by `scripts/serve-check.sh`).
"""
import argparse
import ipaddress
import sys
import urllib.parse

import openai

PROMPT = "The kernel launches a graph on the stream and the server"
MESSAGES = [{"role": "system", "content": "You are a test."},
            {"role": "user", "content": "Tell me about the device memory pool."}]


def loopback(url):
    host = urllib.parse.urlparse(url).hostname or ""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def run(self, name, fn):
        try:
            why = fn()
        except Exception as e:  # noqa: BLE001 - any exception is a failed check
            why = f"{type(e).__name__}: {e}"
        if why:
            self.failed += 1
            print(f"FAIL {name}: {why}", flush=True)
        else:
            self.passed += 1
            print(f"PASS {name}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base_url")
    ap.add_argument("--model")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--max-tokens", type=int, default=24)
    a = ap.parse_args()
    if not loopback(a.base_url):
        sys.exit(f"{a.base_url}: only loopback URLs (127.0.0.0/8, [::1], localhost) are accepted")
    base = a.base_url.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    client = openai.OpenAI(base_url=base, api_key="unused", timeout=a.timeout, max_retries=0)
    c = Checks()
    n = a.max_tokens
    state = {"model": a.model}

    def models():
        ids = [m.id for m in client.models.list().data]
        if not ids:
            return "no model listed"
        state["model"] = state["model"] or ids[0]
        return None

    c.run("models list", models)
    model = state["model"] or "default"

    def completion(**kw):
        return client.completions.create(model=model, prompt=PROMPT, max_tokens=n, **kw)

    def streamed_completion(**kw):
        text, finish = "", None
        for ch in completion(stream=True, **kw):
            for choice in ch.choices:
                text += choice.text or ""
                finish = choice.finish_reason or finish
        return text, finish

    def chat(**kw):
        return client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=n, **kw)

    def streamed_chat(**kw):
        text = ""
        for ch in chat(stream=True, **kw):
            for choice in ch.choices:
                text += choice.delta.content or ""
        return text

    greedy = {}

    def completion_plain():
        r = completion(temperature=0)
        greedy["completion"] = r.choices[0].text
        if not r.choices[0].text:
            return "empty text"
        if r.usage is None or r.usage.completion_tokens <= 0:
            return f"usage {r.usage}"
        if r.choices[0].finish_reason not in ("stop", "length"):
            return f"finish_reason {r.choices[0].finish_reason!r}"
        return None

    def completion_stream_equal():
        text, finish = streamed_completion(temperature=0)
        want = greedy.get("completion")
        if want is None:
            want = completion(temperature=0).choices[0].text
        if text != want:
            return f"streamed {text!r} != non-streamed {want!r}"
        return None if finish in ("stop", "length") else f"finish_reason {finish!r}"

    def chat_plain():
        r = chat(temperature=0)
        greedy["chat"] = r.choices[0].message.content
        if not r.choices[0].message.content or r.choices[0].message.role != "assistant":
            return f"message {r.choices[0].message}"
        return None

    def chat_stream_equal():
        text = streamed_chat(temperature=0)
        want = greedy.get("chat")
        if want is None:
            want = chat(temperature=0).choices[0].message.content
        return None if text == want else f"streamed {text!r} != non-streamed {want!r}"

    def same_seed():
        kw = dict(temperature=0.8, top_p=0.95, seed=1234)
        x, y = completion(**kw).choices[0].text, completion(**kw).choices[0].text
        sx, _ = streamed_completion(**kw)
        if x != y:
            return f"seed 1234 gave {x!r} then {y!r}"
        return None if sx == x else f"streamed with the same seed {sx!r} != {x!r}"

    def same_seed_chat():
        kw = dict(temperature=0.8, top_p=0.95, seed=99)
        x, y = chat(**kw).choices[0].message.content, chat(**kw).choices[0].message.content
        return None if x == y else f"seed 99 gave {x!r} then {y!r}"

    def usage_chunk():
        chunks = list(completion(temperature=0, stream=True, stream_options={"include_usage": True},
                                 extra_body={"return_token_ids": True}))
        last = chunks[-1]
        if last.usage is None or last.choices:
            return f"the last chunk is not a usage chunk: {last}"
        ids = []
        for ch in chunks:
            for choice in ch.choices:
                ids += getattr(choice, "token_ids", None) or (choice.model_extra or {}).get("token_ids") or []
        if last.usage.completion_tokens <= 0:
            return f"usage {last.usage}"
        if ids and len(ids) != last.usage.completion_tokens:
            return f"{len(ids)} token ids streamed, usage says {last.usage.completion_tokens}"
        if any(ch.usage is not None for ch in chunks[:-1]):
            return "usage in a chunk before the last"
        return None

    def usage_chunk_chat():
        chunks = list(chat(temperature=0, stream=True, stream_options={"include_usage": True}))
        last = chunks[-1]
        if last.usage is None or last.choices or last.usage.completion_tokens <= 0:
            return f"the last chunk is not a usage chunk: {last}"
        return None

    def stop():
        full = greedy.get("completion") or completion(temperature=0).choices[0].text
        if len(full) < 4:
            return f"the greedy text {full!r} is too short to cut"
        i = len(full) // 2
        s = full[i:i + 2]
        want = full[:full.find(s)]
        r = completion(temperature=0, stop=[s])
        got, finish = r.choices[0].text, r.choices[0].finish_reason
        if got != want or finish != "stop":
            return f"stop={s!r}: got {got!r} ({finish}), want {want!r} (stop)"
        st, sfinish = streamed_completion(temperature=0, stop=[s])
        if st != want or sfinish != "stop":
            return f"streamed stop={s!r}: got {st!r} ({sfinish}), want {want!r} (stop)"
        return None

    def bad(**kw):
        def check():
            try:
                completion(**kw)
            except openai.BadRequestError:
                return None
            return f"{kw} did not raise BadRequestError"
        return check

    c.run("completion", completion_plain)
    c.run("completion streamed == non-streamed (greedy)", completion_stream_equal)
    c.run("chat", chat_plain)
    c.run("chat streamed == non-streamed (greedy)", chat_stream_equal)
    c.run("completion same seed, same text (sampled)", same_seed)
    c.run("chat same seed, same text (sampled)", same_seed_chat)
    c.run("completion stream_options.include_usage", usage_chunk)
    c.run("chat stream_options.include_usage", usage_chunk_chat)
    c.run("stop", stop)
    c.run("bad request: temperature -1", bad(temperature=-1))
    c.run("bad request: n=2", bad(n=2))
    c.run("bad request: unknown field", bad(extra_body={"no_such_field": 1}))
    print(f"{c.passed} passed, {c.failed} failed")
    sys.exit(1 if c.failed else 0)


if __name__ == "__main__":
    main()
