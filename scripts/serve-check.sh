#!/usr/bin/env bash
# The serving check on the GPU host (no cargo: binaries from a bundle built here with
# scripts/gpu-bundle): llama-serve on the 1B shape with seeded weights and a test tokenizer, curl,
# the official openai client, the llama-load HTTP load with replay verification, the /metrics
# gauges, a clean SIGTERM exit, then llama-batch-bench with the same load in process; the two
# JSON reports are merged with the GPU, driver, date and commands into $OUT/serve-h100.json.
#
#   BIN=.gpu-bundle/bin OUT=/tmp/serve-check scripts/serve-check.sh
#
# Environment (defaults): BIN (.gpu-bundle/bin), OUT (/tmp/serve-check), PORT (8000), MODEL_DIR
# ($OUT/model-1b; reused when it already holds weights and a tokenizer), MAX_SEQ (1024), CLIENTS
# (64), REQUESTS_PER_CLIENT (2), PROMPT_TOKENS (128), MAX_TOKENS (256), SAMPLED (0.5), CANCEL (0.1),
# SEED (1), PREFILL_CHUNK (256, both servers), HEALTH_S (900: model load, kernel compilation and
# the capture of every bucket), LOAD_S (1200).
# Every step is bounded by `timeout`; every step runs even when an earlier one failed (those that
# need the server are skipped once it is gone); the script prints a summary and exits 1 if any
# check failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
BIN=${BIN:-.gpu-bundle/bin}
OUT=${OUT:-/tmp/serve-check}
PORT=${PORT:-8000}
MODEL_DIR=${MODEL_DIR:-$OUT/model-1b}
PREFILL_CHUNK=${PREFILL_CHUNK:-256}
MAX_SEQ=${MAX_SEQ:-1024}
CLIENTS=${CLIENTS:-64}
RPC=${REQUESTS_PER_CLIENT:-2}
PROMPT_TOKENS=${PROMPT_TOKENS:-128}
MAX_TOKENS=${MAX_TOKENS:-256}
SAMPLED=${SAMPLED:-0.5}
CANCEL=${CANCEL:-0.1}
SEED=${SEED:-1}
HEALTH_S=${HEALTH_S:-900}
LOAD_S=${LOAD_S:-1200}
VOCAB=128256
URL=http://127.0.0.1:$PORT
mkdir -p "$OUT" || exit 2
failed=()
SPID=
# step NAME SECONDS COMMAND...: runs COMMAND bounded by SECONDS with its output in $OUT/NAME.log,
# prints its exit status and records NAME as failed if it is non-zero.
step() {
  local name=$1 secs=$2 rc
  shift 2
  timeout --kill-after=10 "$secs" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  echo "$name: exit $rc"
  if [[ $rc != 0 ]]; then
    failed+=("$name (exit $rc, log $OUT/$name.log)")
  fi
  return $rc
}
alive() { [[ -n $SPID ]] && kill -0 "$SPID" 2>/dev/null; }
cleanup() {
  if alive; then
    kill -KILL "$SPID" 2>/dev/null
  fi
}
trap cleanup EXIT

GPU=$(timeout 30 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
DRIVER=$(timeout 30 nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
echo "gpu: ${GPU:-unknown}, driver ${DRIVER:-unknown}"
[[ -n $GPU ]] || failed+=("nvidia-smi")
for b in llama-serve llama-load llama-batch-bench; do
  [[ -x $BIN/$b ]] || failed+=("missing $BIN/$b")
done

# 1. The model folder (seeded 1B weights + tokenizer), else the server's own seeded mode.
if [[ -f $MODEL_DIR/model.safetensors && -f $MODEL_DIR/tokenizer.json ]]; then
  echo "model: reusing $MODEL_DIR"
  MODEL_ARGS=(--model "$MODEL_DIR")
elif [[ -f scripts/hf_llama_reference.py ]] && timeout 120 python3 -c "import torch, transformers, tokenizers" 2>/dev/null; then
  if step model-write 1200 python3 scripts/hf_llama_reference.py --shape 1b --no-logits --seed 0 --out "$MODEL_DIR"; then
    MODEL_ARGS=(--model "$MODEL_DIR")
  else
    MODEL_ARGS=(--shape 1b --seed 0)
  fi
else
  echo "model: hf_llama_reference.py or torch/transformers unavailable, seeded mode (no tokenizer)"
  MODEL_ARGS=(--shape 1b --seed 0)
fi
SERVE_CMD=("$BIN/llama-serve" "${MODEL_ARGS[@]}" --host 127.0.0.1 --port "$PORT" --slots 64 --max-seq "$MAX_SEQ" --prefill-chunk "$PREFILL_CHUNK" --debug-replay)
echo "serve: ${SERVE_CMD[*]}"

# 2. The server, in the background, until /health answers.
"${SERVE_CMD[@]}" >"$OUT/serve.log" 2>&1 &
SPID=$!
ready=0
for ((i = 0; i < HEALTH_S * 2; i++)); do
  if ! alive; then break; fi
  if timeout 5 curl -sf "$URL/health" >/dev/null 2>&1; then
    ready=1
    break
  fi
  sleep 0.5
done
if [[ $ready == 1 ]]; then
  echo "health: ready after ~$((i / 2)) s"
else
  failed+=("server not healthy within ${HEALTH_S} s (log $OUT/serve.log)")
  tail -20 "$OUT/serve.log"
fi

MODEL_NAME=$(timeout 10 curl -sf "$URL/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])' 2>/dev/null)
MODEL_NAME=${MODEL_NAME:-default}
LOAD_CMD=("$BIN/llama-load" --url "$URL" --model "$MODEL_NAME" --clients "$CLIENTS" --requests-per-client "$RPC"
  --prompt-tokens "$PROMPT_TOKENS" --max-tokens "$MAX_TOKENS" --sampled-fraction "$SAMPLED" --cancel-fraction "$CANCEL"
  --seed "$SEED" --vocab "$VOCAB" --verify --json "$OUT/load-http.json" --timeout-s 600)
OPENAI_RESULT="not run"
if [[ $ready == 1 ]]; then
  # 3. curl: a streamed completion and a streamed chat, saved.
  # sse_ok NAME FILE: the stream ended with data: [DONE] and carried no error object.
  sse_ok() {
    if tail -c 200 "$2" | grep -q 'data: \[DONE\]' && ! grep -q '"error"' "$2"; then
      echo "$1: ok ($(grep -c '^data: ' "$2") events)"
    else
      echo "$1: FAILED"
      failed+=("$1 (see $2)")
    fi
  }
  timeout 120 curl -sS -N "$URL/v1/completions" -H 'content-type: application/json' -d "{\"model\": \"$MODEL_NAME\",
    \"prompt\": \"The kernel launches a graph on the stream\", \"max_tokens\": 32, \"stream\": true,
    \"stream_options\": {\"include_usage\": true}, \"return_token_ids\": true}" >"$OUT/curl-completion.txt" 2>&1
  sse_ok curl-completion "$OUT/curl-completion.txt"
  timeout 120 curl -sS -N "$URL/v1/chat/completions" -H 'content-type: application/json' -d "{\"model\": \"$MODEL_NAME\",
    \"messages\": [{\"role\": \"user\", \"content\": \"Say something about memory pools.\"}], \"max_tokens\": 32,
    \"stream\": true, \"stream_options\": {\"include_usage\": true}}" >"$OUT/curl-chat.txt" 2>&1
  sse_ok curl-chat "$OUT/curl-chat.txt"

  # 4. The official openai client, from the carried wheels when present.
  PYPATH=${PYTHONPATH:-}
  if compgen -G ".whl/*.whl" >/dev/null; then
    step wheels-install 300 python3 -m pip install --quiet --no-index --no-deps --target /tmp/site .whl/*.whl &&
      PYPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  PYTHONPATH=$PYPATH step openai-check 600 python3 scripts/openai_check.py "$URL" --model "$MODEL_NAME"
  OPENAI_RESULT=$(tail -1 "$OUT/openai-check.log")
  grep -E "^(FAIL|[0-9]+ passed)" "$OUT/openai-check.log"

  # 5. The load, with replay verification.
  echo "load: ${LOAD_CMD[*]}"
  step load-http "$LOAD_S" "${LOAD_CMD[@]}"
  grep -vE "^llama-load: request error" "$OUT/load-http.log" | tail -8

  # 6. The gauges after the load.
  timeout 10 curl -sS "$URL/metrics" >"$OUT/metrics.txt" 2>&1 || failed+=("GET /metrics")
  grep -iE "running|queue|waiting|kv" "$OUT/metrics.txt" | grep -v '^#' | head -12
fi

# 7. SIGTERM: the server must exit 0 within 60 s.
if alive; then
  kill -TERM "$SPID"
  for ((i = 0; i < 120; i++)); do
    alive || break
    sleep 0.5
  done
  if alive; then
    failed+=("llama-serve still running 60 s after SIGTERM")
    kill -KILL "$SPID"
  fi
  wait "$SPID"
  rc=$?
  echo "sigterm: server exit $rc"
  [[ $rc == 0 ]] || failed+=("llama-serve exited $rc after SIGTERM (log $OUT/serve.log)")
else
  wait "$SPID" 2>/dev/null
  failed+=("llama-serve was not running at the end (exit $?, log $OUT/serve.log)")
fi
SPID=

# 8. The same load in process.
# llama-batch-bench takes the same model (--model DIR, or the seeded shape with --model-seed: its
# --seed seeds the load).
BATCH_MODEL_ARGS=("${MODEL_ARGS[@]}")
if [[ ${MODEL_ARGS[0]} == --shape ]]; then BATCH_MODEL_ARGS=(--shape "${MODEL_ARGS[1]}" --model-seed "${MODEL_ARGS[3]}"); fi
BATCH_CMD=("$BIN/llama-batch-bench" "${BATCH_MODEL_ARGS[@]}" --slots 64 --max-seq "$MAX_SEQ" --prefill-chunk "$PREFILL_CHUNK" --clients "$CLIENTS"
  --requests-per-client "$RPC" --prompt-tokens "$PROMPT_TOKENS" --max-tokens "$MAX_TOKENS" --sampled-fraction "$SAMPLED"
  --cancel-fraction "$CANCEL" --seed "$SEED" --verify --json "$OUT/load-inprocess.json")
echo "batch-bench: ${BATCH_CMD[*]}"
step batch-bench "$LOAD_S" "${BATCH_CMD[@]}"
tail -8 "$OUT/batch-bench.log"

# 9. The merged report.
export GPU DRIVER OUT OPENAI_RESULT
export SERVE_LINE="${SERVE_CMD[*]}" LOAD_LINE="${LOAD_CMD[*]}" BATCH_LINE="${BATCH_CMD[*]}"
export FAILED_LINES="$(printf '%s\n' "${failed[@]}")"
timeout 60 python3 - <<'PY' || failed+=("merging the JSON reports")
import datetime, json, os
out = os.environ["OUT"]
def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
report = {
    "benchmark": "serve",
    "gpu": os.environ.get("GPU") or None,
    "driver": os.environ.get("DRIVER") or None,
    "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "commands": {"serve": os.environ["SERVE_LINE"], "load": os.environ["LOAD_LINE"],
                 "batch_bench": os.environ["BATCH_LINE"]},
    "openai_check": os.environ.get("OPENAI_RESULT") or None,
    "failed_checks": [l for l in os.environ.get("FAILED_LINES", "").splitlines() if l],
    "http": load("load-http.json"),
    "inprocess": load("load-inprocess.json"),
}
with open(os.path.join(out, "serve-h100.json"), "w") as f:
    json.dump(report, f, indent=2)
    f.write("\n")
h, p = report["http"], report["inprocess"]
if h and p and p.get("tokens_per_s"):
    print(f"throughput http {h['tokens_per_s']:.0f} tokens/s, in-process {p['tokens_per_s']:.0f} tokens/s, "
          f"ratio {h['tokens_per_s'] / p['tokens_per_s']:.3f}")
print("wrote", os.path.join(out, "serve-h100.json"))
PY

echo "== serve-check summary (logs and JSON in $OUT)"
if ((${#failed[@]})); then
  printf 'FAILED: %s\n' "${failed[@]}"
  exit 1
fi
echo "all serve checks passed"
