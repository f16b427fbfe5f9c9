#!/usr/bin/env bash
# Validates deploy/kubernetes/*.yaml against the Kubernetes schemas with PyPI's
# kubernetes-validate (installed once into target/k8s-venv; later runs reuse it), strict:
# an unknown field is an error. Also checks that the example pod's volume attributes are
# ones `fencefs csi` knows (they are not in any schema). Needs python3 with venv and PyPI.
#   scripts/k8s-validate.sh            # K8S_VERSION=1.33.0 by default
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

venv="$PWD/target/k8s-venv"
if [[ ! -x $venv/bin/kubernetes-validate ]]; then
    echo "k8s-validate: installing kubernetes-validate into $venv (once)"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check 'kubernetes-validate>=1.33'
fi
version="${K8S_VERSION:-1.33.0}"
"$venv/bin/kubernetes-validate" --strict --kubernetes-version "$version" deploy/kubernetes/*.yaml

# The attributes fencefs csi accepts (src/app/csi/attrs.rs: KNOWN).
"$venv/bin/python" - <<'PY'
import re, sys, yaml
known = set(re.findall(r'"(\w+)"', re.search(r"const KNOWN[^=]*=\s*&\[(.*?)\];",
        open("src/app/csi/attrs.rs").read(), re.S).group(1)))
bad = 0
for doc in yaml.safe_load_all(open("deploy/kubernetes/example-agent-pod.yaml")):
    if not doc or doc.get("kind") != "Pod":
        continue
    for v in doc["spec"]["volumes"]:
        attrs = (v.get("csi") or {}).get("volumeAttributes") or {}
        for k in attrs:
            if k not in known:
                print(f"k8s-validate: volume {v['name']}: attribute {k!r} unknown to fencefs csi")
                bad = 1
sys.exit(bad)
PY
echo "k8s-validate: deploy/kubernetes/*.yaml valid against Kubernetes $version"
