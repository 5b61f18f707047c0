"""Bad requests get the right gRPC status naming the field; the server keeps serving.

Every case is sent both as Generate and as GenerateStream. Checks:
  * INVALID_ARGUMENT with the field's name in the message for: negative / NaN temperature,
    top_p 0 and 1.5, negative top_k, min_p 1.5, repetition_penalty 0, a token id >= vocab or
    negative, a stop token id >= vocab, no input, empty text / token_ids / chat, an unknown chat
    role, 17 stop strings, an empty and a 257-byte stop string, max_new_tokens 10^9 / 0 / -5,
    a 300-byte request_id;
  * OUT_OF_RANGE for a prompt longer than the context (text of 8192+ tokens) and for prompt +
    max_new_tokens over the context;
  * FAILED_PRECONDITION for RIDGEFILL (no maps loaded), SPEC_PC and SPEC_KV (no draft model,
    the message naming --draft_model);
  * ALREADY_EXISTS for a request_id that is already running;
  * afterwards nothing is left running, every KV block is free, and a normal request works.
"""

import threading

from rs_testlib import (SC, Checks, FinishReason, Server, StreamResult, consume_stream, expect,
                        expect_eq, greedy_request, license_text, pb, run_stream, run_unary)

VOCAB = 49152
CTX = 8192


def req(**kw):
    kw.setdefault("text", "Hello there")
    if "no_text" in kw:
        kw.pop("no_text")
        kw.pop("text")
    return greedy_request(**kw)


def with_sampling(base, **fields):
    for k, v in fields.items():
        setattr(base.sampling, k, v)
    return base


def empty_input(kind):
    r = greedy_request(max_new_tokens=4)
    if kind == "text":
        r.text = ""
    elif kind == "token_ids":
        r.token_ids.SetInParent()
    elif kind == "chat":
        r.chat.SetInParent()
    return r


def prefill(mode):
    r = req(max_new_tokens=4)
    r.prefill.mode = mode
    return r


def cases(long_text, long_ids):
    inv = SC.INVALID_ARGUMENT
    return [
        ("negative temperature", with_sampling(req(), temperature=-0.5), inv, ["temperature"]),
        ("NaN temperature", with_sampling(req(), temperature=float("nan")), inv, ["temperature"]),
        ("top_p 0", with_sampling(req(), top_p=0.0), inv, ["top_p"]),
        ("top_p 1.5", with_sampling(req(), top_p=1.5), inv, ["top_p"]),
        ("top_k -1", with_sampling(req(), top_k=-1), inv, ["top_k"]),
        ("min_p 1.5", with_sampling(req(), min_p=1.5), inv, ["min_p"]),
        ("repetition_penalty 0", with_sampling(req(), repetition_penalty=0.0), inv,
         ["repetition_penalty"]),
        ("token id == vocab", req(no_text=True, token_ids=[1, 2, VOCAB]), inv, ["token_ids"]),
        ("token id 10^6", req(no_text=True, token_ids=[10**6]), inv, ["token_ids"]),
        ("negative token id", req(no_text=True, token_ids=[5, -1]), inv, ["token_ids"]),
        ("stop token id >= vocab", req(stop_token_ids=[VOCAB + 7]), inv, ["stop_token_ids"]),
        ("no input", req(no_text=True), inv, ["input"]),
        ("empty text", empty_input("text"), inv, ["text", "input"]),
        ("empty token_ids", empty_input("token_ids"), inv, ["token_ids", "input"]),
        ("empty chat", empty_input("chat"), inv, ["chat", "messages", "input"]),
        ("unknown chat role", req(no_text=True, chat=[("robot", "beep")]), inv, ["role"]),
        ("17 stop strings", req(stop=[f"stop{i}" for i in range(17)]), inv, ["stop"]),
        ("empty stop string", req(stop=["ok", ""]), inv, ["stop"]),
        ("257-byte stop string", req(stop=["x" * 257]), inv, ["stop"]),
        ("max_new_tokens 10^9", req(max_new_tokens=10**9), inv, ["max_new_tokens"]),
        ("max_new_tokens 0", req(max_new_tokens=0), inv, ["max_new_tokens"]),
        ("max_new_tokens -5", req(max_new_tokens=-5), inv, ["max_new_tokens"]),
        ("300-byte request_id", req(request_id="r" * 300), inv, ["request_id"]),
        ("text prompt over the context", req(text=long_text, max_new_tokens=16),
         SC.OUT_OF_RANGE, []),
        ("prompt + max_new_tokens over the context",
         req(no_text=True, token_ids=long_ids[:CTX - 100], max_new_tokens=200), SC.OUT_OF_RANGE,
         []),
        ("RIDGEFILL without maps", prefill(pb.PrefillOptions.RIDGEFILL), SC.FAILED_PRECONDITION,
         []),
        ("SPEC_PC without a draft model", prefill(pb.PrefillOptions.SPEC_PC),
         SC.FAILED_PRECONDITION, ["no draft model loaded (start the server with --draft_model)"]),
        ("SPEC_KV without a draft model", prefill(pb.PrefillOptions.SPEC_KV),
         SC.FAILED_PRECONDITION,
         ["SPEC_KV: no draft model loaded (start the server with --draft_model)"]),
    ]


def check_status(what, code, details, want_code, fields):
    expect(code == want_code, f"{what}: got {code.name} ({details!r}), want {want_code.name}")
    if fields:
        expect(any(f in details for f in fields),
               f"{what}: message {details!r} names none of {fields}")


def main():
    checks = Checks("test_validation")
    text = license_text()
    with Server(name="validation") as srv:
        idle = srv.stats()
        free0 = idle.kv_cache_blocks_free
        # ~9000+ tokens of real text: over the 8192-token context on its own.
        long_text = (text * 2)[:46000]
        long_ids = srv.tokenize(long_text)
        print(f"long prompt: {len(long_ids)} tokens")
        expect(len(long_ids) > CTX, f"long text is only {len(long_ids)} tokens")
        ok_kw = dict(text="The GNU General Public License is", max_new_tokens=8)
        baseline = []
        checks.run("baseline",
                   lambda: baseline.append(run_unary(srv.stub, greedy_request(**ok_kw))))

        for name, request, want_code, fields in cases(long_text, long_ids):
            def one(request=request, name=name, want_code=want_code, fields=fields):
                resp, code, details = run_unary(srv.stub, request, timeout=60)
                check_status(f"Generate {name}", code, details, want_code, fields)
                r = run_stream(srv.stub, request, timeout=60)
                expect(not r.token_ids, f"GenerateStream {name}: produced tokens {r.token_ids}")
                check_status(f"GenerateStream {name}", r.code, r.details, want_code, fields)
                print(f"    {want_code.name}: {details}")

            checks.run(name, one)

        def duplicate_id():
            rid = "validation-duplicate-id"
            first = greedy_request(text=text[:300], max_new_tokens=2000, ignore_eos=True,
                                   request_id=rid)
            started = threading.Event()
            victim = StreamResult()
            call = srv.stub.GenerateStream(first, timeout=300)
            t = threading.Thread(target=lambda: consume_stream(
                call, victim, lambda r: started.set() if r.token_ids else None), daemon=True)
            t.start()
            try:
                expect(started.wait(120), f"first request produced nothing: {victim.describe()}")
                resp, code, details = run_unary(
                    srv.stub, greedy_request(text="hi", max_new_tokens=4, request_id=rid), 60)
                check_status("duplicate request_id", code, details, SC.ALREADY_EXISTS, [])
            finally:
                call.cancel()
                t.join(30)

        checks.run("duplicate live request_id -> ALREADY_EXISTS", duplicate_id)

        checks.run("nothing left running, KV blocks free", srv.wait_idle, free0, 20,
                   "after bad requests")

        def still_serving():
            resp, code, details = run_unary(srv.stub, greedy_request(**ok_kw))
            expect(code == SC.OK, f"{code.name} {details}")
            expect(baseline and baseline[0][0] is not None, "no baseline")
            expect_eq(list(resp.token_ids), list(baseline[0][0].token_ids), "ids")
            expect(resp.finish_reason in (FinishReason.LENGTH, FinishReason.STOP), "finish")
            expect(len(resp.token_ids) > 0, "no tokens")

        checks.run("server still serves a normal request", still_serving)
    checks.finish()


if __name__ == "__main__":
    main()
