"""Request bytes that are not a valid protobuf message get INVALID_ARGUMENT naming the message
type and the byte count (not gRPC's default UNIMPLEMENTED with an empty message); the server
keeps serving.

Sent raw (grpcio with no serializer) to Generate and GenerateStream: b'\\xff\\xff\\xff', a valid
GenerateRequest cut short, and 40 random byte strings (fixed seed) that protobuf rejects; also
b'\\xff\\xff\\xff' to Abort, Tokenize and GetModelInfo. Checks too that the empty message (valid:
every field unset) is refused by request validation, not by the parser; that a valid request
sent as raw bytes, and one through the stub, still work right after on the same server; and
that an unknown method and an unknown service still get UNIMPLEMENTED.
"""

import random

import grpc
from google.protobuf.message import DecodeError

from rs_testlib import (SC, Checks, FinishReason, Server, expect, expect_eq, greedy_request, pb,
                        run_unary)

SERVICE = "/ridgeserve.v1.Inference/"


def raw_unary(channel, method, data, timeout=60):
    """(response bytes or None, status code, details)."""
    call = channel.unary_unary(SERVICE + method if "/" not in method else method,
                               request_serializer=None, response_deserializer=None)
    try:
        return call(data, timeout=timeout), SC.OK, ""
    except grpc.RpcError as e:
        return None, e.code(), e.details() or ""


def raw_stream(channel, data, timeout=60):
    """(response messages as bytes, status code, details)."""
    call = channel.unary_stream(SERVICE + "GenerateStream", request_serializer=None,
                                response_deserializer=None)(data, timeout=timeout)
    messages = []
    try:
        for m in call:
            messages.append(m)
        return messages, SC.OK, ""
    except grpc.RpcError as e:
        return messages, e.code(), e.details() or ""


def does_not_parse(message_type, data):
    try:
        message_type.FromString(data)
        return False
    except DecodeError:
        return True


def expect_parse_error(what, code, details, type_name, data):
    expect(code == SC.INVALID_ARGUMENT,
           f"{what}: got {code.name} ({details!r}), want INVALID_ARGUMENT")
    expect(f"not a valid ridgeserve.v1.{type_name}" in details,
           f"{what}: message {details!r} does not name ridgeserve.v1.{type_name}")
    expect(f"{len(data)} bytes" in details, f"{what}: message {details!r} lacks the byte count")


def main():
    checks = Checks("test_malformed")
    ok_request = greedy_request(text="The GNU General Public License is", max_new_tokens=8)
    valid = ok_request.SerializeToString()
    truncated = valid[:-1]
    rng = random.Random(15)
    garbage = []
    while len(garbage) < 40:
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
        if does_not_parse(pb.GenerateRequest, data):
            garbage.append(data)
    bad = [("ff ff ff", b"\xff\xff\xff"), ("truncated valid request", truncated)] + [
        (f"random #{i} ({len(d)} bytes)", d) for i, d in enumerate(garbage)]
    expect(does_not_parse(pb.GenerateRequest, truncated), "the truncated request still parses")

    with Server(name="malformed") as srv:
        free0 = srv.stats().kv_cache_blocks_free
        channel = srv.new_channel()
        baseline = []
        checks.run("baseline", lambda: baseline.append(run_unary(srv.stub, ok_request)))

        def generate_bad():
            for name, data in bad:
                _, code, details = raw_unary(channel, "Generate", data)
                expect_parse_error(f"Generate {name}", code, details, "GenerateRequest", data)
                messages, code, details = raw_stream(channel, data)
                expect(not messages, f"GenerateStream {name}: got {len(messages)} messages")
                expect_parse_error(f"GenerateStream {name}", code, details, "GenerateRequest",
                                   data)
            print(f"    e.g. {details}")

        checks.run(f"{len(bad)} unparsable GenerateRequests -> INVALID_ARGUMENT", generate_bad)

        def other_methods_bad():
            data = b"\xff\xff\xff"
            for method, type_name in [("Abort", "AbortRequest"), ("Tokenize", "TokenizeRequest"),
                                      ("GetModelInfo", "GetModelInfoRequest")]:
                _, code, details = raw_unary(channel, method, data)
                expect_parse_error(method, code, details, type_name, data)

        checks.run("unparsable Abort / Tokenize / GetModelInfo -> INVALID_ARGUMENT",
                   other_methods_bad)

        def empty_message():
            # b"" is a valid GenerateRequest with nothing set: validation refuses it.
            _, code, details = raw_unary(channel, "Generate", b"")
            expect(code == SC.INVALID_ARGUMENT, f"got {code.name} ({details!r})")
            expect(details and "not a valid" not in details, f"message {details!r}")

        checks.run("empty message -> refused by validation, not the parser", empty_message)

        def unknown_method():
            for method in [SERVICE + "NoSuchMethod", "/ridgeserve.v1.NoSuchService/Generate"]:
                _, code, details = raw_unary(channel, method, valid)
                expect(code == SC.UNIMPLEMENTED, f"{method}: got {code.name} ({details!r})")

        checks.run("unknown method / service -> UNIMPLEMENTED", unknown_method)

        def still_serving():
            expect(baseline and baseline[0][1] == SC.OK, f"baseline failed: {baseline}")
            want = list(baseline[0][0].token_ids)
            expect(want, "baseline produced no tokens")
            raw, code, details = raw_unary(channel, "Generate", valid)
            expect(code == SC.OK, f"raw Generate: {code.name} {details}")
            expect_eq(list(pb.GenerateResponse.FromString(raw).token_ids), want, "raw ids")
            messages, code, details = raw_stream(channel, valid)
            expect(code == SC.OK, f"raw GenerateStream: {code.name} {details}")
            ids = [i for m in messages for i in pb.GenerateResponse.FromString(m).token_ids]
            expect_eq(ids, want, "raw stream ids")
            resp, code, details = run_unary(srv.stub, ok_request)
            expect(code == SC.OK, f"stub Generate: {code.name} {details}")
            expect_eq(list(resp.token_ids), want, "stub ids")
            expect(resp.finish_reason in (FinishReason.LENGTH, FinishReason.STOP), "finish")
            expect_eq(list(srv.stub.Tokenize(pb.TokenizeRequest(text="Hello"), timeout=30)
                           .token_ids), srv.tokenize("Hello"), "Tokenize")
            srv.wait_idle(free0, 20, "after the malformed requests")

        checks.run("valid requests still work on the same server", still_serving)
    checks.finish()


if __name__ == "__main__":
    main()
