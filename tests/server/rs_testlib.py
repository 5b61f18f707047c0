"""Shared harness for the server integration tests: starts the real `ridgeserve` binary on
loopback, generates the Python gRPC stubs from the .proto at run time, and offers small
helpers (greedy requests, stream collection, stats polling, a check runner).

Nothing here imitates the server: every check talks gRPC to the real process.

Environment (set by rs_pytest): RIDGESERVE_BIN (build/bin), RIDGESERVE_DEFAULT_MODEL,
RIDGESERVE_SOURCE_DIR. Set RIDGESERVE_TEST_VERBOSE=1 to echo the server log at the end.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request

SOURCE_DIR = os.environ.get(
    "RIDGESERVE_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
)
BIN_DIR = os.environ.get("RIDGESERVE_BIN", os.path.join(SOURCE_DIR, "build", "bin"))
MODEL = os.environ.get(
    "RIDGESERVE_DEFAULT_MODEL",
    os.path.join(SOURCE_DIR, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"),
)
# RidgeFill maps for MODEL, made by `make maps` (make test runs it first).
MAPS = os.environ.get("RIDGESERVE_DEFAULT_MAPS", os.path.splitext(MODEL)[0] + ".rfmap")
SERVER_BIN = os.path.join(BIN_DIR, "ridgeserve")
CLI_BIN = os.path.join(BIN_DIR, "ridgeserve-cli")
EVAL_BIN = os.path.join(BIN_DIR, "ridgeserve-eval")
VERBOSE = os.environ.get("RIDGESERVE_TEST_VERBOSE") == "1"

sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "reference"))

import grpc  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402


# ----------------------------------------------------------------------------- stubs
def _generate_stubs():
    """Compiles proto/ridgeserve/v1/ridgeserve.proto into a temp dir (never committed)."""
    from grpc_tools import protoc

    out = tempfile.mkdtemp(prefix="rs_stubs_")
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    proto_dir = os.path.join(SOURCE_DIR, "proto")
    args = [
        "protoc",
        f"-I{proto_dir}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        os.path.join(proto_dir, "ridgeserve", "v1", "ridgeserve.proto"),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("grpc_tools.protoc failed on ridgeserve.proto")
    sys.path.insert(0, out)
    from ridgeserve.v1 import ridgeserve_pb2, ridgeserve_pb2_grpc

    return ridgeserve_pb2, ridgeserve_pb2_grpc


pb, pb_grpc = _generate_stubs()
FinishReason = pb.FinishReason
SC = grpc.StatusCode


def finish_name(value: int) -> str:
    return pb.FinishReason.Name(value)


# ----------------------------------------------------------------------------- text
def license_text(max_chars: int = 200_000) -> str:
    """Real English prose from the machine (GPL-3 first, then the other licenses)."""
    base = "/usr/share/common-licenses"
    names = ["GPL-3", "Apache-2.0", "LGPL-2.1", "MPL-2.0", "Artistic", "GFDL-1.3"]
    parts = []
    for name in names:
        path = os.path.join(base, name)
        if os.path.exists(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                parts.append(f.read())
    text = "\n".join(parts)
    if not text:
        raise RuntimeError(f"no license texts under {base}")
    # Collapse runs of spaces used for centring: they make token counts less predictable.
    text = " ".join(text.split(" "))
    return text[:max_chars]


# ----------------------------------------------------------------------------- server
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent():
    # The server must not outlive a killed test (ctest timeout sends SIGKILL to the script).
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


_SERVERS: list["Server"] = []


class Server:
    """One ridgeserve process on 127.0.0.1 with free ports. Use as a context manager.

    port0: the server picks its own ports (--port=0 --metrics_port=0) and the log says which,
    so no other process can take them between the choice and the bind. credentials (for a TLS
    server) and metadata (e.g. a bearer token) are what the harness's own calls use."""

    def __init__(self, *extra_args: str, threads: int = 2, ready_timeout_s: float = 120.0,
                 name: str = "server", port0: bool = False,
                 credentials: grpc.ChannelCredentials | None = None,
                 metadata: tuple = ()):
        if not os.path.exists(SERVER_BIN):
            raise FileNotFoundError(f"{SERVER_BIN} not built")
        self.port0 = port0
        self.credentials = credentials
        self.metadata = tuple(metadata)
        if port0:
            self.port = self.metrics_port = 0
        else:
            self.port = free_port()
            self.metrics_port = free_port()
            while self.metrics_port == self.port:
                self.metrics_port = free_port()
        self.target = f"127.0.0.1:{self.port}"
        self.args = [
            SERVER_BIN,
            f"--model={MODEL}",
            "--host=127.0.0.1",
            f"--port={self.port}",
            f"--metrics_port={self.metrics_port}",
            f"--threads={threads}",
            *extra_args,
        ]
        self.name = name
        self.ready_timeout_s = ready_timeout_s
        self.log = tempfile.NamedTemporaryFile(prefix=f"rs_{name}_", suffix=".log", delete=False)
        self.proc: subprocess.Popen | None = None
        self.channel: grpc.Channel | None = None
        self.stub = None
        self.health = None
        self.exit_code: int | None = None
        _SERVERS.append(self)

    # -- lifecycle
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def start(self):
        print(f"[{self.name}] starting: {' '.join(self.args)}", flush=True)
        self.started = time.monotonic()  # before the process: it has been up no longer
        self.proc = subprocess.Popen(
            self.args, stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
        )
        atexit.register(self.kill)
        if self.port0:
            self._read_ports(self.ready_timeout_s)
        self.channel = self.new_channel()
        self.stub = pb_grpc.InferenceStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        t0 = time.monotonic()
        self.wait_serving(self.ready_timeout_s)
        print(f"[{self.name}] SERVING after {time.monotonic() - t0:.1f} s on {self.target}",
              flush=True)

    def wait_serving(self, timeout_s: float):
        deadline = time.monotonic() + timeout_s
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"ridgeserve exited with {self.proc.returncode} before serving\n"
                    + self.log_tail())
            try:
                resp = self.health.Check(health_pb2.HealthCheckRequest(service=""), timeout=2,
                                         metadata=self.metadata)
                last = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError as e:
                last = f"{e.code().name}: {e.details()}"
            time.sleep(0.25)
        raise TimeoutError(f"server not SERVING after {timeout_s} s (last: {last})\n"
                           + self.log_tail())

    def _read_ports(self, timeout_s: float):
        """With port0: the ports from the log's "metrics on" and "listening on" lines."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ridgeserve exited with {self.proc.returncode} before "
                                   f"listening\n" + self.log_tail())
            with open(self.log.name, encoding="utf-8", errors="replace") as f:
                text = f.read()
            listening = re.search(r"listening on \S+:(\d+) ", text)
            metrics = re.search(r"metrics on http://\S+:(\d+)/metrics", text)
            if listening:
                self.port = int(listening.group(1))
                self.metrics_port = int(metrics.group(1)) if metrics else -1
                self.target = f"127.0.0.1:{self.port}"
                return
            time.sleep(0.1)
        raise TimeoutError(f"no 'listening on' line after {timeout_s} s\n" + self.log_tail())

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def send_signal(self, sig):
        self.proc.send_signal(sig)

    def wait_exit(self, timeout_s: float) -> int | None:
        try:
            self.exit_code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
        return self.exit_code

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self):
        if self.channel is not None:
            self.channel.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                print(f"[{self.name}] did not exit 15 s after SIGTERM; killing", flush=True)
                self.kill()
        if VERBOSE:
            print(self.log_tail(200))
        self.log.close()

    def remove_log(self):
        try:
            os.unlink(self.log.name)
        except OSError:
            pass

    def log_tail(self, lines: int = 40) -> str:
        try:
            with open(self.log.name, encoding="utf-8", errors="replace") as f:
                text = f.read().splitlines()
        except OSError:
            return "(no server log)"
        return f"--- {self.name} log (last {lines} lines, {self.log.name}) ---\n" + "\n".join(
            text[-lines:])

    # -- helpers
    def new_channel(self, options=()) -> grpc.Channel:
        if self.credentials is not None:
            return grpc.secure_channel(self.target, self.credentials, options=options)
        return grpc.insecure_channel(self.target, options=options)

    def info(self):
        return self.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10,
                                      metadata=self.metadata)

    def stats(self):
        return self.info().stats

    def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
        r = self.stub.Tokenize(
            pb.TokenizeRequest(text=text, add_special_tokens=add_special_tokens), timeout=30,
            metadata=self.metadata)
        return list(r.token_ids)

    def wait_idle(self, free_blocks: int, timeout_s: float = 20.0, what: str = ""):
        """Polls GetModelInfo until nothing runs or waits and `free_blocks` blocks are free."""
        deadline = time.monotonic() + timeout_s
        s = None
        while time.monotonic() < deadline:
            s = self.stats()
            if (s.num_requests_running == 0 and s.num_requests_waiting == 0
                    and s.kv_cache_blocks_free == free_blocks):
                return s
            time.sleep(0.1)
        raise AssertionError(
            f"{what}: KV blocks not freed within {timeout_s} s: free={s.kv_cache_blocks_free} "
            f"(idle {free_blocks}) running={s.num_requests_running} "
            f"waiting={s.num_requests_waiting}")


# ----------------------------------------------------------------------------- requests
def greedy_request(*, text=None, token_ids=None, chat=None, max_new_tokens=16, ignore_eos=False,
                   stop=(), stop_token_ids=(), request_id="", priority=0, **sampling):
    req = pb.GenerateRequest(request_id=request_id, priority=priority)
    if text is not None:
        req.text = text
    elif token_ids is not None:
        req.token_ids.ids.extend(token_ids)
    elif chat is not None:
        for role, content in chat:
            req.chat.messages.add(role=role, content=content)
    s = req.sampling
    s.temperature = 0.0
    s.max_new_tokens = max_new_tokens
    if ignore_eos:
        s.ignore_eos = True
    s.stop.extend(stop)
    s.stop_token_ids.extend(stop_token_ids)
    for k, v in sampling.items():
        setattr(s, k, v)
    return req


class StreamResult:
    """What one GenerateStream call produced."""

    def __init__(self):
        self.deltas: list[str] = []
        self.delta_ids: list[list[int]] = []
        self.final = None  # the message carrying finish_reason
        self.code = SC.OK
        self.details = ""
        self.first_token_time: float | None = None
        self.start_time = time.monotonic()
        self.end_time: float | None = None
        self.messages_after_final = 0

    @property
    def text(self) -> str:
        return "".join(self.deltas)

    @property
    def token_ids(self) -> list[int]:
        return [t for d in self.delta_ids for t in d]

    @property
    def finish_reason(self):
        return None if self.final is None else self.final.finish_reason

    def describe(self) -> str:
        fr = "none" if self.final is None else finish_name(self.final.finish_reason)
        return (f"code={self.code.name} details={self.details!r} finish={fr} "
                f"tokens={len(self.token_ids)} text={self.text[:80]!r}")


def consume_stream(call, result: StreamResult | None = None, on_message=None) -> StreamResult:
    """Reads a GenerateStream call to its end. on_message(result) runs after each message."""
    r = result or StreamResult()
    try:
        for msg in call:
            if r.final is not None:
                r.messages_after_final += 1
            if msg.token_ids and r.first_token_time is None:
                r.first_token_time = time.monotonic()
            r.deltas.append(msg.text)
            r.delta_ids.append(list(msg.token_ids))
            if msg.finish_reason != FinishReason.FINISH_REASON_UNSPECIFIED:
                r.final = msg
            if on_message is not None:
                on_message(r)
    except grpc.RpcError as e:
        r.code = e.code()
        r.details = e.details() or ""
    r.end_time = time.monotonic()
    return r


def run_stream(stub, req, timeout=300.0) -> StreamResult:
    return consume_stream(stub.GenerateStream(req, timeout=timeout))


def call_code(fn):
    """(status code, details) of one call."""
    try:
        fn()
        return SC.OK, ""
    except grpc.RpcError as e:
        return e.code(), e.details() or ""


def run_unary(stub, req, timeout=300.0):
    """(response or None, status code, details)."""
    try:
        return stub.Generate(req, timeout=timeout), SC.OK, ""
    except grpc.RpcError as e:
        return None, e.code(), e.details() or ""


def run_ok(stub, req):
    """The response of a unary call that must succeed."""
    resp, code, details = run_unary(stub, req)
    expect(code == SC.OK, f"request failed: {code} {details}")
    return resp


def run_stream_ok(stub, req) -> StreamResult:
    """The result of a stream that must succeed with a final message."""
    r = run_stream(stub, req)
    expect(r.code == SC.OK and r.final is not None, f"stream failed: {r.describe()}")
    return r


def scrape_metrics(srv) -> dict[str, float]:
    """{series as written (name{labels}): value} of the server's /metrics."""
    url = f"http://127.0.0.1:{srv.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*(\{[^}]*\})?) (\S+)$", line)
        if m:
            out[m.group(1)] = float(m.group(3))
    return out


def in_threads(fns):
    """Runs each callable in its own thread at once; returns their results in order."""
    results = [None] * len(fns)
    errors = [None] * len(fns)
    barrier = threading.Barrier(len(fns))

    def body(i, fn):
        try:
            barrier.wait(timeout=30)
            results[i] = fn()
        except BaseException as e:  # noqa: BLE001 — reported to the caller
            errors[i] = e

    threads = [threading.Thread(target=body, args=(i, fn), daemon=True) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e in errors:
        if e is not None:
            raise e
    return results


# ----------------------------------------------------------------------------- checks
class Checks:
    """Runs named checks, keeps going after a failure, and exits nonzero if any failed."""

    def __init__(self, title: str):
        self.title = title
        self.failures: list[str] = []
        self.t0 = time.monotonic()

    def run(self, name, fn, *args, **kwargs):
        t0 = time.monotonic()
        print(f"=== {name}", flush=True)
        try:
            fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 — every failure is reported, then the next runs
            msg = f"{name}: {type(e).__name__}: {e}"
            self.failures.append(msg)
            print(f"FAIL {msg}", flush=True)
            traceback.print_exc()
            return False
        print(f"ok   {name} ({time.monotonic() - t0:.1f} s)", flush=True)
        return True

    def finish(self):
        dt = time.monotonic() - self.t0
        if self.failures:
            for srv in _SERVERS:
                print(srv.log_tail(60))
            print(f"\n{self.title}: {len(self.failures)} check(s) FAILED in {dt:.0f} s:")
            for f in self.failures:
                print("  - " + f.splitlines()[0])
            sys.exit(1)
        for srv in _SERVERS:
            srv.remove_log()
        print(f"\n{self.title}: all checks passed in {dt:.0f} s")
        sys.exit(0)


def expect(cond, msg):
    if not cond:
        raise AssertionError(msg)


def expect_eq(got, want, what):
    if got != want:
        raise AssertionError(f"{what}: got {got!r}, want {want!r}")


def wait_for(what, cond, timeout_s=60.0, interval_s=0.2):
    """Polls cond() until it returns something true (returned), or fails after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
