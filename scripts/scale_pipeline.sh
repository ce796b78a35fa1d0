#!/usr/bin/env bash
# The whole pipeline on a synthetic checkpoint of a real model, each step timed:
#   [FROM=STEP] [UNTIL=STEP] [CALIBRATION_TOKENS=N] [SHARD_GB=X] [EXTERNAL_DATA_THRESHOLD=BYTES] \
#     scripts/scale_pipeline.sh CONFIG LAYERS DIR
# e.g. scripts/scale_pipeline.sh olmoe-1b-7b 4 /tmp/scale. Writes DIR/steps.tsv (step, wall s,
# peak RSS KB, bytes written, command) and each step's log; DIR needs the checkpoint's size
# about four times over (source, import, converted, int4 and its export).
# Steps: synth import-hf convert quantize export-lm generate-ort generate-cpu. FROM=STEP starts
# at STEP on the outputs already in DIR (steps.tsv keeps the earlier steps' rows); UNTIL=STEP
# stops after STEP. CALIBRATION_TOKENS (default 12000): random token ids convert fits on.
# SHARD_GB (synth's --shard-gb, default 5) and EXTERNAL_DATA_THRESHOLD (export-lm's
# --external-data-threshold, default 2 GiB less 64 MiB) lower the sizes at which the checkpoint
# is sharded and the export's weights leave the graph, so that a small model takes those paths.
set -euo pipefail
config=$1 layers=$2 dir=$3
py=${PYTHON:-python}
steps=(synth import-hf convert quantize export-lm generate-ort generate-cpu)
index() {  # index STEP: its position in steps, or a one-line error
  local i
  for i in "${!steps[@]}"; do [ "${steps[$i]}" = "$1" ] && { echo "$i"; return; }; done
  echo "scale_pipeline.sh: unknown step '$1'; the steps are ${steps[*]}" >&2
  exit 2
}
from=$(index "${FROM:-synth}")
until=$(index "${UNTIL:-generate-cpu}")
mkdir -p "$dir"
tsv=$dir/steps.tsv
if [ "$from" = 0 ]; then
  printf 'step\twall_s\tpeak_rss_kb\tbytes\tcommand\n' >"$tsv"
else
  [ -f "$tsv" ] || { echo "scale_pipeline.sh: FROM=${FROM} needs $tsv from an earlier run" >&2; exit 2; }
  # Keep the header and the rows of the steps before FROM.
  keep=$(printf '%s\n' "${steps[@]:0:$from}")
  awk -F'\t' -v keep="$keep" 'BEGIN {n = split(keep, k, "\n"); for (i = 1; i <= n; i++) s[k[i]] = 1} NR == 1 || ($1 in s)' \
    "$tsv" >"$tsv.tmp" && mv "$tsv.tmp" "$tsv"
fi
runs() {  # runs STEP: whether STEP lies between FROM and UNTIL
  local i
  i=$(index "$1")
  [ "$i" -ge "$from" ] && [ "$i" -le "$until" ]
}
step() {  # step NAME OUTPUT CMD...
  local name=$1 out=$2
  shift 2
  runs "$name" || return 0
  /usr/bin/time -v -o "$dir/$name.time" "$@" >"$dir/$name.log" 2>&1 || { cat "$dir/$name.log" >&2; exit 1; }
  local wall rss bytes
  wall=$(awk -F': ' '/Elapsed/ {n = split($2, t, ":"); s = 0; for (i = 1; i <= n; i++) s = s * 60 + t[i]; print s}' "$dir/$name.time")
  rss=$(awk -F': ' '/Maximum resident/ {print $2}' "$dir/$name.time")
  # An ONNX file's external data (OUTPUT.data) counts as written too.
  bytes=$( [ -e "$out" ] && du -scb "$out" $( [ -e "$out.data" ] && echo "$out.data") | tail -1 | cut -f1 || echo 0)
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$wall" "$rss" "$bytes" "$*" >>"$tsv"
  echo "$name: ${wall}s, peak RSS ${rss} KB, ${bytes} B" >&2
}
dt=deamoe_trt
step synth "$dir/hf" $py -m $dt.bench.synth --config "$config" --layers "$layers" -o "$dir/hf" \
  ${SHARD_GB:+--shard-gb "$SHARD_GB"}
step import-hf "$dir/lm" $py -m $dt import-hf "$dir/hf" -o "$dir/lm"
if runs convert; then
  # Random token ids over the vocabulary as calibration: the synthetic tokenizer's words are not English.
  $py - "$dir/lm" "$dir/ids.safetensors" "${CALIBRATION_TOKENS:-12000}" <<'PY'
import json, sys, torch
from safetensors.torch import save_file
vocab = json.load(open(f"{sys.argv[1]}/config.json"))["config"]["vocab_size"]
n = int(sys.argv[3])
save_file({"input_ids": torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(0))}, sys.argv[2])
PY
fi
step convert "$dir/conv" $py -m $dt convert "$dir/lm" -o "$dir/conv" --departments 8 --shared-fraction 0.25 \
  --top-departments 4 --no-compare --calibration "$dir/ids.safetensors"
# Streamed (tensor by tensor from disk): --no-compare skips the whole-model measurements.
step quantize "$dir/q4" $py -m $dt quantize "$dir/conv" -o "$dir/q4" --bits 4 --no-compare
step export-lm "$dir/q4.onnx" $py -m $dt export-lm "$dir/q4" -o "$dir/q4.onnx" --form ort \
  ${EXTERNAL_DATA_THRESHOLD:+--external-data-threshold "$EXTERNAL_DATA_THRESHOLD"}
prompt="w100 w2000 w31 w4000 w5 w600 w7000 w8"
# The export above, run as it is: the process holds the model once, in ONNX Runtime.
step generate-ort "" $py -m $dt generate "$dir/q4" --prompt "$prompt" --max-new-tokens 16 --runtime ort \
  --onnx "$dir/q4.onnx"
step generate-cpu "" $py -m $dt generate "$dir/q4" --prompt "$prompt" --max-new-tokens 16 --runtime cpu
