#!/usr/bin/env python3
"""Checks deploy/docker/Dockerfile without a Docker engine, against the README build.

  * every file the images copy exists: binaries from build/bin after the README build
    (`make build`), scripts and files from the repository; every command the image runs
    (ENTRYPOINT, HEALTHCHECK, the model init step) is one it copies;
  * `ldd` resolves every library of every copied binary ("not found" fails), and each one
    belongs to a Debian package of runtime-packages.txt or to what apt installs with them
    (their Depends and Pre-Depends, recursively, as this Debian 12 machine has them
    installed), or to an Essential package that every Debian image has; so do the tools the
    model init step runs;
  * both targets (cpu, cuda) build with RIDGESERVE_NATIVE=OFF, run as uid 1000, ship no model,
    and the CUDA architectures are a build argument passed to CMake;
  * .dockerignore keeps models, build trees and the virtual environment out of the context;
  * the slim runtime base's dpkg filters (debian:12-slim skips /usr/share/doc/* and the like)
    do not drop a file the init step reads, unless the Dockerfile lets it back in;
  * the ENTRYPOINT's default arguments are flags `ridgeserve --helpfull` lists, the
    HEALTHCHECK's are flags `ridgeserve-cli --helpfull` lists, and the HEALTHCHECK dials the
    port the default arguments serve on;
  * ridgeserve-model-init provides a model and maps from a path and from a URL (checksum
    checked), keeps what is on the volume, fails on a wrong checksum or a missing file, and
    waits while another init container holds the volume's lock.

Usage: check_image.py [BUILD_BIN_DIR]  (default: $RIDGESERVE_BIN, else build/bin)
"""

import fcntl
import fnmatch
import glob
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.abspath(os.path.join(HERE, "..", ".."))
DOCKERFILE = os.path.join(HERE, "Dockerfile")
PACKAGES = os.path.join(HERE, "runtime-packages.txt")
TARGETS = ("cpu", "cuda")
IMAGE_BIN = "/opt/ridgeserve/bin/"
# Commands scripts/fetch_model.sh, scripts/make_maps.sh, scripts/calibration_text.py and
# model-init.sh run, as the image's Debian has them.
INIT_TOOLS = ["/usr/bin/python3", "/usr/bin/unzip", "/usr/bin/sha256sum", "/usr/bin/bible",
              "/usr/bin/bash", "/usr/bin/cp", "/usr/bin/mv", "/usr/bin/mktemp",
              "/usr/bin/readlink", "/usr/bin/sleep", "/usr/bin/flock"]
JARGON = "/usr/share/doc/jargon-text/jargon.txt.gz"
# What the "slim" Debian images tell dpkg not to install (debuerreotype's
# scripts/.slimify-excludes, written to /etc/dpkg/dpkg.cfg.d/docker), but copyright files.
SLIM_EXCLUDES = ["/usr/share/doc/*", "/usr/share/groff/*", "/usr/share/info/*",
                 "/usr/share/linda/*", "/usr/share/lintian/overrides/*", "/usr/share/locale/*",
                 "/usr/share/man/*"]

failures = []


def check(name, fn):
    print(f"=== {name}", flush=True)
    try:
        fn()
    except AssertionError as e:
        failures.append(f"{name}: {e}")
        print(f"FAIL {name}: {e}", flush=True)
        return
    print(f"ok   {name}", flush=True)


def expect(cond, msg):
    if not cond:
        raise AssertionError(msg)


# ----------------------------------------------------------------------------- Dockerfile
def parse_dockerfile(path):
    """[(stage name, [(INSTRUCTION, arguments)])], continuation lines joined."""
    lines, cur = [], ""
    for raw in open(path, encoding="utf-8"):
        line = raw.rstrip("\n")
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        lines.append(cur + line)
        cur = ""
    stages = [("global", [])]
    for line in lines:
        word, _, rest = line.strip().partition(" ")
        word = word.upper()
        if word == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?", rest.strip(), re.IGNORECASE)
            stages.append((m.group(2) or f"stage{len(stages)}", [("FROM", m.group(1))]))
        else:
            stages[-1][1].append((word, rest.strip()))
    return stages


STAGES = dict(parse_dockerfile(DOCKERFILE))


def chain(target):
    """Instructions of TARGET with those of the stages it is built FROM, base first."""
    out = []
    name = target
    while name in STAGES:
        out = STAGES[name] + out
        name = STAGES[name][0][1]
    return out


def copies(target):
    """[(--from stage or None, [sources], destination)] of TARGET and its bases."""
    out = []
    for word, rest in chain(target):
        if word not in ("COPY", "ADD"):
            continue
        args = shlex.split(rest)
        src_stage = None
        while args[0].startswith("--"):
            if args[0].startswith("--from="):
                src_stage = args[0][len("--from="):]
            args.pop(0)
        out.append((src_stage, args[:-1], args[-1]))
    return out


def exec_form(rest):
    m = re.search(r"\[.*\]", rest)
    expect(m, f"not in exec form: {rest}")
    return [a.strip().strip('"') for a in m.group(0)[1:-1].split(",")]


def default_arg(name, target_args):
    return next((a for a in target_args if a.startswith(name)), None)


def helpfull_flags(binary):
    r = subprocess.run([binary, "--helpfull"], capture_output=True, text=True, timeout=60)
    flags = set(re.findall(r"^\s+--([a-z_0-9]+) \(", r.stdout + r.stderr, re.MULTILINE))
    expect(len(flags) > 5, f"could not read the flags of {binary} --helpfull")
    return flags


def flag_names(args):
    """Flag names of an argument list in `--flag value` or `--flag=value` form."""
    return [a[2:].split("=", 1)[0] for a in args if a.startswith("--")]


def image_commands(target):
    """Program names the image runs: ENTRYPOINT, HEALTHCHECK CMD."""
    cmds = []
    for word, rest in chain(target):
        if word == "ENTRYPOINT":
            cmds.append(exec_form(rest)[0])
        if word == "HEALTHCHECK":
            cmds.append(exec_form(rest.split("CMD", 1)[1])[0])
    return cmds


def copied_binaries(target, bin_dir):
    """{name in the image: path after the README build} of binaries copied from build/bin."""
    out = {}
    for src_stage, sources, dest in copies(target):
        for s in sources:
            if src_stage and src_stage.startswith("build") and "/build/bin/" in s:
                out[os.path.basename(s)] = os.path.join(bin_dir, os.path.basename(s))
    return out


# ----------------------------------------------------------------------------- dpkg
def _installed_db():
    """{installed package: (depends, essential)} from one dpkg-query."""
    r = subprocess.run(["dpkg-query", "-W", "-f=${Package}\t${Status}\t${Depends}, "
                        "${Pre-Depends}\t${Essential}\n"],
                       capture_output=True, text=True, check=True)
    db = {}
    for line in r.stdout.splitlines():
        name, status, deps, essential = line.split("\t")
        if "install ok installed" in status:
            db[name] = (deps, essential == "yes")
    return db


DPKG = _installed_db()


def installed(pkg):
    return pkg in DPKG


def depends(pkg):
    out = []
    for clause in DPKG[pkg][0].split(","):
        alts = [a.strip().split(" ")[0].split(":")[0] for a in clause.split("|") if a.strip()]
        out.extend(a for a in alts if installed(a))
    return out


def closure(seeds):
    seen, todo = set(), list(seeds)
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        if installed(p):
            todo.extend(depends(p))
    return seen


def essential_packages():
    return {p for p, (_, essential) in DPKG.items() if essential}


def dpkg_owners(paths):
    """{path: owning package or None}; merged /usr: a path is tried with and without /usr,
    and resolved."""
    variants = {}
    for path in paths:
        v = [path, os.path.realpath(path)]
        v.append(path[len("/usr"):] if path.startswith("/usr/") else "/usr" + path)
        variants[path] = v
    every = sorted({v for vs in variants.values() for v in vs})
    r = subprocess.run(["dpkg-query", "-S", *every], capture_output=True, text=True)
    owner = {}
    for line in r.stdout.splitlines():
        pkgs, _, path = line.partition(": ")
        owner.setdefault(path.strip(), pkgs.split(",")[0].split(":")[0].strip())
    return {p: next((owner[v] for v in vs if v in owner), None) for p, vs in variants.items()}


def runtime_packages():
    return [line.strip() for line in open(PACKAGES, encoding="utf-8")
            if line.strip() and not line.startswith("#")]


def ldd_libraries(binary):
    r = subprocess.run(["ldd", binary], capture_output=True, text=True)
    expect(r.returncode == 0, f"ldd {binary}: {r.stderr.strip()}")
    libs = []
    for line in r.stdout.splitlines():
        expect("not found" not in line, f"{os.path.basename(binary)}: {line.strip()}")
        m = re.search(r"=>\s*(/\S+)", line) or re.match(r"\s*(/\S+)", line)
        if m:
            libs.append(m.group(1))
    return libs


# ----------------------------------------------------------------------------- checks
def main():
    bin_dir = (sys.argv[1] if len(sys.argv) > 1 else
               os.environ.get("RIDGESERVE_BIN", os.path.join(SOURCE_DIR, "build", "bin")))
    expect_targets = [t for t in TARGETS if t not in STAGES]
    if expect_targets:
        sys.exit(f"check_image.py: no stage {expect_targets} in {DOCKERFILE}")

    def files_exist():
        for target in TARGETS:
            bins = copied_binaries(target, bin_dir)
            expect({"ridgeserve", "ridgeserve-cli", "ridgeserve-calibrate"} <= set(bins),
                   f"{target}: copies {sorted(bins)}")
            for name, path in bins.items():
                expect(os.access(path, os.X_OK),
                       f"{target}: {path} missing after the README build (make build)")
            for src_stage, sources, _ in copies(target):
                if src_stage is None:
                    for s in sources:
                        if s.startswith(("http://", "https://")):
                            continue
                        expect(glob.glob(os.path.join(SOURCE_DIR, s)),
                               f"{target}: COPY {s}: not in the repository")
                elif src_stage.startswith("build"):
                    for s in sources:
                        if s.startswith("/src/") and "/build/" not in s:
                            rel = s[len("/src/"):]
                            expect(os.path.exists(os.path.join(SOURCE_DIR, rel)),
                                   f"{target}: COPY --from={src_stage} {s}: not in the repo")
            in_image = set(bins) | {"ridgeserve-model-init"}
            for cmd in image_commands(target):
                expect(cmd in in_image, f"{target}: runs {cmd}, which it does not copy")

    def libraries_in_packages():
        pkgs = runtime_packages()
        known = closure(pkgs) | closure(essential_packages())
        for p in pkgs:
            expect(installed(p) or apt_knows(p), f"{PACKAGES}: unknown Debian package {p}")
        libs = {}  # library path: binaries needing it
        # The CUDA toolkit's libraries (only the cuda target's rs_backend_cuda.so needs them)
        # come from NVIDIA's packages, which the cuda stage installs by name.
        cuda_packages = {"libcudart": "cuda-cudart-", "libcublas": "libcublas-",
                         "libnccl": "libnccl2"}
        for target in TARGETS:
            for name, path in copied_binaries(target, bin_dir).items():
                for lib in ldd_libraries(path):
                    if lib.startswith("/usr/local/cuda/"):
                        base = os.path.basename(lib)
                        pkg = next((v for k, v in cuda_packages.items() if base.startswith(k)),
                                   None)
                        stage_text = " ".join(rest for _, rest in chain(target))
                        expect(target == "cuda" and pkg is not None and pkg in stage_text,
                               f"{target}: {name} needs {base}, which its stage does not "
                               "install")
                        continue
                    libs.setdefault(lib, set()).add(name)
        owners = dpkg_owners(list(libs) + INIT_TOOLS + [JARGON])
        needed = set()
        for lib, names in sorted(libs.items()):
            owner = owners[lib]
            who = ", ".join(sorted(names))
            expect(owner is not None, f"{who}: {lib} belongs to no Debian package")
            expect(owner in known, f"{who}: {lib} is in {owner}, which "
                   f"{os.path.basename(PACKAGES)} does not bring in")
            needed.add(owner)
        for tool in INIT_TOOLS + [JARGON]:
            expect(owners[tool] is not None, f"model init: {tool} is not installed here")
            expect(owners[tool] in known,
                   f"model init: {tool} is in {owners[tool]}, not in the runtime set")
        print(f"  {len(needed)} packages hold the binaries' libraries: {' '.join(sorted(needed))}")

    def build_settings():
        for target, build in (("cpu", "build-cpu"), ("cuda", "build-cuda")):
            runs = [rest for word, rest in chain(build) if word == "RUN"]
            cmake = [r for r in runs if "cmake -S" in r]
            expect(cmake and all("-DRIDGESERVE_NATIVE=OFF" in r for r in cmake),
                   f"{build}: cmake without -DRIDGESERVE_NATIVE=OFF")
            users = [rest for word, rest in chain(target) if word == "USER"]
            expect(users and users[-1] in ("1000", "1000:1000"),
                   f"{target}: runs as {users[-1] if users else 'root'}, not uid 1000")
            for src_stage, sources, dest in copies(target):
                for s in sources:
                    expect(not re.search(r"models|\.gguf$|\.safetensors$|\.rfmap$", s),
                           f"{target}: copies a model ({s})")
            entry = [exec_form(r) for w, r in chain(target) if w == "ENTRYPOINT"]
            expect(entry and entry[-1] == ["ridgeserve"], f"{target}: ENTRYPOINT {entry}")
            health = [r for w, r in chain(target) if w == "HEALTHCHECK"]
            expect(health and exec_form(health[-1].split("CMD", 1)[1])[-1] == "health",
                   f"{target}: HEALTHCHECK is not `ridgeserve-cli ... health`")
        cuda_args = [r for w, r in STAGES["build-cuda"] if w == "ARG"]
        expect("CUDA_ARCHITECTURES" in cuda_args, "build-cuda does not take CUDA_ARCHITECTURES")
        expect(any('-DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES}"' in r
                   for w, r in STAGES["build-cuda"] if w == "RUN"),
               "build-cuda does not pass CUDA_ARCHITECTURES to CMake")
        expect(any(w == "ARG" and r.startswith("CUDA_ARCHITECTURES=") for w, r in STAGES["global"]),
               "no default CUDA_ARCHITECTURES")

    def dockerignore():
        path = os.path.join(SOURCE_DIR, ".dockerignore")
        expect(os.path.exists(path), ".dockerignore missing")
        entries = {line.strip() for line in open(path) if line.strip() and line[0] != "#"}
        for want in ("models", "build", ".venv", "*.gguf"):
            expect(want in entries, f".dockerignore does not exclude {want}")

    def slim_keeps_init_files():
        runtime_from = STAGES["runtime-base"][0][1]
        default = next(r.split("=", 1)[1] for w, r in STAGES["global"]
                       if w == "ARG" and r.startswith(runtime_from.strip("${}") + "="))
        expect("slim" in default, f"runtime base {default}: not a slim image (update this check)")
        runs = [r for w, r in STAGES["runtime-base"] if w == "RUN"]
        install = next(i for i, r in enumerate(runs) if "apt-get install" in r)
        includes = [m for r in runs[:install] for m in re.findall(r"path-include=(\S+?)'?\s", r + " ")]
        for path in INIT_TOOLS + [JARGON]:
            for pattern in SLIM_EXCLUDES:
                if fnmatch.fnmatch(path, pattern):
                    expect(any(fnmatch.fnmatch(path, inc) for inc in includes),
                           f"{default} does not install {path} ({pattern} is excluded) and "
                           f"the Dockerfile does not path-include it before apt-get install")

    def default_args_are_flags():
        server = helpfull_flags(os.path.join(bin_dir, "ridgeserve"))
        cli = helpfull_flags(os.path.join(bin_dir, "ridgeserve-cli"))
        for target in TARGETS:
            cmd = [exec_form(r) for w, r in chain(target) if w == "CMD"][-1]
            unknown = sorted(set(flag_names(cmd)) - server)
            expect(not unknown, f"{target}: CMD passes --{', --'.join(unknown)}, not ridgeserve flags")
            health = exec_form([r for w, r in chain(target) if w == "HEALTHCHECK"][-1]
                               .split("CMD", 1)[1])
            unknown = sorted(set(flag_names(health)) - cli)
            expect(not unknown, f"{target}: HEALTHCHECK passes --{', --'.join(unknown)}, "
                   "not ridgeserve-cli flags")
            port = cmd[cmd.index("--port") + 1]
            target_addr = health[health.index("--target") + 1]
            expect(target_addr.endswith(":" + port),
                   f"{target}: HEALTHCHECK dials {target_addr}, the server listens on {port}")

    def model_init():
        check_model_init(bin_dir)

    check("every copied file exists after the README build", files_exist)
    check("ldd: every library is in the runtime package set", libraries_in_packages)
    check("targets: NATIVE=OFF, uid 1000, no model, CUDA architectures", build_settings)
    check(".dockerignore", dockerignore)
    check("the slim runtime base keeps every file the init step reads", slim_keeps_init_files)
    check("CMD and HEALTHCHECK pass flags the binaries know", default_args_are_flags)
    check("ridgeserve-model-init: path, url, volume, checksum, lock", model_init)
    print(f"\ncheck_image: {7 - len(failures)} passed, {len(failures)} failed")
    sys.exit(1 if failures else 0)


def apt_knows(pkg):
    if not glob.glob("/var/lib/apt/lists/*Packages*"):
        print(f"  (no apt lists here: {pkg} is not installed and cannot be looked up)")
        return True
    return subprocess.run(["apt-cache", "show", pkg], capture_output=True).returncode == 0


# ----------------------------------------------------------------------------- model init
def check_model_init(bin_dir):
    """Runs model-init.sh in a copy of the image's /opt/ridgeserve layout."""
    with tempfile.TemporaryDirectory(prefix="rs_model_init_") as tmp:
        root = os.path.join(tmp, "opt")
        os.makedirs(os.path.join(root, "bin"))
        os.makedirs(os.path.join(root, "models"))
        shutil.copytree(os.path.join(SOURCE_DIR, "scripts"), os.path.join(root, "scripts"))
        init = os.path.join(root, "bin", "ridgeserve-model-init")
        shutil.copy2(os.path.join(HERE, "model-init.sh"), init)
        src = os.path.join(tmp, "src")
        os.makedirs(src)
        model_bytes = b"GGUF not really a model"
        with open(os.path.join(src, "m.gguf"), "wb") as f:
            f.write(model_bytes)
        with open(os.path.join(src, "m.rfmap"), "wb") as f:
            f.write(b"maps")
        sha = hashlib.sha256(model_bytes).hexdigest()
        models = os.path.join(root, "models")

        def run(**env):
            full = {"PATH": os.environ["PATH"], "HOME": tmp, "MODEL_FILE": "m.gguf",
                    "MAPS_FILE": "m.rfmap", **env}
            return subprocess.run([init], env=full, capture_output=True, text=True)

        r = run(MODEL_SOURCE="path", MODEL_PATH=os.path.join(src, "m.gguf"), MAPS_SOURCE="url",
                MAPS_URL="file://" + os.path.join(src, "m.rfmap"))
        expect(r.returncode == 0, f"path + url: exit {r.returncode}: {r.stderr}")
        expect(open(os.path.join(models, "m.gguf"), "rb").read() == model_bytes, "path: content")
        expect(open(os.path.join(models, "m.rfmap"), "rb").read() == b"maps", "url: content")
        # What is on the volume is kept: a second run with sources that would fail is a no-op.
        r = run(MODEL_SOURCE="url", MODEL_URL="file:///nonexistent", MAPS_SOURCE="volume")
        expect(r.returncode == 0 and "exists" in r.stderr, f"rerun: {r.returncode} {r.stderr}")
        os.remove(os.path.join(models, "m.gguf"))
        r = run(MODEL_SOURCE="url", MODEL_URL="file://" + os.path.join(src, "m.gguf"),
                MODEL_SHA256="0" * 64, MAPS_SOURCE="none")
        expect(r.returncode != 0 and "sha256" in r.stderr, f"bad sha: {r.returncode} {r.stderr}")
        expect(not os.path.exists(os.path.join(models, "m.gguf")), "bad sha left the model")
        r = run(MODEL_SOURCE="url", MODEL_URL="file://" + os.path.join(src, "m.gguf"),
                MODEL_SHA256=sha, MAPS_SOURCE="none")
        expect(r.returncode == 0, f"good sha: {r.returncode} {r.stderr}")
        os.remove(os.path.join(models, "m.rfmap"))
        r = run(MODEL_SOURCE="volume", MAPS_SOURCE="volume")
        expect(r.returncode != 0 and "not on the volume" in r.stderr,
               f"missing maps, source volume: {r.returncode} {r.stderr}")
        leftovers = [n for n in os.listdir(models) if n.endswith(".partial")]
        expect(not leftovers, f"partial files left: {leftovers}")
        # A second pod's init container waits while the first holds the volume's lock.
        os.remove(os.path.join(models, "m.gguf"))
        with open(os.path.join(models, ".ridgeserve-model-init.lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            full = {"PATH": os.environ["PATH"], "HOME": tmp, "MODEL_FILE": "m.gguf",
                    "MODEL_SOURCE": "path", "MODEL_PATH": os.path.join(src, "m.gguf"),
                    "MAPS_SOURCE": "none"}
            p = subprocess.Popen([init], env=full, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
            # Its stderr, read as it comes: the lock is released once it says it waits.
            lines, waiting = [], threading.Event()

            def read_stderr():
                for line in p.stderr:
                    lines.append(line)
                    if "waiting for its lock" in line:
                        waiting.set()

            reader = threading.Thread(target=read_stderr, daemon=True)
            reader.start()
            for _ in range(600):  # until it says so, or exits
                if waiting.wait(0.1) or p.poll() is not None:
                    break
            said = waiting.is_set()
            expect(said and p.poll() is None,
                   f"not waiting while the lock was held: {p.poll()} {''.join(lines)}")
            expect(not os.path.exists(os.path.join(models, "m.gguf")),
                   "wrote the model while another held the lock")
            fcntl.flock(lock, fcntl.LOCK_UN)
        p.wait(timeout=30)
        reader.join(30)
        err = "".join(lines)
        expect(p.returncode == 0, f"after the lock: {p.returncode} {err}")
        expect(open(os.path.join(models, "m.gguf"), "rb").read() == model_bytes,
               "model after the lock")


if __name__ == "__main__":
    main()
