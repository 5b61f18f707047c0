#!/usr/bin/env bash
# Creates .venv with the Python packages the tests use as independent references
# (gguf's dequantization, Hugging Face tokenizers, safetensors, NumPy).
set -euo pipefail
cd "$(dirname "$0")/.."
stamp=.venv/.ridgeserve-requirements
if [ -f "$stamp" ] && cmp -s "$stamp" scripts/requirements.txt; then
  exit 0
fi
python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -r scripts/requirements.txt
cp scripts/requirements.txt "$stamp"
