"""What the RidgeFill test scripts share: where the binaries and the model are, named checks
that are collected instead of stopping at the first, and running a tool for its JSON."""

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
