#!/usr/bin/env bash
# Builds the CPU role images (`make images`; idempotent): dart-jax-core, dart-jax-envs and
# dart-jax-tpu (JAX runs on CPU where no TPU is attached) from deploy/docker/*.Dockerfile with
# podman, on a Debian bookworm base made here from Debian's packages (mmdebstrap), so no
# container registry is needed. The GPU images (rollout, trainer-gpu: about 10 GB of CUDA
# wheels) only when asked for, on a host with the disk for them (docs/images.md).
#
# Each image is tagged dart-jax-<role>:<key>, the key a hash of this script, its Dockerfile,
# its lock and the package sources it installs; a manifest per image under
#   $DART_IMAGE_DIR/<role>-<key>.json     (default ~/.cache/dart-jax/images)
# records the build time, the size and the podman flags that run it on this host, and makes
# a re-run with nothing changed take seconds.
#   DART_SKIP_APT=1       do not apt-get install podman, runc, mmdebstrap
#   DART_IMAGE_CA=FILE    a CA bundle pip inside the build must trust (default: $PIP_CERT, the
#                         bundle this host's pip is told to use); mounted for RUN steps only,
#                         never stored in an image
#   IMAGES="core envs"    which images (default: core envs trainer-tpu; also rollout trainer-gpu)
set -euo pipefail
export LC_ALL=C
cd "$(dirname "$0")/.."
ROOT=${DART_IMAGE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dart-jax/images}
IMAGES=${IMAGES:-core envs trainer-tpu}
declare -A TAG=([core]=dart-jax-core [envs]=dart-jax-envs [trainer-tpu]=dart-jax-tpu
                [rollout]=dart-jax-rollout [trainer-gpu]=dart-jax-gpu)
declare -A LOCK=([core]=cpu [envs]=cpu [trainer-tpu]=tpu [rollout]=gpu [trainer-gpu]=gpu)
mkdir -p "$ROOT"

sources_hash() {
  find dart_jax rollout_gpu envs pyproject.toml README.md -type f ! -path '*/__pycache__/*' ! -name '*.pyc' \
    -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16
}
src=$(sources_hash)
key_of() { cat scripts/build_images.sh "deploy/docker/$1.Dockerfile" "requirements/lock-${LOCK[$1]}.txt" \
  | { cat; echo "$src"; } | sha256sum | cut -c1-16; }

todo=()
for role in $IMAGES; do
  [ -n "${TAG[$role]:-}" ] || { echo "images: no image $role (${!TAG[*]})" >&2; exit 2; }
  key=$(key_of "$role")
  if [ -f "$ROOT/$role-$key.json" ] && podman image exists "${TAG[$role]}:$key" 2>/dev/null; then
    echo "images: ${TAG[$role]}:$key up to date"
  else todo+=("$role"); fi
done
[ ${#todo[@]} = 0 ] && exit 0

missing=$(for t in podman runc mmdebstrap; do command -v $t >/dev/null || echo $t; done)
if [ -n "$missing" ] && [ -z "${DART_SKIP_APT:-}" ]; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  echo "images: installing podman runc mmdebstrap"
  $sudo apt-get -o DPkg::Lock::Timeout=300 update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
    podman runc mmdebstrap >/dev/null
fi

# The base: what python:3.11-slim-bookworm gives the Dockerfiles (python3 and pip installing
# system-wide, useradd, CA certificates, apt sources), from Debian's archive. Debian's
# Python is 3.11.2, not the official image's 3.11.11. mmdebstrap unpacks as root.
base_key=$(sed -n '/^# The base:/,/^# End of the base/p' scripts/build_images.sh | sha256sum | cut -c1-16)
BASE=localhost/dart-jax-base:bookworm-$base_key
if ! podman image exists "$BASE"; then
  [ "$(id -u)" = 0 ] || { echo "images: making the base needs root (mmdebstrap)" >&2; exit 1; }
  start=$(date +%s)
  work=$(mktemp -d "$ROOT/base.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  mmdebstrap --variant=minbase --include=python3,python3-pip,python-is-python3,passwd,ca-certificates,netbase,tzdata \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias' \
    --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED "$1"/var/lib/apt/lists/*_Packages' \
    bookworm "$work/base.tar" http://deb.debian.org/debian >"$work/mmdebstrap.log" 2>&1 \
    || { tail -30 "$work/mmdebstrap.log" >&2; exit 1; }
  podman import -q --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' "$work/base.tar" "$BASE" >/dev/null
  echo "images: made $BASE in $(( $(date +%s) - start )) s"
fi
# End of the base

# This host's container runtime: podman's defaults, unless they cannot start a container here.
# Then runc (crun refuses a hybrid cgroup v1 + v2 host) and limits within the host's hard
# limits (raising one needs CAP_SYS_RESOURCE): what this sandbox needs.
runtime=()
ulimits=()
if ! err=$(podman run --rm --network none "$BASE" true 2>&1); then
  echo "images: podman's defaults cannot run a container here ($err); trying runc with the host's limits"
  nproc=$(ulimit -Hu); [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ] && nproc=32768  # podman's default
  runtime=(--runtime runc)
  ulimits=(--ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)" --ulimit "nproc=$nproc:$nproc")
  podman "${runtime[@]}" run --rm --network none "${ulimits[@]}" "$BASE" true
fi

ca=${DART_IMAGE_CA:-${PIP_CERT:-}}
mounts=(); [ -n "$ca" ] && mounts=(--volume "$(realpath "$ca"):/etc/ssl/certs/ca-certificates.crt:ro")
json_list() { python3 -c 'import json,sys; print(json.dumps(sys.argv[1:]))' "$@"; }

for role in "${todo[@]}"; do
  key=$(key_of "$role") tag=${TAG[$role]}
  echo "images: building $tag:$key"
  start=$(date +%s)
  podman "${runtime[@]}" build -q "${ulimits[@]}" "${mounts[@]}" --build-arg "BASE=$BASE" \
    -f "deploy/docker/$role.Dockerfile" -t "$tag:$key" -t "$tag:latest" . >/dev/null
  seconds=$(( $(date +%s) - start ))
  size=$(podman image inspect --format '{{.Size}}' "$tag:$key")
  printf '{"image": "%s:%s", "base": "%s", "seconds": %d, "bytes": %d, "podman": %s, "run": %s}\n' \
    "$tag" "$key" "$BASE" "$seconds" "$size" "$(json_list "${runtime[@]}")" "$(json_list "${ulimits[@]}")" \
    > "$ROOT/$role-$key.json"
  # Older keys are never used again (their layers stay as podman's build cache).
  find "$ROOT" -maxdepth 1 -name "$role-*.json" ! -name "$role-$key.json" -delete
  podman images --format '{{.Repository}}:{{.Tag}}' "localhost/$tag" | { grep -v -E ":($key|latest)$" || true; } \
    | xargs -r podman rmi >/dev/null
  echo "images: built $tag:$key in $seconds s ($(( size / 1048576 )) MiB)"
done
