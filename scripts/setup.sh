#!/usr/bin/env bash
# Make .venv with deamoe-trt and its test tools. Idempotent: rerunning only updates.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
# torch is pinned to the release this project is tested with; the package itself accepts a range.
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0" -e '.[test]'
# tritonserver for the serving tests (deamoe_trt/integrations/triton/server.py). Only the binary and Python
# backend inside the nvidia-pytriton wheel are used, so it goes in without its dependencies (its
# Python API pins numpy<2); the server's Python runs in .venv/triton-python with numpy 1.x.
# Where either step fails, the serving tests skip and say why.
if .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps "nvidia-pytriton==0.7.0"; then
    .venv/bin/python -m deamoe_trt.integrations.triton.server --setup-python-env ||
        echo "setup.sh: tritonserver's Python environment could not be made; the serving tests will skip" >&2
else
    echo "setup.sh: the nvidia-pytriton wheel did not install; the serving tests will skip" >&2
fi
# TensorRT Edge-LLM's exporter for export-edgellm and its tests (tests/integrations/edgellm). It pins
# transformers 5.14, onnx 1.19 and numpy 2.2, which clash with .venv's, so it gets .venv-edgellm;
# deamoe-trt runs its exporter there as a subprocess with this tree on PYTHONPATH.
if python3 -m venv .venv-edgellm &&
    .venv-edgellm/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0" "tensorrt-edgellm[export]==0.11.0"; then
    :
else
    echo "setup.sh: tensorrt-edgellm did not install; the Edge-LLM export tests will skip" >&2
fi
