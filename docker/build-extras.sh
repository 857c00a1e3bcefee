#!/usr/bin/env bash
# Fill docker/build-extras/ (see its README.md) from this machine, for an image build that must live
# with what the machine lives with:
#
#   docker/build-extras.sh [TORCH_REQUIREMENT [PYTHON_VERSION]]     # torch==2.13.0+cpu 3.11
#
# - the host's locally added certificate authorities (/usr/local/share/ca-certificates/*.crt, or
#   $EXTRA_CA_DIR), so that pip in the builder trusts a TLS-intercepting proxy as the host does;
# - the torch wheel, fetched by the host's pip with the host's configuration (its indexes,
#   find-links and cache), for builders that cannot reach the PyTorch index. PYTHON_VERSION is the
#   base image's (3.11 for Debian bookworm, 3.12 for python:3.12-slim-bookworm).
#
# Environment: PYTHON (the interpreter whose pip downloads; default .venv/bin/python, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."

torch_req=${1:-torch==2.13.0+cpu}
py_version=${2:-3.11}
dest=docker/build-extras
python=${PYTHON:-.venv/bin/python}
[ -x "$python" ] || python=python3

mkdir -p "$dest/ca-certificates" "$dest/wheels"
rm -f "$dest"/ca-certificates/*.crt
ca_dir=${EXTRA_CA_DIR:-/usr/local/share/ca-certificates}
find "$ca_dir" -name '*.crt' -type f -exec cp {} "$dest/ca-certificates/" \; 2>/dev/null || true
echo "build-extras: $(find "$dest/ca-certificates" -name '*.crt' | wc -l) extra CA certificate(s)"

# --no-deps: torch's own dependencies come from PyPI inside the build.
"$python" -m pip download --quiet --no-deps --only-binary=:all: \
  --python-version "$py_version" --platform manylinux_2_28_x86_64 \
  --dest "$dest/wheels" "$torch_req"
echo "build-extras: wheels: $(cd "$dest/wheels" && ls -- *.whl | tr '\n' ' ')"
