#!/usr/bin/env bash
# Make .venv with deamoe-trt and its test tools. Idempotent: rerunning only updates.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
# torch is pinned to the release this project is tested with; the package itself accepts a range.
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0" -e '.[test]'
