"""ridgeserve-eval's RidgeFill quality commands `needle` and `distant-loss`, small and fast.

Calibrates split-14 maps on ~2K KJV tokens, then on the GPL-3 (a different text):
  1. with --exact_tail_tokens >= the prompt (no filled rows) RidgeFill's numbers equal exact's
     exactly (needle accuracies, distant-loss NLLs), and exact retrieval finds the needle;
  2. with a real filled prefix, distant-loss JSON has the documented shape and RidgeFill's NLL
     differs from exact's (the fill path really ran).
Exits nonzero on failure.
"""

import json
import math
import os
import sys
import tempfile

sys.dont_write_bytecode = True
from rf_testlib import (BIN, MODEL, calibrate_genesis_maps, expect, finish,  # noqa: E402
                        last_json, run)

TEXT = "/usr/share/common-licenses/GPL-3"
SPLIT = 14
LENGTH = 512

def main():
    with tempfile.TemporaryDirectory() as tmp:
        maps = calibrate_genesis_maps(tmp, [SPLIT])
        evalbin = os.path.join(BIN, "ridgeserve-eval")
        common = ["--model", MODEL, "--maps", maps, "--split_layer", str(SPLIT)]

        n = last_json(run([evalbin, "needle", *common, "--haystack", TEXT, "--lengths", str(LENGTH),
                 "--depths", "0.5", "--trials", "2", "--exact_tail_tokens", str(LENGTH)]))
        print(json.dumps(n)[:600])
        res = n["results"]
        expect(len(res) == 1 and res[0]["prompt_tokens"] == LENGTH and res[0]["depth"] == 0.5
               and res[0]["split_layer"] == SPLIT and res[0]["trials"] == 2,
               "needle: one result with prompt_tokens, depth, split_layer, trials")
        expect(all(k in res[0] for k in ("exact_accuracy", "ridgefill_accuracy")),
               "needle: exact_accuracy and ridgefill_accuracy present")
        expect(res[0]["exact_accuracy"] > 0, "needle: exact retrieval finds the number")
        expect(res[0]["ridgefill_accuracy"] == res[0]["exact_accuracy"],
               "needle: no filled rows -> RidgeFill accuracy equals exact")
        expect(all(s["exact"] == s[f"ridgefill_{SPLIT}"] for s in res[0]["samples"]),
               "needle: no filled rows -> RidgeFill answers equal exact")

        d = last_json(run([evalbin, "distant-loss", *common, "--text", TEXT, "--prompt_tokens",
                 str(LENGTH), "--exact_tail_tokens", str(LENGTH)]))
        print(json.dumps(d))
        a, t = d["all_tokens"], d["distant_tokens"]
        expect(a["count"] == LENGTH - 1 and t["count"] == 0 and d["filled_tokens"] == 0,
               "distant-loss without fill: tokens 2..LENGTH scored, none distant")
        expect(a["ridgefill_nll"] == a["exact_nll"] and math.isfinite(a["exact_nll"]),
               "distant-loss: no filled rows -> RidgeFill NLL equals exact exactly")

        d = last_json(run([evalbin, "distant-loss", *common, "--text", TEXT, "--prompt_tokens",
                 str(LENGTH), "--exact_tail_tokens", str(LENGTH // 2)]))
        print(json.dumps(d))
        a, t = d["all_tokens"], d["distant_tokens"]
        expect(d["filled_tokens"] == LENGTH // 2 and a["count"] == LENGTH // 2 - 1,
               "distant-loss with fill: tail tokens 2..T scored")
        expect(all(k in t for k in ("count", "exact_nll", "ridgefill_nll", "relative_increase")),
               "distant-loss: distant_tokens has count, exact_nll, ridgefill_nll, "
               "relative_increase")
        expect(a["ridgefill_nll"] != a["exact_nll"] and 0 < a["exact_nll"] < 10
               and 0 < a["ridgefill_nll"] < 10,
               "distant-loss with fill: RidgeFill NLL finite and different from exact")
        expect(a["tail_only_nll"] >= a["exact_nll"] - 0.05,
               "distant-loss: the tail alone predicts no better than the full context")
    sys.exit(finish())


if __name__ == "__main__":
    main()
