"""The gRPC API surface against independent references, and the CLI client.

Checks:
  * Tokenize == Hugging Face `tokenizers` built from the GGUF's own vocabulary and merges
    (tests/reference/gguf_tokenizer.py), for text with and without special tokens, and for
    chat (the ChatML rendering written out here, SmolLM2's template with its default system
    prompt); `tokens` has one entry per id;
  * GetModelInfo: SmolLM2-135M's architecture (30 layers, hidden 576, 9/3 heads, vocab 49152,
    context 8192), backend cpu, no RidgeFill maps, KV stats consistent with --kv_cache_tokens;
  * greedy chat "What is the capital of France?" answers with Paris and stops;
  * Generate's response: request_id echoed (or generated), usage.prompt_tokens == Tokenize,
    timing consistent; the same seed reproduces a sampled output; logprobs come per token;
  * stop strings: a string spanning two tokens of the greedy output cuts the text right before
    it (unary and stream) with finish STOP_SEQUENCE; stop_token_ids end with STOP;
  * health SERVING; server reflection lists ridgeserve.v1.Inference and grpc.health.v1.Health;
  * ridgeserve-cli generate / stream / info / health / tokenize work (prompt from an argument,
    a file and stdin), and a bad request exits nonzero printing INVALID_ARGUMENT.
"""

import math
import os
import re
import subprocess
import tempfile

import grpc
from grpc_health.v1 import health_pb2

from rs_testlib import (CLI_BIN, MODEL, SC, Checks, Server, expect, expect_eq,
                        finish_name, greedy_request, license_text, pb, run_stream, run_unary)

KV_TOKENS = 4096
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chatml(messages):
    """SmolLM2's chat template (tokenizer.chat_template in the GGUF), rendered by hand."""
    out = ""
    if messages[0][0] != "system":
        out += f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n"
    for role, content in messages:
        out += f"<|im_start|>{role}\n{content}<|im_end|>\n"
    return out + "<|im_start|>assistant\n"


def main():
    checks = Checks("test_api")
    text = license_text()
    with Server(f"--kv_cache_tokens={KV_TOKENS}", name="api") as srv:
        from gguf_tokenizer import tokenizer_from_gguf

        hf = tokenizer_from_gguf(MODEL)

        def tokenize():
            samples = [
                "Hello world!",
                text[1000:3000],
                "Ünïcödé — “quotes”, emoji 🙂🚀, CJK 日本語, digits 1234567890, tabs\t\tand   "
                "spaces\n\n\nnew lines",
                "  leading spaces and trailing ones   ",
            ]
            for s in samples:
                want = hf.encode(s, add_special_tokens=False).ids
                r = srv.stub.Tokenize(pb.TokenizeRequest(text=s), timeout=30)
                expect_eq(list(r.token_ids), want, f"Tokenize({s[:30]!r})")
                expect_eq(len(r.tokens), len(r.token_ids), "tokens per id")
                if s.isascii():
                    expect_eq("".join(r.tokens), s, "tokens joined")
                # SmolLM2 has add_bos_token = false: add_special_tokens adds nothing.
                r2 = srv.stub.Tokenize(pb.TokenizeRequest(text=s, add_special_tokens=True),
                                       timeout=30)
                expect_eq(list(r2.token_ids), want, "Tokenize with add_special_tokens")
            for msgs in ([("user", "What is the capital of France?")],
                         [("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello!"),
                          ("user", "Name a color.")]):
                req = pb.TokenizeRequest()
                for role, content in msgs:
                    req.chat.messages.add(role=role, content=content)
                r = srv.stub.Tokenize(req, timeout=30)
                want = hf.encode(chatml(msgs), add_special_tokens=False).ids
                expect_eq(list(r.token_ids), want, f"Tokenize(chat {msgs[-1][1]!r})")

        checks.run("Tokenize == HF tokenizers", tokenize)

        def model_info():
            m = srv.info()
            print(f"    {m.model_name!r} {m.architecture} backend={m.backend} stats={m.stats}")
            for field, want in [("num_layers", 30), ("hidden_size", 576), ("num_heads", 9),
                                ("num_kv_heads", 3), ("vocab_size", 49152),
                                ("context_length", 8192), ("tensor_parallel", 1),
                                ("backend", "cpu"), ("architecture", "llama")]:
                expect_eq(getattr(m, field), want, f"ModelInfo.{field}")
            expect(m.model_name, "empty model_name")
            expect_eq(list(m.ridgefill_split_layers), [], "ridgefill_split_layers")
            expect_eq(m.default_exact_tail_tokens, 1024, "default_exact_tail_tokens")
            s = m.stats
            expect(s.kv_cache_block_size > 0, "block size")
            expect_eq(s.kv_cache_blocks_total,
                      -(-KV_TOKENS // s.kv_cache_block_size), "blocks for --kv_cache_tokens")
            expect_eq(s.kv_cache_blocks_free, s.kv_cache_blocks_total, "free at idle")
            expect_eq((s.num_requests_running, s.num_requests_waiting), (0, 0), "idle counts")

        checks.run("GetModelInfo", model_info)

        def paris():
            req = greedy_request(chat=[("user", "What is the capital of France?")],
                                 max_new_tokens=32)
            resp, code, details = run_unary(srv.stub, req)
            expect(code == SC.OK, f"{code.name} {details}")
            print(f"    {resp.text!r} ({finish_name(resp.finish_reason)})")
            expect("Paris" in resp.text, f"no Paris in {resp.text!r}")
            expect_eq(finish_name(resp.finish_reason), "STOP", "finish_reason")
            expect("<|im_end|>" not in resp.text, "end-of-generation token text in the output")

        checks.run("chat: capital of France is Paris", paris)

        def response_fields():
            prompt = text[:500]
            n_prompt = len(srv.tokenize(prompt))
            resp, code, details = run_unary(
                srv.stub, greedy_request(text=prompt, max_new_tokens=8, ignore_eos=True,
                                         request_id="api-fields-1"))
            expect(code == SC.OK, f"{code.name} {details}")
            expect_eq(resp.request_id, "api-fields-1", "request_id echoed")
            expect_eq(resp.usage.prompt_tokens, n_prompt, "usage.prompt_tokens vs Tokenize")
            expect_eq(resp.usage.completion_tokens, 8, "usage.completion_tokens")
            expect_eq(len(resp.token_ids), 8, "token ids")
            expect_eq(finish_name(resp.finish_reason), "LENGTH", "finish")
            t = resp.timing
            expect(0 < t.ttft_seconds <= t.e2e_seconds, f"timing: {t}")
            expect(0 <= t.queue_seconds <= t.ttft_seconds, f"queue vs ttft: {t}")
            expect(t.prefill_seconds > 0, f"prefill_seconds: {t}")
            resp2, code, _ = run_unary(srv.stub, greedy_request(text="Hi", max_new_tokens=2))
            expect(code == SC.OK and resp2.request_id, "no generated request_id")
            # Stream's final message carries usage and timing too.
            r = run_stream(srv.stub, greedy_request(text=prompt, max_new_tokens=8,
                                                     ignore_eos=True))
            expect(r.code == SC.OK and r.final is not None, r.describe())
            expect_eq(r.final.usage.completion_tokens, 8, "stream usage.completion_tokens")
            expect(r.final.timing.e2e_seconds > 0, "stream timing")
            expect_eq(r.token_ids, list(resp.token_ids), "stream ids vs unary")

        checks.run("Generate response fields", response_fields)

        def sampling_seed_logprobs():
            def sampled(seed):
                return run_unary(srv.stub, greedy_request(
                    text="Once upon a time", max_new_tokens=16, temperature=0.9, top_p=0.95,
                    top_k=50, seed=seed, logprobs=True, ignore_eos=True))

            a, ca, da = sampled(1234)
            b, cb, db = sampled(1234)
            expect(ca == SC.OK and cb == SC.OK, f"{ca.name} {da} / {cb.name} {db}")
            expect_eq(list(a.token_ids), list(b.token_ids), "same seed, same tokens")
            expect_eq(len(a.logprobs), len(a.token_ids), "one logprob per token")
            expect(all(lp <= 1e-6 and math.isfinite(lp) for lp in a.logprobs),
                   f"logprobs: {list(a.logprobs)}")
            # Greedy: the top token's log-probability is the largest possible, > log(1/vocab).
            g, cg, dg = run_unary(srv.stub, greedy_request(text="Once upon a time",
                                                            max_new_tokens=4, logprobs=True))
            expect(cg == SC.OK, dg)
            expect(all(lp > math.log(1 / 49152) for lp in g.logprobs), f"{list(g.logprobs)}")

        checks.run("seeded sampling reproducible; logprobs", sampling_seed_logprobs)

        def stop_strings():
            prompt = "The GNU General Public License is a free, copyleft license for"
            full = run_stream(srv.stub, greedy_request(text=prompt, max_new_tokens=32,
                                                        ignore_eos=True))
            expect(full.code == SC.OK, full.describe())
            # Boundary between deltas k and k+1, each one ASCII token, the stop string's first
            # occurrence straddling exactly that boundary.
            k = stop = None
            for i in range(2, len(full.deltas) - 1):
                a, b = full.deltas[i], full.deltas[i + 1]
                if (len(full.delta_ids[i]) == 1 and len(full.delta_ids[i + 1]) == 1
                        and len(a.strip()) >= 2 and len(b) >= 3 and a.isascii() and b.isascii()):
                    boundary = len("".join(full.deltas[:i + 1]))
                    if full.text.find(a[-2:] + b[:2]) == boundary - 2:
                        k, stop = i, a[-2:] + b[:2]
                        break
            expect(k is not None, f"no usable token boundary in {full.deltas}")
            cut = full.text.find(stop)
            want = full.text[:cut]
            print(f"    stop {stop!r} spans {full.deltas[k]!r}|{full.deltas[k + 1]!r}")
            req = greedy_request(text=prompt, max_new_tokens=32, ignore_eos=True,
                                 stop=["never appears zzq", stop])
            resp, code, details = run_unary(srv.stub, req)
            expect(code == SC.OK, f"{code.name} {details}")
            expect_eq(resp.text, want, "unary text cut before the stop string")
            expect_eq(finish_name(resp.finish_reason), "STOP_SEQUENCE", "unary finish")
            r = run_stream(srv.stub, req)
            expect(r.code == SC.OK and r.final is not None, r.describe())
            expect_eq(r.text, want, "streamed text cut before the stop string")
            expect_eq(finish_name(r.final.finish_reason), "STOP_SEQUENCE", "stream finish")
            # Stop string inside a single token, at the start of the output.
            first = full.deltas[0]
            if len(first.strip()) >= 2:
                resp, code, _ = run_unary(srv.stub, greedy_request(
                    text=prompt, max_new_tokens=32, stop=[first]))
                expect(code == SC.OK, code.name)
                expect_eq(resp.text, full.text[:full.text.find(first)], "stop at the start")
                expect_eq(finish_name(resp.finish_reason), "STOP_SEQUENCE", "finish")
            # A stop token id: ends with STOP, no tokens after it.
            sid = full.token_ids[5]
            resp, code, _ = run_unary(srv.stub, greedy_request(
                text=prompt, max_new_tokens=32, ignore_eos=True, stop_token_ids=[sid]))
            expect(code == SC.OK, code.name)
            pos = full.token_ids.index(sid)
            got = list(resp.token_ids)
            expect(got in (full.token_ids[:pos], full.token_ids[:pos + 1]),
                   f"stop_token_ids: {got} vs greedy {full.token_ids[:pos + 1]}")
            expect_eq(finish_name(resp.finish_reason), "STOP", "stop token finish")

        checks.run("stop sequences across token boundaries", stop_strings)

        def health():
            r = srv.health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
            expect_eq(r.status, health_pb2.HealthCheckResponse.SERVING, "health")

        checks.run("health SERVING", health)

        def reflection():
            services = None
            errors = []
            for mod in ("grpc_reflection.v1alpha", "grpc_reflection.v1"):
                try:
                    rpb = __import__(f"{mod}.reflection_pb2", fromlist=["x"])
                    rgrpc = __import__(f"{mod}.reflection_pb2_grpc", fromlist=["x"])
                    stub = rgrpc.ServerReflectionStub(srv.channel)
                    req = rpb.ServerReflectionRequest(list_services="")
                    for resp in stub.ServerReflectionInfo(iter([req]), timeout=10):
                        services = [s.name for s in resp.list_services_response.service]
                    break
                except (ImportError, grpc.RpcError) as e:
                    errors.append(f"{mod}: {e}")
            expect(services is not None, f"reflection failed: {errors}")
            print(f"    services: {services}")
            for want in ("ridgeserve.v1.Inference", "grpc.health.v1.Health"):
                expect(want in services, f"{want} not listed by reflection: {services}")

        checks.run("server reflection lists the services", reflection)

        def cli():
            expect(os.path.exists(CLI_BIN), f"{CLI_BIN} not built")
            tgt = f"--target={srv.target}"

            def run(*args, stdin=None):
                p = subprocess.run([CLI_BIN, *args], input=stdin, capture_output=True,
                                   text=True, timeout=120)
                return p.returncode, p.stdout, p.stderr

            prompt = "The three primary colors are"
            want, code, _ = run_unary(srv.stub, greedy_request(text=prompt, max_new_tokens=12))
            expect(code == SC.OK, code.name)
            gen = ["--temperature=0", "--max_new_tokens=12"]

            rc, out, err = run("generate", tgt, f"--prompt={prompt}", *gen)
            expect(rc == 0, f"generate rc={rc}: {err}")
            expect(want.text.strip() in out, f"generate printed {out!r}, want {want.text!r}")

            rc, out, err = run("generate", tgt, *gen, stdin=prompt)
            expect(rc == 0 and want.text.strip() in out, f"generate from stdin: {rc} {out!r} {err}")

            with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
                f.write(prompt)
            try:
                rc, out, err = run("generate", tgt, f"--file={f.name}", *gen)
            finally:
                os.unlink(f.name)
            expect(rc == 0 and want.text.strip() in out, f"generate --file: {rc} {out!r} {err}")

            rc, out, err = run("stream", tgt, f"--prompt={prompt}", *gen)
            expect(rc == 0, f"stream rc={rc}: {err}")
            expect(want.text.strip() in out, f"stream printed {out!r}, want {want.text!r}")
            expect("ttft" in (out + err).lower(), f"stream printed no TTFT: {err!r}")

            rc, out, err = run("generate", tgt, "--chat", "--prompt=What is the capital of France?",
                               "--temperature=0", "--max_new_tokens=32")
            expect(rc == 0 and "Paris" in out, f"generate --chat: {rc} {out!r} {err}")

            rc, out, err = run("info", tgt)
            expect(rc == 0, f"info rc={rc}: {err}")
            for needle in ("49152", "8192", "30", "576"):
                expect(re.search(rf"\b{needle}\b", out), f"info output lacks {needle}: {out!r}")

            rc, out, err = run("health", tgt)
            expect(rc == 0 and "SERVING" in out and "NOT_SERVING" not in out,
                   f"health: {rc} {out!r} {err}")

            ids = srv.tokenize("Hello world, tokens!")
            rc, out, err = run("tokenize", tgt, "--prompt=Hello world, tokens!")
            expect(rc == 0, f"tokenize rc={rc}: {err}")
            nums = [int(x) for x in re.findall(r"-?\d+", out)]
            expect(any(nums[i:i + len(ids)] == ids for i in range(len(nums))),
                   f"tokenize printed {out!r}, want ids {ids}")

            rc, out, err = run("generate", tgt, f"--prompt={prompt}", "--temperature=-1")
            expect(rc != 0, "bad request exited 0")
            expect("INVALID_ARGUMENT" in out + err, f"no status code printed: {out!r} {err!r}")
            expect("temperature" in out + err, f"field not named: {err!r}")

            # An unreachable server is an error too, with the gRPC code.
            rc, out, err = run("health", "--target=127.0.0.1:1")
            expect(rc != 0 and "UNAVAILABLE" in out + err, f"unreachable: {rc} {out!r} {err!r}")

        checks.run("ridgeserve-cli", cli)

        def still_idle():
            srv.wait_idle(srv.stats().kv_cache_blocks_total, 20, "end of test_api")

        checks.run("KV blocks all free at the end", still_idle)
    checks.finish()


if __name__ == "__main__":
    main()
