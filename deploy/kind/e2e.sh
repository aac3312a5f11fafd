#!/usr/bin/env bash
# dracpu end to end on a kind cluster (`make kind-e2e`; docs/installation.md, "Trying it
# on kind"):
#   1. create a cluster from deploy/kind/kind-$K8S_VERSION.yaml (NRI, CDI, feature gates);
#   2. build the image from the Dockerfile and load it into the nodes;
#   3. `kubectl apply -k` the grouped install (the image set to the one just built), wait
#      for the DaemonSet and the slices;
#   4. check the admission policy: dracpu's token may write its own node's slice, not
#      another node's, and a token without a node may write none (server-side dry runs);
#   5. run every docs/examples file in a namespace of its own, wait for its pods, and
#      check each container's cpuset (/proc/self/status Cpus_allowed_list, read with
#      kubectl exec) against the CPUs its claims were given (DRA_CPUSET_* from the CDI
#      spec): equal, or containing them for sharedPoolAccess; containers without a claim
#      stay off every exclusive CPU; then the individual install and its examples;
#   6. delete the cluster (KEEP_CLUSTER=1 keeps it).
# Needs docker, kind and kubectl. Environment: K8S_VERSION (1.34, 1.35 or 1.36),
# KIND_CLUSTER, IMAGE, KIND_NODE_IMAGE (another kindest/node image), KEEP_CLUSTER,
# TIMEOUT (per wait, default 300s).
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-1.34}
CLUSTER=${KIND_CLUSTER:-dracpu-e2e}
IMAGE=${IMAGE:-dracpu:e2e}
KEEP_CLUSTER=${KEEP_CLUSTER:-0}
TIMEOUT=${TIMEOUT:-300s}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CONFIG=$REPO/deploy/kind/kind-$K8S_VERSION.yaml
CONTEXT=kind-$CLUSTER

log() { printf '== %s\n' "$*" >&2; }
die() { printf 'kind-e2e: %s\n' "$*" >&2; exit 1; }
k() { kubectl --context "$CONTEXT" "$@"; }

[[ -f $CONFIG ]] \
  || die "no kind config for Kubernetes $K8S_VERSION: $(cd "$REPO/deploy/kind" && echo kind-*.yaml)"
for tool in docker kind kubectl; do
  command -v "$tool" >/dev/null || die "$tool is needed and not on PATH"
done

WORK=$(mktemp -d)
cleanup() {
  local status=$?
  if [[ $status -ne 0 ]] && kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    log "failed; dracpu's logs"
    k -n kube-system logs -l app=dracpu --tail=50 --prefix || true
  fi
  if [[ $KEEP_CLUSTER == 1 ]]; then
    log "keeping cluster $CLUSTER (kind delete cluster --name $CLUSTER)"
  else
    kind delete cluster --name "$CLUSTER" || true
  fi
  rm -rf "$WORK"
  exit "$status"
}
trap cleanup EXIT

# -- cpusets -----------------------------------------------------------------------------

# "0-3,8" -> "0 1 2 3 8 " (sorted, one space after each).
expand_cpus() {
  local part
  local -a parts
  IFS=, read -ra parts <<<"$1"
  for part in "${parts[@]}"; do
    [[ -n $part ]] || continue
    if [[ $part == *-* ]]; then seq "${part%-*}" "${part#*-}"; else echo "$part"; fi
  done | sort -n -u | tr '\n' ' '
}

# Whether every CPU of $1 is in $2 (both as expand_cpus prints them).
cpus_within() {
  [[ -z $(comm -23 <(tr ' ' '\n' <<<"$1" | sed '/^$/d' | sort) \
                   <(tr ' ' '\n' <<<"$2" | sed '/^$/d' | sort)) ]]
}

# Whether $1 and $2 share a CPU.
cpus_overlap() {
  [[ -n $(comm -12 <(tr ' ' '\n' <<<"$1" | sed '/^$/d' | sort) \
                   <(tr ' ' '\n' <<<"$2" | sed '/^$/d' | sort)) ]]
}

# Check every container of every pod in namespace $1; $2 is 1 when the example's claims
# use sharedPoolAccess.
check_cpusets() {
  local ns=$1 shared_access=$2 pod container status allowed claimed exclusive=""
  local -a shared_only=()
  for pod in $(k -n "$ns" get pods -o jsonpath='{.items[*].metadata.name}'); do
    for container in $(k -n "$ns" get pod "$pod" -o jsonpath='{.spec.containers[*].name}'); do
      status=$(k -n "$ns" exec "$pod" -c "$container" -- \
        sh -c 'grep Cpus_allowed_list /proc/self/status; env')
      allowed=$(expand_cpus "$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' <<<"$status")")
      claimed=$(expand_cpus "$(sed -n 's/^DRA_CPUSET_[^=]*=//p' <<<"$status" | paste -sd, -)")
      [[ -n $allowed ]] || die "$ns/$pod/$container: no Cpus_allowed_list"
      if [[ -z $claimed ]]; then
        shared_only+=("$pod/$container=$allowed")
        log "$ns/$pod/$container: shared pool ${allowed}"
      elif [[ $shared_access == 1 ]]; then
        cpus_within "$claimed" "$allowed" \
          || die "$ns/$pod/$container: cpuset ${allowed}lacks its claimed CPUs ${claimed}"
        [[ $allowed != "$claimed" ]] \
          || die "$ns/$pod/$container: sharedPoolAccess, yet the cpuset is the claim's ${claimed}"
        log "$ns/$pod/$container: claimed ${claimed}+ shared pool, cpuset ${allowed}"
      else
        [[ $allowed == "$claimed" ]] \
          || die "$ns/$pod/$container: cpuset ${allowed}is not its claimed CPUs ${claimed}"
        exclusive+="$claimed"
        log "$ns/$pod/$container: exclusive ${claimed}"
      fi
    done
  done
  local entry
  for entry in "${shared_only[@]}"; do
    ! cpus_overlap "${entry#*=}" "$exclusive" \
      || die "$ns/${entry%%=*}: shared cpuset ${entry#*=}overlaps exclusive CPUs ${exclusive}"
  done
}

# -- steps -------------------------------------------------------------------------------

install() {  # $1: grouped or individual
  local overlay=$WORK/$1
  mkdir -p "$overlay"
  cat >"$overlay/kustomization.yaml" <<EOF
resources:
- $(realpath --relative-to="$overlay" "$REPO/deploy/overlays/$1")
images:
- name: ghcr.io/dracpu/dracpu
  newName: ${IMAGE%:*}
  newTag: ${IMAGE##*:}
EOF
  log "kubectl apply -k (deploy/overlays/$1, image $IMAGE)"
  k apply -k "$overlay"
  k -n kube-system rollout status daemonset/dracpu --timeout="$TIMEOUT"
  local deadline=$((SECONDS + 120))
  until [[ -n $(k get resourceslices --field-selector spec.driver=dra.cpu -o name) ]]; do
    ((SECONDS < deadline)) || die "no dra.cpu ResourceSlices after 120 s"
    sleep 2
  done
  k get resourceslices --field-selector spec.driver=dra.cpu
}

check_admission_policy() {
  local nodes own other pod kubeconfig=$WORK/dracpu.kubeconfig
  read -ra nodes <<<"$(k get nodes -o jsonpath='{.items[*].metadata.name}')"
  own=${nodes[0]} other=${nodes[1]}
  pod=$(k -n kube-system get pods -l app=dracpu --field-selector "spec.nodeName=$own" \
    -o jsonpath='{.items[0].metadata.name}')
  k config view --minify --raw -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' \
    | base64 -d >"$WORK/ca.crt"
  kubectl config --kubeconfig="$kubeconfig" set-cluster e2e \
    --server="$(k config view --minify -o jsonpath='{.clusters[0].cluster.server}')" \
    --certificate-authority="$WORK/ca.crt" >/dev/null
  # The user's token is given per call (--token); the entry only has to exist.
  kubectl config --kubeconfig="$kubeconfig" set-credentials dracpu --token=none >/dev/null
  kubectl config --kubeconfig="$kubeconfig" set-context e2e --cluster=e2e --user=dracpu >/dev/null
  as_dracpu() {
    kubectl --kubeconfig="$kubeconfig" --context e2e --token "$1" create --dry-run=server -f -
  }
  slice_for() {
    printf '%s\n' "apiVersion: resource.k8s.io/v1" "kind: ResourceSlice" \
      "metadata: {name: dracpu-e2e-$1}" \
      "spec: {driver: dra.cpu, nodeName: $1, devices: []," \
      "       pool: {name: $1, generation: 1, resourceSliceCount: 1}}"
  }
  local bound unbound out
  bound=$(k -n kube-system create token dracpu --duration=10m \
    --bound-object-kind Pod --bound-object-name "$pod")
  unbound=$(k -n kube-system create token dracpu --duration=10m)
  log "admission policy: dracpu on $own writes a slice for $own (allowed)"
  slice_for "$own" | as_dracpu "$bound" >/dev/null
  log "admission policy: dracpu on $own writes a slice for $other (refused)"
  if out=$(slice_for "$other" | as_dracpu "$bound" 2>&1); then
    die "a slice for $other was allowed with $own's token"
  fi
  grep -q "may write only ResourceSlices whose spec.nodeName is $own" <<<"$out" || die "$out"
  log "admission policy: a token bound to no pod (refused)"
  if out=$(slice_for "$own" | as_dracpu "$unbound" 2>&1); then
    die "a slice was allowed with a token that names no node"
  fi
  grep -q "only with a token bound to a pod on a node" <<<"$out" || die "$out"
}

run_example() {  # $1: a docs/examples file
  local file=$1 name ns shared_access=0 deadline
  name=$(basename "$file" .yaml)
  ns=e2e-$name
  grep -q 'sharedPoolAccess: true' "$file" && shared_access=1
  log "example $file (namespace $ns)"
  k create namespace "$ns" >/dev/null
  k -n "$ns" apply -f "$file"
  deadline=$((SECONDS + 120))
  until [[ -n $(k -n "$ns" get pods -o name) ]]; do
    ((SECONDS < deadline)) || die "$file: no pods after 120 s"
    sleep 2
  done
  k -n "$ns" wait --for=condition=Ready pod --all --timeout="$TIMEOUT"
  # A Deployment's pods all exist once its rollout is done.
  if k -n "$ns" get deployments -o name | grep -q .; then
    k -n "$ns" rollout status deployment --timeout="$TIMEOUT"
    k -n "$ns" wait --for=condition=Ready pod --all --timeout="$TIMEOUT"
  fi
  check_cpusets "$ns" "$shared_access"
  # Deleting the namespace unprepares the claims; wait, so the next example has the CPUs.
  k delete namespace "$ns" --timeout="$TIMEOUT"
}

is_individual() { grep -q 'deploy/overlays/individual' "$1"; }
# An example that needs other drivers' devices (they exist only on the simulated node).
is_dry_run_only() { grep -q '^# kind-e2e: skip' "$1"; }

log "kind create cluster $CLUSTER (Kubernetes $K8S_VERSION, $CONFIG)"
kind create cluster --name "$CLUSTER" --config "$CONFIG" --wait "$TIMEOUT" \
  ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"}
log "docker build -t $IMAGE"
docker build -t "$IMAGE" "$REPO"
kind load docker-image "$IMAGE" --name "$CLUSTER"

install grouped
check_admission_policy
for file in "$REPO"/docs/examples/*.yaml; do
  is_dry_run_only "$file" || is_individual "$file" || run_example "$file"
done
install individual
for file in "$REPO"/docs/examples/*.yaml; do
  is_dry_run_only "$file" || ! is_individual "$file" || run_example "$file"
done
log "kind-e2e passed on Kubernetes $K8S_VERSION"
