"""What the RidgeFill test scripts share: where the binaries and the model are, named checks
that are collected instead of stopping at the first, running a tool for its JSON, and the
calibration inputs (KJV text, the tiny test model, small maps for the default model)."""

import json
import os
import subprocess
import sys

SOURCE_DIR = os.environ.get(
    "RIDGESERVE_SOURCE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
)
BIN = os.environ.get("RIDGESERVE_BIN", os.path.join(SOURCE_DIR, "build", "bin"))
MODEL = os.environ.get(
    "RIDGESERVE_DEFAULT_MODEL",
    os.path.join(SOURCE_DIR, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"),
)

failures = []


def expect(ok, what):
    print(("  ok   " if ok else "  FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def finish():
    """Exit status of the script: 1 when any check failed."""
    for f in failures:
        print("failed: " + f)
    print("PASS" if not failures else f"FAILED ({len(failures)} checks)")
    return 1 if failures else 0


def run(args):
    """Runs a tool that must succeed; returns its stdout."""
    print("$ " + " ".join(args), flush=True)
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"command failed with {done.returncode}: {args[:2]}")
    return done.stdout


def last_json(stdout):
    """The tool's JSON object: its last line of stdout."""
    return json.loads(stdout.strip().splitlines()[-1])


def kjv_text(max_bytes):
    """The KJV from the `bible` tool (scripts/install_deps.sh), first max_bytes bytes."""
    proc = subprocess.run(
        ["bible", "-p", "/usr/lib", "gen1:1-rev22:21"], capture_output=True, timeout=300
    )
    if proc.returncode != 0 or len(proc.stdout) < max_bytes:
        raise RuntimeError(f"bible failed ({proc.returncode}): {proc.stderr[:300]!r}")
    return proc.stdout[:max_bytes].decode("utf-8", errors="ignore")


def tiny_llama3_with_text(tmp, text_bytes=12000):
    """tests/reference's tiny_llama3 written under tmp/models, and the first text_bytes of the
    KJV as its calibration text: (the written model, the text's path, its token ids)."""
    sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "reference"))
    import tiny_models
    from tokenizers import Tokenizer

    spec = next(s for s in tiny_models.SPECS if s.name == "tiny_llama3")
    written = tiny_models.write_model(spec, os.path.join(tmp, "models"))
    text = kjv_text(text_bytes)
    text_path = os.path.join(tmp, "tiny.txt")
    with open(text_path, "w") as f:
        f.write(text)
    ids = Tokenizer.from_file(os.path.join(written.hf_dir, "tokenizer.json")).encode(text).ids
    return written, text_path, ids


def calibrate_genesis_maps(tmp, splits, max_tokens=2048):
    """Small maps for the default model from Genesis 1-10 (quick; for tests, not quality)."""
    kjv = os.path.join(tmp, "kjv.txt")
    with open(kjv, "w") as f:
        subprocess.run(["bible", "-p", "/usr/lib", "gen1:1-gen10:32"], stdout=f, check=True)
    maps = os.path.join(tmp, "maps.rfmap")
    subprocess.run([os.path.join(BIN, "ridgeserve-calibrate"), "--model", MODEL, "--text", kjv,
                    "--split_layers", ",".join(map(str, splits)), "--out", maps,
                    "--max_tokens", str(max_tokens), "--window", "1024"], check=True,
                   capture_output=True)
    return maps
