"""Shared bits of the format checks: run formats_tensor_dump and collect failures."""

import json
import os
import subprocess
import sys

import numpy as np

BIN = os.environ.get("RIDGESERVE_BIN", os.path.join(os.getcwd(), "build", "bin"))
DUMP = os.path.join(BIN, "formats_tensor_dump")


def dump(path, out_dir=None, tensors=(), keys=()):
    """Runs formats_tensor_dump on `path`; returns its JSON (errors come back as {"error"})."""
    args = [DUMP, str(path)]
    if out_dir is not None:
        args += ["--out", str(out_dir)]
    for name in tensors:
        args += ["--tensor", name]
    for key in keys:
        args += ["--key", key]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    if proc.returncode not in (0, 2):
        raise RuntimeError(f"{args} exited {proc.returncode}: {proc.stderr}")
    return json.loads(proc.stdout)


def read_f32(out_dir, entry):
    """The f32 values formats_tensor_dump wrote for one tensor entry, in its shape."""
    values = np.fromfile(os.path.join(out_dir, entry["file"]), dtype="<f4")
    return values.reshape(entry["shape"])


class Checker:
    """Counts checks; each failure is printed, and finish() exits nonzero if any failed."""

    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, condition, what):
        if condition:
            self.passed += 1
        else:
            self.failed += 1
            print(f"FAIL: {what}", flush=True)
        return condition

    def finish(self):
        print(f"{self.passed} checks passed, {self.failed} failed")
        sys.exit(1 if self.failed else 0)
