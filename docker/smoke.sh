#!/usr/bin/env bash
# Build the CPU image and serve from it, as a user would (docs/deploy.md, "Smoke test"):
#
#   1. one container (`radixserve serve`, the built-in demo model) answers a Generate;
#   2. the compose stack (four services, healthchecks, the gateway's one published port, an
#      internal secret) comes up healthy and answers a Generate through the gateway;
#   3. so does the stack with docker-compose.dp2.yml, with both scheduler replicas serving;
#   4. everything it started is removed, and so are the untagged images earlier builds left behind.
#
# Runs on a machine with no image registry: installs docker.io / docker-compose / debootstrap when
# missing, starts dockerd when none is running (and stops it again on exit), builds the Debian base
# (docker/base-image.sh) unless cached, and fetches the CPU torch wheel and the host's extra CA
# certificates into the build context (docker/build-extras.sh). Needs root (or sudo).
#
# Environment: PYTHON (interpreter with radixserve-client and grpcio-health-checking; default
# .venv/bin/python), RADIXSERVE_IMAGE (radixserve:cpu), RADIXSERVE_BASE_TAG, TORCH_VERSION
# (2.13.0+cpu), SMOKE_TIMEOUT (seconds each wait may take; default 420), RADIXSERVE_INTERNAL_SECRET
# (default: a random one).
set -euo pipefail
cd "$(dirname "$0")/.."

image=${RADIXSERVE_IMAGE:-radixserve:cpu}
base=${RADIXSERVE_BASE_TAG:-radixserve-base:bookworm}
torch_version=${TORCH_VERSION:-2.13.0+cpu}
python=${PYTHON:-.venv/bin/python}
wait_s=${SMOKE_TIMEOUT:-420}
project=radixserve-smoke-$$
container=$project-serve
compose=()  # the compose command of the stack under test (compose_stack)
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
work=$(mktemp -d "${TMPDIR:-/tmp}/radixserve-smoke.XXXXXX")
dockerd_pid=""
compose_up=0
started=$SECONDS

say() { echo "smoke [$((SECONDS - started))s]: $*"; }
fail() {
  echo "smoke: FAILED: $*" >&2
  exit 1
}

cleanup() {
  local rc=$?
  set +e
  if [ "$rc" -ne 0 ]; then
    if docker inspect "$container" >/dev/null 2>&1; then
      echo "---- logs of $container ----" >&2
      docker logs --tail 80 "$container" >&2 2>&1
    fi
    if [ "$compose_up" = 1 ]; then
      echo "---- compose ps / logs ----" >&2
      "${compose[@]}" ps >&2
      "${compose[@]}" logs --no-color --tail 60 >&2
    fi
  fi
  docker rm -f "$container" >/dev/null 2>&1
  if [ "$compose_up" = 1 ]; then
    "${compose[@]}" down --volumes --remove-orphans --timeout 60 >/dev/null 2>&1
  fi
  if [ -n "$dockerd_pid" ]; then
    say "stopping the dockerd this script started (pid $dockerd_pid)"
    $sudo kill "$dockerd_pid" && timeout 60 tail --pid="$dockerd_pid" -f /dev/null
  fi
  rm -rf "$work"
  [ "$rc" -eq 0 ] && say "passed" || echo "smoke: exit $rc after $((SECONDS - started)) s" >&2
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# -- tools and engine --------------------------------------------------------------------------
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v docker-compose >/dev/null || missing+=(docker-compose)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
[ -x "$python" ] || fail "$python not found: run 'make install' first, or set PYTHON"

if ! docker info >/dev/null 2>&1; then
  say "starting dockerd (log: $work/dockerd.log)"
  $sudo dockerd >"$work/dockerd.log" 2>&1 &
  dockerd_pid=$!
  deadline=$((SECONDS + 120))
  until docker info >/dev/null 2>&1; do
    if ! kill -0 "$dockerd_pid" 2>/dev/null || [ "$SECONDS" -ge "$deadline" ]; then
      tail -n 30 "$work/dockerd.log" >&2
      fail "dockerd did not start"
    fi
    sleep 1
  done
fi

# -- images ------------------------------------------------------------------------------------
say "base image $base"
$sudo env RADIXSERVE_BASE_TAG="$base" docker/base-image.sh
py_version=$(docker run --rm "$base" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
PYTHON="$python" docker/build-extras.sh "torch==$torch_version" "$py_version"

# The legacy builder keeps every step's image as its cache, and a rebuild on changed sources leaves
# the previous chain untagged (1.4 GB a run). Remove the untagged images of earlier builds of
# docker/Dockerfile (its label), and tag the builder stage so its cache (torch) survives the prune.
reclaimed=$(docker image prune --force --filter label=io.radixserve.build=1 | tail -n 1)
say "pruned earlier builds' untagged images (${reclaimed:-nothing}); $(df -h --output=avail \
  "$(docker info -f '{{.DockerRootDir}}')" | tail -n 1 | tr -d ' ') free for docker"
say "building $image on $base"
build_start=$SECONDS
for target in cpu-build cpu; do
  tag=$image
  [ "$target" = cpu ] || tag=$image-build
  if ! DOCKER_BUILDKIT=0 docker build -f docker/Dockerfile --target "$target" -t "$tag" \
    --build-arg PYTHON_IMAGE="$base" --build-arg TORCH_VERSION="$torch_version" \
    --build-arg TORCH_INDEX_URL=https://pypi.org/simple . >"$work/build.log" 2>&1; then
    tail -n 60 "$work/build.log" >&2
    fail "docker build --target $target (full log above, last 60 lines)"
  fi
done
say "built $image in $((SECONDS - build_start)) s, $(docker image inspect -f '{{.Size}}' "$image" | numfmt --to=iec)"

# -- one container -----------------------------------------------------------------------------
say "one container: radixserve serve"
docker run -d --name "$container" -p 127.0.0.1::50051 "$image" >/dev/null
port=$(docker port "$container" 50051/tcp | head -n 1 | sed 's/.*://')
"$python" docker/smoke_generate.py "127.0.0.1:$port" --deadline "$wait_s" \
  || fail "the single container did not answer a Generate"
[ "$(docker inspect -f '{{.Config.User}}' "$container")" = radixserve ] \
  || fail "the container does not run as the radixserve user"
docker rm -f "$container" >/dev/null

# -- compose -----------------------------------------------------------------------------------
secret=${RADIXSERVE_INTERNAL_SECRET:-$("$python" -c 'import secrets; print(secrets.token_hex(32))')}
gw_port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
printf 'RADIXSERVE_INTERNAL_SECRET=%s\n' "$secret" >"$work/env"
export RADIXSERVE_ENV_FILE="$work/env" RADIXSERVE_PORT="$gw_port"

# compose_stack REPLICAS FILE...: bring up the stack of these compose files on the image just
# built, check that every service turns healthy, that the gateway answers with REPLICAS scheduler
# replicas serving and is the stack's only published port, and take the stack down again.
compose_stack() {
  local replicas=$1 file service id health services
  shift
  compose=(docker-compose -p "$project")
  for file in "$@"; do compose+=(-f "$file"); done
  services=$("${compose[@]}" config --services)
  { echo "services:"; for service in $services; do echo "  $service: {image: \"$image\"}"; done; } \
    >"$work/image.yml"
  compose+=(-f "$work/image.yml")
  say "compose up: $* (project $project, gateway on 127.0.0.1:$gw_port)"
  compose_up=1
  # `up` returns once every depends_on healthcheck has passed, or fails when one does not.
  timeout "$wait_s" "${compose[@]}" up -d --no-build >"$work/compose.log" 2>&1 || {
    cat "$work/compose.log" >&2
    fail "compose up (or a healthcheck) did not succeed within ${wait_s} s"
  }
  for service in $services; do
    id=$("${compose[@]}" ps -q "$service")
    health=$(docker inspect -f '{{.State.Health.Status}}' "$id")
    [ "$health" = healthy ] || [ "$service" = gateway ] || fail "$service is $health, not healthy"
  done
  "$python" docker/smoke_generate.py "127.0.0.1:$gw_port" --deadline "$wait_s" \
    --replicas "$replicas" || fail "the compose gateway did not answer a Generate"
  # The internal services publish nothing.
  published=$(docker ps --filter "label=com.docker.compose.project=$project" \
    --format '{{.Ports}}' | grep -c -- '->' || true)
  [ "$published" = 1 ] || fail "expected one published port in the stack, found $published"
  say "compose down"
  "${compose[@]}" down --volumes --remove-orphans --timeout 60 >/dev/null 2>&1
  compose_up=0
}

compose_stack 1 docker/docker-compose.yml
# Two scheduler replicas, each with its own detokenizer, behind the one gateway.
compose_stack 2 docker/docker-compose.yml docker/docker-compose.dp2.yml
