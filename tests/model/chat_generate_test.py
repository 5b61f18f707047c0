"""Greedy chat on the default model through ridgeserve-eval: the answer names Paris.

Also checks the JSON interface of `generate` and that the prompt went through the ChatML
template (SmolLM2's default system prompt makes it well over the 9 tokens of the question).
"""

import json
import os
import subprocess
import sys

binary = os.path.join(os.environ["RIDGESERVE_BIN"], "ridgeserve-eval")
model = os.environ["RIDGESERVE_DEFAULT_MODEL"]
out = subprocess.run(
    [binary, "generate", "--model", model, "--chat", "--prompt",
     "What is the capital of France?", "--max_new_tokens", "32"],
    check=True, capture_output=True, text=True, timeout=300).stdout
result = json.loads(out)
print(result)
assert set(result) == {"text", "token_ids", "prompt_tokens", "ttft_seconds",
                       "tokens_per_second"}, result.keys()
assert "Paris" in result["text"], result["text"]
assert result["prompt_tokens"] > 30, result["prompt_tokens"]
assert 0 < len(result["token_ids"]) <= 32
assert result["ttft_seconds"] > 0 and result["tokens_per_second"] > 0
print("ok: greedy chat answers", repr(result["text"]))
sys.exit(0)
