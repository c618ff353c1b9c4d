#!/usr/bin/env bash
# hangwatch across the pods of a real Kubernetes cluster, by hand (CI has no cluster: the tests use a
# stand-in kubectl with LeaderWorkerSet and KubeRay fixtures, tests/unit/test_kubectl.py).
#
#   scripts/kube-stacks.sh SELECTOR [NAMESPACE] [CONTAINER] [-- extra hangwatch stacks options]
#   scripts/kube-stacks.sh 'leaderworkerset.sigs.k8s.io/name=vllm' default vllm-leader -- --match 'vllm|VLLM::'
#
# Read-only: it asks the API server what it may do (auth can-i), lists the pods, and runs in each one
# container `hangwatch --version`, a read of /proc/self/status (is CAP_SYS_PTRACE held?) and then
# `hangwatch stacks --kube-selector`. It changes no pod. Needs kubectl with a context that can
# `get,list pods` and `create pods/exec`, and hangwatch in the image (or --remote-hangwatch 'python3 -m hangwatch').
set -euo pipefail
selector=${1:?usage: $0 SELECTOR [NAMESPACE] [CONTAINER] [-- hangwatch options]}
namespace=${2:-default}
container=${3:-}
shift $(( $# < 3 ? $# : 3 ))
[ "${1:-}" = "--" ] && shift
kc=(kubectl --namespace "$namespace")

echo "== RBAC (what hangwatch needs: pods get,list; pods/exec create)"
for verb in "list pods" "get pods" "create pods/exec"; do
  printf '  %-18s %s\n' "$verb" "$("${kc[@]}" auth can-i $verb 2>&1 || true)"
done

echo "== pods for -l $selector"
"${kc[@]}" get pods -l "$selector" -o wide

pods=$("${kc[@]}" get pods -l "$selector" -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')
for pod in $pods; do
  c=${container:-$("${kc[@]}" get pod "$pod" -o jsonpath='{.spec.containers[0].name}')}
  echo "== $pod (container $c)"
  "${kc[@]}" exec -i "$pod" -c "$c" -- hangwatch --version 2>&1 | sed 's/^/  /' || echo "  hangwatch not in the image: pass --remote-hangwatch"
  caps=$("${kc[@]}" exec -i "$pod" -c "$c" -- sh -c 'grep CapEff /proc/self/status' 2>/dev/null | awk '{print $2}')
  if [ -n "$caps" ] && (( (16#$caps >> 19) & 1 )); then
    echo "  CAP_SYS_PTRACE: held (stacks can be read)"
  else
    echo "  CAP_SYS_PTRACE: not held: stacks will be denied; hangwatch says what would fix it"
  fi
done

echo "== hangwatch stacks --kube-selector"
args=(--kube-selector "$selector" --kube-namespace "$namespace")
[ -n "$container" ] && args+=(--kube-container "$container")
exec hangwatch stacks "${args[@]}" "$@"
