"""RidgeFill shadow-exact sampling (--ridgefill_shadow_fraction) on the real ridgeserve.

Checks:
  * with fraction 1, every RIDGEFILL request that filled rows is compared with its exact
    shadow, one at a time: the samples per split layer, KL observations and generated tokens
    add up; top-1 agreement equals what the public API says independently (the first token of
    the RIDGEFILL request against that of an exact request for the same prompt, both greedy);
    the RidgeFill-side NLL equals -sum of the logprobs the responses carried; exact requests and
    RIDGEFILL requests with nothing filled are not sampled; nothing is dropped on an idle server;
  * each of those requests' KL (what its split's KL sum grew by) equals what the offline
    `ridgeserve-eval next-token-kl` gives for its prompt and split, within KL_AGREEMENT, and
    the offline top-1 agreement is the API's;
  * under load (--max_running_requests 2, six requests at once) real requests keep the tokens
    they give alone, and every sampled request is either compared or counted as dropped, some
    dropped;
  * a fraction outside [0, 1] stops the server with a line naming the flag.
"""

import json
import math
import subprocess
import time

from rs_testlib import (EVAL_BIN, MAPS, MODEL, SERVER_BIN, Checks, Server, expect, expect_eq,
                        greedy_request, in_threads, license_text, run_ok, scrape_metrics)

NEW_TOKENS = 8
TAIL = 32
SPLITS = (16, 20)
# Shadow KL vs ridgeserve-eval's on the same prompt: relative difference allowed.
KL_AGREEMENT = 1e-3


def ridgefill_request(token_ids, split, tail=TAIL):
    req = greedy_request(token_ids=token_ids, max_new_tokens=NEW_TOKENS, ignore_eos=True,
                         logprobs=True)
    req.prefill.mode = req.prefill.RIDGEFILL
    req.prefill.ridgefill.exact_tail_tokens = tail
    req.prefill.ridgefill.split_layer = split
    return req


def shadow(m, name, labels):
    return m.get(f"ridgeserve_ridgefill_shadow_{name}{{{labels}}}", 0.0)


def wait_for_samples(srv, done, timeout_s=120):
    deadline = time.monotonic() + timeout_s
    while True:
        m = scrape_metrics(srv)
        if done(m):
            return m
        expect(time.monotonic() < deadline, "shadow comparisons did not arrive")
        time.sleep(0.2)


def dropped(m):
    return sum(shadow(m, "dropped_total", f'reason="{r}"') for r in ("queue", "displaced"))


def check_sequential(srv, prompts, solo, measured):
    agree = {s: 0 for s in SPLITS}
    nll = {s: 0.0 for s in SPLITS}
    kl_sum = {s: 0.0 for s in SPLITS}
    for i, p in enumerate(prompts):
        split = SPLITS[i % len(SPLITS)]
        rf = run_ok(srv.stub, ridgefill_request(p, split))
        expect(rf.usage.filled_prompt_tokens > 0, "nothing filled")
        solo[i] = list(rf.token_ids)
        exact = run_ok(srv.stub, greedy_request(token_ids=p, max_new_tokens=1))
        agree[split] += rf.token_ids[0] == exact.token_ids[0]
        nll[split] -= sum(rf.logprobs)
        want = i + 1
        m = wait_for_samples(srv, lambda m: sum(shadow(m, "samples_total", f'split_layer="{s}"')
                                                for s in SPLITS) >= want)
        # This request's KL: what the split's sum grew by.
        now = shadow(m, "kl_sum", f'split_layer="{split}"')
        measured.append({"prompt": i, "split": split, "kl": now - kl_sum[split],
                         "top1_agree": rf.token_ids[0] == exact.token_ids[0]})
        kl_sum[split] = now
    # Not sampled: an exact request and a RIDGEFILL request with nothing to fill.
    run_ok(srv.stub, greedy_request(token_ids=prompts[0], max_new_tokens=2))
    run_ok(srv.stub, ridgefill_request(prompts[0], SPLITS[0], tail=len(prompts[0])))
    time.sleep(2)
    m = scrape_metrics(srv)
    per_split = len(prompts) // len(SPLITS)
    for s in SPLITS:
        lab = f'split_layer="{s}"'
        samples = shadow(m, "samples_total", lab)
        expect_eq(samples, per_split, f"samples at split {s}")
        expect_eq(shadow(m, "kl_count", lab), per_split, f"KL observations at split {s}")
        expect_eq(shadow(m, "top1_agreement_total", lab), agree[s],
                  f"top-1 agreement at split {s} (the API's: {agree[s]} of {per_split})")
        expect_eq(shadow(m, "generated_tokens_total", lab), per_split * NEW_TOKENS,
                  f"generated tokens at split {s}")
        got = shadow(m, "generated_nll_total", f'prefill="ridgefill",{lab}')
        expect(math.isclose(got, nll[s], rel_tol=1e-4), f"RidgeFill NLL {got} vs logprobs {nll[s]}")
        exact_nll = shadow(m, "generated_nll_total", f'prefill="exact",{lab}')
        kl = shadow(m, "kl_sum", lab)
        expect(exact_nll > 0 and math.isfinite(exact_nll), f"exact NLL {exact_nll}")
        expect(kl >= 0 and math.isfinite(kl), f"KL sum {kl}")
        print(f"split {s}: {int(samples)} compared, top-1 agreement {agree[s]}, mean KL "
              f"{kl / samples:.4f} nats, NLL/token RidgeFill {got / (samples * NEW_TOKENS):.3f} "
              f"exact {exact_nll / (samples * NEW_TOKENS):.3f}", flush=True)
    expect_eq(dropped(m), 0, "dropped on an idle server")


def check_offline_kl(prompts, measured):
    """Each served request's shadow KL against `ridgeserve-eval next-token-kl` on its prompt:
    the offline runner (SequenceRunner, no engine, no scheduler) with the same row plan."""
    worst = 0.0
    for row in measured:
        out = subprocess.run(
            [EVAL_BIN, "next-token-kl", f"--model={MODEL}", f"--maps={MAPS}",
             "--token_ids=" + ",".join(map(str, prompts[row["prompt"]])),
             f"--split_layer={row['split']}", f"--exact_tail_tokens={TAIL}", "--chunk=2048"],
            capture_output=True, text=True, timeout=300)
        expect(out.returncode == 0, f"ridgeserve-eval next-token-kl failed: {out.stderr[-800:]}")
        offline = json.loads(out.stdout)["splits"][0]
        diff = abs(offline["kl"] - row["kl"])
        worst = max(worst, diff / offline["kl"])
        print(f"prompt {row['prompt']} split {row['split']}: served {row['kl']:.6f}, offline "
              f"{offline['kl']:.6f} nats", flush=True)
        expect(diff <= KL_AGREEMENT * offline["kl"],
               f"prompt {row['prompt']} split {row['split']}: shadow KL {row['kl']} vs "
               f"ridgeserve-eval {offline['kl']}")
        expect_eq(offline["top1_agree"], row["top1_agree"], f"prompt {row['prompt']} top-1")
    print(f"largest relative difference {worst:.2e}", flush=True)


def check_under_load(prompts, solo):
    with Server("--ridgefill_maps", MAPS, "--ridgefill_shadow_fraction=1",
                "--enable_prefix_caching=false", "--max_running_requests=2",
                name="shadow_load") as srv:
        reqs = [ridgefill_request(p, SPLITS[i % len(SPLITS)]) for i, p in enumerate(prompts)]
        results = in_threads([lambda r=r: run_ok(srv.stub, r) for r in reqs])
        for i, resp in enumerate(results):
            expect_eq(list(resp.token_ids), solo[i], f"request {i} under load vs alone")
        m = wait_for_samples(srv, lambda m: sum(
            shadow(m, "samples_total", f'split_layer="{s}"') for s in SPLITS) + dropped(m)
            >= len(prompts))
        time.sleep(1)
        m = scrape_metrics(srv)
        compared = sum(shadow(m, "samples_total", f'split_layer="{s}"') for s in SPLITS)
        expect_eq(compared + dropped(m), len(prompts), "compared + dropped")
        expect(dropped(m) >= 1, "nothing dropped with four requests waiting")
        print(f"under load: {int(compared)} compared, {int(dropped(m))} dropped", flush=True)


def check_bad_fraction():
    p = subprocess.run([SERVER_BIN, f"--model={MODEL}", "--ridgefill_shadow_fraction=1.5",
                        "--port=0", "--metrics_port=-1"], capture_output=True, text=True,
                       timeout=120)
    expect(p.returncode != 0, "server started with --ridgefill_shadow_fraction=1.5")
    expect("--ridgefill_shadow_fraction must be in [0, 1]" in p.stdout + p.stderr,
           f"no line naming the flag:\n{p.stderr[-1000:]}")


def main():
    checks = Checks("ridgefill_shadow")
    solo = {}
    measured = []
    with Server("--ridgefill_maps", MAPS, "--ridgefill_shadow_fraction=1",
                "--enable_prefix_caching=false", name="shadow") as srv:
        ids = srv.tokenize(license_text(60000), add_special_tokens=True)
        prompts = [ids[1000 * k + 500:1000 * k + 1300] for k in range(6)]
        checks.run("every sampled request compared; top-1 agreement as the API's", check_sequential,
                   srv, prompts, solo, measured)
    checks.run("shadow KL equals ridgeserve-eval's offline KL", check_offline_kl, prompts, measured)
    checks.run("under load: real requests unchanged, shadows compared or dropped",
               check_under_load, prompts, solo)
    checks.run("a fraction outside [0, 1] is refused", check_bad_fraction)
    checks.finish()


if __name__ == "__main__":
    main()
