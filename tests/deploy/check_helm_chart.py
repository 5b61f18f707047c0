"""The Helm chart in helm/ridgeserve renders, validates and says what operators rely on.

No cluster: Helm's own Go code renders the chart (PyPI helm-python-sdk, Helm v4 as a C
library), for the chart's defaults and every values file in helm/ridgeserve/ci/. Then:
  * `helm lint --strict` finds nothing above info; yamllint passes the chart's YAML files and
    every rendered manifest;
  * every rendered object validates against the Kubernetes JSON schemas of the newest
    Kubernetes kubernetes-validate ships (strict: an unknown field fails); ServiceMonitor,
    PrometheusRule and ScaledObject against models generated from the Prometheus Operator's
    and KEDA's CRDs (cloudcoil), with no field dropped; the PrometheusRule's groups pass
    `promtool check rules`;
  * operator assertions: nvidia.com/gpu equals tensorParallel on cuda and is absent on cpu;
    all three probes are gRPC probes of grpc.health.v1 on the port --port names; /dev/shm is
    a memory volume exactly when tensorParallel > 1; the grace period exceeds the preStop
    sleep plus --shutdown_timeout_s plus the server's abort and exit, and liveness tolerates a
    whole drain; rollouts take a pod down before its replacement needs its GPUs; container ports
    equal --port / --metrics_port and the Services target them; every flag the chart passes
    is one `ridgeserve --helpfull` lists; the dashboard ConfigMap and PrometheusRule equal
    deploy/grafana and deploy/prometheus/rules (through links, not copies); the ServiceMonitor
    gives job="ridgeserve", which the alerts select; autoscaling reads
    ridgeserve_num_requests_waiting; pods run as the image's uid 1000, read-only, unprivileged;
  * `helm package` keeps the linked files: the archive renders the same objects;
  * values.schema.json rejects tensorParallel 0 (and TP > 1 on cpu, a typo'd key) with a
    message naming the key, and a values file with a wrong type gets Helm's schema error
    from render, not a manifest.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "server"))

from rs_testlib import BIN_DIR, SOURCE_DIR, Checks, expect, expect_eq  # noqa: E402

import helm_python as helm  # noqa: E402
import kubernetes_validate  # noqa: E402
import kubernetes_validate.utils  # noqa: E402
import yaml  # noqa: E402
from cloudcoil.models.keda import v1alpha1 as keda  # noqa: E402
from cloudcoil.models.prometheus_operator import v1 as prom  # noqa: E402
from yamllint import config as yamllint_config  # noqa: E402
from yamllint import linter as yamllint_linter  # noqa: E402

CHART = os.path.join(SOURCE_DIR, "helm", "ridgeserve")
CI_DIR = os.path.join(CHART, "ci")
BAD_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "helm-values")
DEPLOY = os.path.join(SOURCE_DIR, "deploy")
RULE_FILES = ["ridgeserve-recording.yml", "ridgeserve-alerts.yml"]
RELEASE, NAMESPACE = "rs", "ml"
K8S_VERSION = kubernetes_validate.utils.latest_version()
CRD_MODELS = {"ServiceMonitor": prom.ServiceMonitor, "PrometheusRule": prom.PrometheusRule,
              "ScaledObject": keda.ScaledObject}
MIN_STARTUP_SECONDS = 1800  # load + warm-up of a 27B model
# After --shutdown_timeout_s the server gives aborted calls kAbortGrace (3 s) and the gRPC
# shutdown kShutdownGrace (1 s) before it exits (server/main.cc).
SERVER_EXIT_SECONDS = 4


# ----------------------------------------------------------------------------- rendering
def load_values(path):
    """A values file as `helm -f` reads it (Helm's own YAML parser)."""
    with open(path, encoding="utf-8") as f:
        return helm.values_from_yaml(f.read())


_chart = None


def chart():
    """The chart, loaded once (Helm logs each link it follows in files/ at every load)."""
    global _chart
    if _chart is None:
        _chart = helm.Chart.load(CHART)
    return _chart


def render(values):
    """{template path: manifest text} (NOTES.txt included) for release rs in namespace ml."""
    return chart().render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)


def objects(manifests):
    out = []
    for path, text in sorted(manifests.items()):
        if path.endswith(".yaml"):
            out.extend(d for d in yaml.safe_load_all(text) if d)
    return out


class Release:
    """One rendered release: its objects, the server container and its flags."""

    def __init__(self, name, values):
        self.name = name
        self.values = chart().merge_values(values)
        self.manifests = render(values)
        self.objects = objects(self.manifests)
        deployments = self.of_kind("Deployment")
        expect_eq(len(deployments), 1, f"{name}: Deployments")
        self.deployment = deployments[0]
        self.pod = self.deployment["spec"]["template"]["spec"]
        self.server = next(c for c in self.pod["containers"] if c["name"] == "ridgeserve")
        self.flags = {}
        for arg in self.server["args"]:
            m = re.fullmatch(r"--([a-z_]+)=(.*)", arg)
            expect(m, f"{name}: argument {arg!r} is not --flag=value")
            self.flags[m.group(1)] = m.group(2)

    def of_kind(self, kind):
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind):
        found = self.of_kind(kind)
        expect_eq(len(found), 1, f"{self.name}: number of {kind}")
        return found[0]


def releases():
    out = {"chart defaults": Release("chart defaults", None)}
    for f in sorted(os.listdir(CI_DIR)):
        out[f] = Release(f, load_values(os.path.join(CI_DIR, f)))
    expect({"default-values.yaml", "cpu-values.yaml", "cuda-tp1-values.yaml",
            "cuda-tp2-values.yaml", "all-on-values.yaml"} <= set(out),
           f"ci/ values files: {sorted(out)}")
    return out


# ----------------------------------------------------------------------------- checks
def check_lint():
    for f in [None] + sorted(os.listdir(CI_DIR)):
        values = None if f is None else load_values(os.path.join(CI_DIR, f))
        report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE)
        bad = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
        expect(not bad, f"helm lint {f or 'defaults'}: {bad}")


def yamllint_problems(text, conf, name):
    return [f"{name}:{p.line}:{p.column} {p.desc} ({p.rule})"
            for p in yamllint_linter.run(text, conf) if p.level == "error"]


def check_yamllint(rels):
    chart_conf_path = os.path.join(CHART, ".yamllint")
    conf = yamllint_config.YamlLintConfig(file=chart_conf_path)
    problems = []
    for root, _, files in os.walk(CHART):
        for f in files:
            path = os.path.join(root, f)
            rel = os.path.relpath(path, CHART)
            if f.endswith((".yaml", ".yml")) and not conf.is_file_ignored(rel):
                with open(path, encoding="utf-8") as fh:
                    problems += yamllint_problems(fh.read(), conf, rel)
    rendered = yamllint_config.YamlLintConfig(
        f"extends: {chart_conf_path}\nrules:\n  line-length: disable\n")
    for rel in rels.values():
        for path, text in rel.manifests.items():
            if path.endswith(".yaml") and text.strip():
                problems += yamllint_problems(text.strip() + "\n", rendered,
                                              f"{rel.name}: {path}")
    expect(not problems, "yamllint:\n  " + "\n  ".join(problems))


def check_kubernetes_schemas(rels):
    print(f"  Kubernetes {K8S_VERSION} schemas (kubernetes-validate, strict)")
    counts = {}
    for rel in rels.values():
        for obj in rel.objects:
            what = f"{rel.name}: {obj['kind']}/{obj['metadata']['name']}"
            model = CRD_MODELS.get(obj["kind"])
            if model is not None:
                back = model.model_validate(obj).model_dump(by_alias=True, exclude_unset=True,
                                                            mode="json")
                expect(back == obj, f"{what}: fields the CRD does not know: "
                       f"{diff_keys(obj, back)}")
            else:
                try:
                    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
                except kubernetes_validate.ValidationError as e:
                    raise AssertionError(f"{what}: {'.'.join(map(str, e.path))}: {e.message}")
            counts[obj["kind"]] = counts.get(obj["kind"], 0) + 1
    print("  validated: " + ", ".join(f"{k} x{n}" for k, n in sorted(counts.items())))
    for kind in ("Deployment", "Service", "PersistentVolumeClaim", "PodDisruptionBudget",
                 "ServiceAccount", "ConfigMap", "ServiceMonitor", "PrometheusRule",
                 "ScaledObject"):
        expect(kind in counts, f"no values file renders a {kind}")


def diff_keys(a, b, prefix=""):
    if isinstance(a, dict) and isinstance(b, dict):
        out = [prefix + k for k in a if k not in b]
        for k in a:
            if k in b:
                out += diff_keys(a[k], b[k], f"{prefix}{k}.")
        return out
    if isinstance(a, list) and isinstance(b, list):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in diff_keys(x, y, f"{prefix}{i}.")]
    return [] if a == b else [prefix.rstrip(".") + f" ({a!r} != {b!r})"]


def helpfull_flags():
    out = subprocess.run([os.path.join(BIN_DIR, "ridgeserve"), "--helpfull"],
                         capture_output=True, text=True, timeout=60)
    flags = set(re.findall(r"^\s+--([a-z_0-9]+) \(", out.stdout + out.stderr, re.MULTILINE))
    expect({"port", "metrics_port", "shutdown_timeout_s", "tensor_parallel"} <= flags,
           f"could not read the flags of ridgeserve --helpfull: {sorted(flags)}")
    return flags


def check_flags_known(rels):
    known = helpfull_flags()
    for rel in rels.values():
        unknown = sorted(set(rel.flags) - known)
        expect(not unknown, f"{rel.name}: ridgeserve does not know --{', --'.join(unknown)}")
        v = rel.values
        expect_eq(rel.flags["backend"], v["backend"], f"{rel.name}: --backend")
        expect_eq(int(rel.flags["tensor_parallel"]), v["tensorParallel"],
                  f"{rel.name}: --tensor_parallel")
        expect_eq(rel.flags["model"], "/models/" + v["model"]["file"], f"{rel.name}: --model")
        if v["maps"]["source"] == "none":
            expect("ridgefill_maps" not in rel.flags, f"{rel.name}: maps none but --ridgefill_maps")
        else:
            expect_eq(rel.flags["ridgefill_maps"], "/models/" + v["maps"]["file"],
                      f"{rel.name}: --ridgefill_maps")
        expect_eq(int(rel.flags["shutdown_timeout_s"]), v["server"]["shutdownTimeoutSeconds"],
                  f"{rel.name}: --shutdown_timeout_s")
        expect_eq(int(rel.flags["step_timeout_s"]), v["server"]["stepTimeoutSeconds"],
                  f"{rel.name}: --step_timeout_s")
        for extra in v["server"]["extraArgs"]:
            expect(extra in rel.server["args"], f"{rel.name}: extra arg {extra} not passed")


def check_gpus(rels):
    for rel in rels.values():
        tp = rel.values["tensorParallel"]
        for c in rel.pod["containers"] + rel.pod.get("initContainers", []):
            res = c.get("resources", {})
            gpus = {k: r.get("nvidia.com/gpu") for k, r in res.items()}
            if rel.values["backend"] == "cuda" and c is rel.server:
                expect_eq(gpus.get("limits"), tp, f"{rel.name}: nvidia.com/gpu limit")
                expect(gpus.get("requests") in (None, tp), f"{rel.name}: GPU request {gpus}")
            else:
                expect(all(g is None for g in gpus.values()),
                       f"{rel.name}: {c['name']} asks for GPUs: {gpus}")
    expect_eq(rels["cuda-tp2-values.yaml"].server["resources"]["limits"]["nvidia.com/gpu"], 2,
              "TP=2 GPUs")


def container_port(rel, name):
    ports = {p["name"]: p["containerPort"] for p in rel.server["ports"]}
    expect(name in ports, f"{rel.name}: no container port {name}: {ports}")
    return ports[name]


def check_probes(rels):
    for rel in rels.values():
        grpc_port = int(rel.flags["port"])
        expect_eq(container_port(rel, "grpc"), grpc_port, f"{rel.name}: grpc containerPort")
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = rel.server.get(kind)
            expect(probe is not None, f"{rel.name}: no {kind}")
            handlers = {"grpc", "httpGet", "tcpSocket", "exec"} & set(probe)
            expect_eq(handlers, {"grpc"}, f"{rel.name}: {kind} handler")
            # "" is the server's overall health in grpc.health.v1, the one ridgeserve sets.
            expect_eq(probe["grpc"], {"port": grpc_port, "service": ""}, f"{rel.name}: {kind}")
        startup = rel.server["startupProbe"]
        window = startup["periodSeconds"] * startup["failureThreshold"]
        expect(window >= MIN_STARTUP_SECONDS,
               f"{rel.name}: startup probe gives up after {window} s < {MIN_STARTUP_SECONDS} s")


def check_shm(rels):
    for rel in rels.values():
        tp = rel.values["tensorParallel"]
        mounts = [m for m in rel.server["volumeMounts"] if m["mountPath"] == "/dev/shm"]
        if tp > 1:
            expect_eq(len(mounts), 1, f"{rel.name}: TP={tp}: /dev/shm mounts")
            vol = next(v for v in rel.pod["volumes"] if v["name"] == mounts[0]["name"])
            expect_eq(vol.get("emptyDir", {}).get("medium"), "Memory",
                      f"{rel.name}: /dev/shm medium")
        else:
            expect(not mounts, f"{rel.name}: TP=1 but /dev/shm is mounted")
            expect(not any(v.get("emptyDir", {}).get("medium") == "Memory"
                           for v in rel.pod["volumes"]), f"{rel.name}: TP=1 memory volume")
    expect(any(r.values["tensorParallel"] > 1 for r in rels.values()), "no TP > 1 case")


def check_drain(rels):
    for rel in rels.values():
        timeout = int(rel.flags["shutdown_timeout_s"])
        command = rel.server["lifecycle"]["preStop"]["exec"]["command"]
        expect_eq(command[0], "sleep", f"{rel.name}: preStop")
        pre_stop = int(command[1])
        grace = rel.pod["terminationGracePeriodSeconds"]
        expect(grace > pre_stop + timeout + SERVER_EXIT_SECONDS,
               f"{rel.name}: grace {grace} s <= preStop {pre_stop} s + shutdown {timeout} s "
               f"+ {SERVER_EXIT_SECONDS} s to abort and exit")
        live = rel.server["livenessProbe"]
        expect(live["periodSeconds"] * live["failureThreshold"] > pre_stop + timeout,
               f"{rel.name}: liveness would kill a {pre_stop + timeout} s drain")


def check_rollout(rels):
    # A surge pod would wait for the GPUs (and a ReadWriteOnce volume) the old pod holds.
    for rel in rels.values():
        strategy = rel.deployment["spec"]["strategy"]
        expect_eq(strategy, {"type": "RollingUpdate",
                             "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
                  f"{rel.name}: update strategy")
    recreate = Release("strategy Recreate", {"strategy": {"type": "Recreate"}})
    expect_eq(recreate.deployment["spec"]["strategy"], {"type": "Recreate"},
              "Recreate without rollingUpdate")
    kubernetes_validate.validate(recreate.deployment, K8S_VERSION, strict=True)


def check_services(rels):
    for rel in rels.values():
        pod_labels = rel.deployment["spec"]["template"]["metadata"]["labels"]
        main = next(s for s in rel.of_kind("Service") if "clusterIP" not in s["spec"])
        ports = {p["name"]: p for p in main["spec"]["ports"]}
        expect_eq(ports["grpc"]["appProtocol"], "grpc", f"{rel.name}: grpc appProtocol")
        expect_eq(ports["grpc"]["targetPort"], "grpc", f"{rel.name}: grpc targetPort")
        expect_eq(ports["metrics"]["targetPort"], "metrics", f"{rel.name}: metrics targetPort")
        expect_eq(container_port(rel, "metrics"), int(rel.flags["metrics_port"]),
                  f"{rel.name}: metrics containerPort vs --metrics_port")
        for svc in rel.of_kind("Service"):
            sel = svc["spec"]["selector"]
            expect(sel.items() <= pod_labels.items(), f"{rel.name}: {svc['metadata']['name']} "
                   f"selects {sel}, pods have {pod_labels}")
        headless = [s for s in rel.of_kind("Service") if s["spec"].get("clusterIP") == "None"]
        expect_eq(len(headless), 1 if rel.values["service"]["headless"] else 0,
                  f"{rel.name}: headless Services")
        for pdb in rel.of_kind("PodDisruptionBudget"):
            sel = pdb["spec"]["selector"]["matchLabels"]
            expect(sel.items() <= pod_labels.items(), f"{rel.name}: PDB selects {sel}")
        notes = rel.manifests.get("ridgeserve/templates/NOTES.txt", "")
        expect("L7" in notes and "round_robin" in notes, f"{rel.name}: NOTES.txt on balancing")


def deploy_rule_groups():
    groups = []
    for f in RULE_FILES:
        with open(os.path.join(DEPLOY, "prometheus", "rules", f), encoding="utf-8") as fh:
            groups += yaml.safe_load(fh)["groups"]
    return groups


def check_monitoring_one_source(rels):
    # The chart reads deploy/ through links: no second copy to drift.
    links = {os.path.join("files", "grafana", "ridgeserve.json"):
             os.path.join(DEPLOY, "grafana", "ridgeserve.json")}
    for f in RULE_FILES:
        links[os.path.join("files", "prometheus", f)] = os.path.join(DEPLOY, "prometheus",
                                                                     "rules", f)
    for rel_path, target in links.items():
        path = os.path.join(CHART, rel_path)
        expect(os.path.islink(path), f"{rel_path} is not a link to {target}")
        expect_eq(os.path.realpath(path), os.path.realpath(target), f"{rel_path} target")
    rel = rels["all-on-values.yaml"]
    (cm,) = [c for c in rel.of_kind("ConfigMap") if "ridgeserve.json" in c.get("data", {})]
    with open(os.path.join(DEPLOY, "grafana", "ridgeserve.json"), encoding="utf-8") as f:
        dashboard = f.read()
    expect_eq(cm["data"]["ridgeserve.json"], dashboard.rstrip("\n"), "dashboard ConfigMap text")
    expect_eq(json.loads(cm["data"]["ridgeserve.json"]), json.loads(dashboard), "dashboard JSON")
    expect_eq(cm["metadata"]["labels"].get("grafana_dashboard"), "1", "sidecar label")
    rule = rel.one("PrometheusRule")
    expect_eq(rule["spec"]["groups"], deploy_rule_groups(), "PrometheusRule groups")
    # `helm package` stores the links' content: the archive renders the same objects.
    with tempfile.TemporaryDirectory() as tmp:
        archive = helm.package(CHART, destination=tmp)
        with open(archive, "rb") as f, helm.Chart.load_archive(f.read()) as packaged:
            values = load_values(os.path.join(CI_DIR, "all-on-values.yaml"))
            again = objects(packaged.render(values, name=RELEASE, namespace=NAMESPACE))
    expect(again == rel.objects, "the packaged chart renders other objects")
    promtool = shutil.which("promtool")
    if promtool:
        with tempfile.NamedTemporaryFile("w", suffix=".yml") as f:
            yaml.safe_dump({"groups": rule["spec"]["groups"]}, f)
            f.flush()
            r = subprocess.run([promtool, "check", "rules", f.name], capture_output=True,
                               text=True)
            expect(r.returncode == 0, f"promtool check rules: {r.stdout} {r.stderr}")
    else:
        print("  (no promtool here: rule syntax not checked)")
    # The ServiceMonitor scrapes the metrics port as job="ridgeserve", what the alerts select.
    sm = rel.one("ServiceMonitor")
    (endpoint,) = sm["spec"]["endpoints"]
    svc = next(s for s in rel.of_kind("Service") if "clusterIP" not in s["spec"])
    expect(endpoint["port"] in {p["name"] for p in svc["spec"]["ports"]}, "ServiceMonitor port")
    expect(sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items(),
           "ServiceMonitor does not select the Service")
    job = [r["replacement"] for r in endpoint["relabelings"] if r["targetLabel"] == "job"]
    alerts = yaml.dump(deploy_rule_groups())
    selected = set(re.findall(r'job="([^"]+)"', alerts))
    expect(selected and job == sorted(selected), f"ServiceMonitor job {job}, rules use {selected}")
    for other in rels.values():
        if not other.values["serviceMonitor"]["enabled"]:
            expect(not other.of_kind("ServiceMonitor"), f"{other.name}: ServiceMonitor when off")


def check_autoscaling(rels):
    rel = rels["all-on-values.yaml"]
    expect("replicas" not in rel.deployment["spec"], "autoscaled Deployment pins replicas")
    so = rel.one("ScaledObject")
    expect_eq(so["spec"]["scaleTargetRef"]["name"], rel.deployment["metadata"]["name"],
              "ScaledObject target")
    (trigger,) = so["spec"]["triggers"]
    expect("ridgeserve_num_requests_waiting" in trigger["metadata"]["query"], "KEDA query")
    expect(not rel.of_kind("HorizontalPodAutoscaler"), "KEDA and an HPA together")
    values = load_values(os.path.join(CI_DIR, "all-on-values.yaml"))
    values["autoscaling"]["kind"] = "hpa"
    hpa_rel = Release("all-on, kind hpa", values)
    hpa = hpa_rel.one("HorizontalPodAutoscaler")
    kubernetes_validate.validate(hpa, K8S_VERSION, strict=True)
    expect_eq(hpa["spec"]["scaleTargetRef"]["name"], rel.deployment["metadata"]["name"],
              "HPA target")
    (metric,) = hpa["spec"]["metrics"]
    expect_eq(metric["external"]["metric"]["name"], "ridgeserve_num_requests_waiting",
              "HPA metric")
    expect(not hpa_rel.of_kind("ScaledObject"), "HPA and KEDA together")
    for other in rels.values():
        if not other.values["autoscaling"]["enabled"]:
            expect_eq(other.deployment["spec"]["replicas"], other.values["replicaCount"],
                      f"{other.name}: replicas")


def dockerfile_user_and_commands():
    with open(os.path.join(DEPLOY, "docker", "Dockerfile"), encoding="utf-8") as f:
        text = f.read()
    users = re.findall(r"^USER (\d+)", text, re.MULTILINE)
    return set(users), text


def check_security(rels):
    users, dockerfile = dockerfile_user_and_commands()
    expect_eq(users, {"1000"}, "Dockerfile USER")
    for rel in rels.values():
        psc = rel.pod["securityContext"]
        expect(psc.get("runAsNonRoot") is True, f"{rel.name}: runAsNonRoot")
        expect_eq(str(psc.get("runAsUser")), "1000", f"{rel.name}: runAsUser vs the image")
        expect_eq(psc.get("fsGroupChangePolicy"), "OnRootMismatch",
                  f"{rel.name}: fsGroup applied file by file at every start")
        expect_eq(rel.pod.get("automountServiceAccountToken"), False, f"{rel.name}: SA token")
        for c in rel.pod["containers"] + rel.pod["initContainers"]:
            sc = c["securityContext"]
            expect(sc.get("readOnlyRootFilesystem") is True, f"{rel.name}: {c['name']} rootfs")
            expect(sc.get("allowPrivilegeEscalation") is False, f"{rel.name}: {c['name']} esc")
            expect("ALL" in sc.get("capabilities", {}).get("drop", []), f"{c['name']} caps")
            expect(any(m["mountPath"] == "/tmp" for m in c["volumeMounts"]),
                   f"{rel.name}: {c['name']} has no writable /tmp")
        (init,) = rel.pod["initContainers"]
        expect("ridgeserve-model-init" in dockerfile, "the image has no ridgeserve-model-init")
        expect_eq(init["command"], ["ridgeserve-model-init"], f"{rel.name}: init command")
        env = {e["name"]: e.get("value") for e in init["env"]}
        expect_eq(env["MODEL_FILE"], rel.values["model"]["file"], f"{rel.name}: MODEL_FILE")
        expect_eq(env["MAPS_SOURCE"], rel.values["maps"]["source"], f"{rel.name}: MAPS_SOURCE")
        models = [m for m in rel.server["volumeMounts"] if m["mountPath"] == "/models"]
        expect(models and models[0].get("readOnly") is True, f"{rel.name}: /models read-only")
        (init_models,) = [m for m in init["volumeMounts"] if m["mountPath"] == "/models"]
        expect(not init_models.get("readOnly"), f"{rel.name}: init cannot write /models")
        claim = next(v for v in rel.pod["volumes"] if v["name"] == "models")
        claim = claim["persistentVolumeClaim"]["claimName"]
        existing = rel.values["modelStorage"]["existingClaim"]
        pvcs = [p["metadata"]["name"] for p in rel.of_kind("PersistentVolumeClaim")]
        expect_eq(pvcs, [] if existing else [claim], f"{rel.name}: PVCs")


def schema_error(values):
    """The message Helm gives when rendering VALUES, or None when it renders."""
    try:
        render(values)
    except helm.HelmValuesError as e:
        return str(e)
    return None


def check_schema_rejects():
    msg = schema_error({"tensorParallel": 0})
    expect(msg is not None, "tensorParallel 0 rendered")
    print(f"  tensorParallel 0: {msg.strip().splitlines()[-1].strip()}")
    expect("/tensorParallel" in msg and "minimum: got 0, want 1" in msg,
           f"unclear message for tensorParallel 0: {msg}")
    try:
        chart().validate_schema(chart().merge_values({"tensorParallel": 0}))
        raise AssertionError("validate_schema accepted tensorParallel 0")
    except helm.HelmValuesError as e:
        expect("/tensorParallel" in str(e), f"validate_schema: {e}")
    msg = schema_error({"backend": "cpu", "tensorParallel": 2}) or ""
    expect("/tensorParallel" in msg and "maximum: got 2, want 1" in msg, f"cpu TP=2: {msg!r}")
    msg = schema_error({"terminationGraceMarginSeconds": 1}) or ""
    expect("/terminationGraceMarginSeconds" in msg and "minimum: got 1, want 5" in msg,
           f"grace margin 1: {msg!r}")
    msg = schema_error({"servr": {"port": 1}}) or ""
    expect("'servr' not allowed" in msg, f"typo'd key: {msg!r}")
    msg = schema_error({"model": {"source": "url"}}) or ""
    expect("/model/url" in msg, f"url source without a url: {msg!r}")
    try:
        render({"backend": "cuda", "resources": {"limits": {"nvidia.com/gpu": 1}}})
        raise AssertionError("nvidia.com/gpu in resources rendered")
    except helm.HelmRenderError as e:
        expect("set from tensorParallel" in str(e), f"GPU in resources: {e}")


def check_wrong_type_file():
    path = os.path.join(BAD_DIR, "wrong-type-values.yaml")
    values = load_values(path)
    try:
        manifests = render(values)
        raise AssertionError(f"{path} rendered {sorted(manifests)}")
    except helm.HelmValuesError as e:
        msg = str(e)
    print(f"  {os.path.basename(path)}: {' | '.join(l.strip() for l in msg.splitlines()[-3:])}")
    expect("values don't meet the specifications of the schema" in msg, f"not Helm's: {msg}")
    for key in ("/tensorParallel", "/server/port", "/server/enablePrefixCaching"):
        expect(key in msg, f"{key} not named: {msg}")
    expect("got string, want integer" in msg and "got string, want boolean" in msg, msg)


def main():
    print(f"helm-python-sdk: Helm {helm.helm_sdk_version()} (libhelm_c {helm.helm_c_version()})")
    checks = Checks("check_helm_chart")
    rels = {}
    checks.run("render the defaults and every ci/ values file", lambda: rels.update(releases()))
    if not rels:
        checks.finish()
    checks.run("helm lint --strict", check_lint)
    checks.run("yamllint: chart files and rendered manifests", check_yamllint, rels)
    checks.run("every object validates (Kubernetes, Prometheus Operator, KEDA)",
               check_kubernetes_schemas, rels)
    checks.run("every flag is one ridgeserve --helpfull knows", check_flags_known, rels)
    checks.run("nvidia.com/gpu = tensorParallel on cuda, none on cpu", check_gpus, rels)
    checks.run("probes: grpc.health.v1 on --port", check_probes, rels)
    checks.run("/dev/shm exactly when tensorParallel > 1", check_shm, rels)
    checks.run("grace period > preStop + --shutdown_timeout_s", check_drain, rels)
    checks.run("rollout: no surge pod waiting for the old pod's GPUs", check_rollout, rels)
    checks.run("ports and Services", check_services, rels)
    checks.run("dashboard and rules equal deploy/ (one source)", check_monitoring_one_source,
               rels)
    checks.run("autoscaling on ridgeserve_num_requests_waiting", check_autoscaling, rels)
    checks.run("security context, init container, volumes", check_security, rels)
    checks.run("values.schema.json rejects bad values clearly", check_schema_rejects)
    checks.run("a wrong type gets Helm's schema error", check_wrong_type_file)
    checks.finish()


if __name__ == "__main__":
    main()
