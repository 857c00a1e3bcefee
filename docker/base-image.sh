#!/usr/bin/env bash
# Build a Debian base image for docker/Dockerfile from the Debian archive alone, for machines that
# cannot reach Docker Hub or any other image registry:
#
#   sudo docker/base-image.sh                 # -> radixserve-base:bookworm (skipped if it exists)
#   docker build -f docker/Dockerfile --target cpu \
#     --build-arg PYTHON_IMAGE=radixserve-base:bookworm ...     # see docs/deploy.md
#
# `debootstrap --variant=minbase` plus the interpreter (python3, python3-venv, `python` on PATH) and
# ca-certificates, then `docker import`. The image has no compiler: the Dockerfile's builder stage
# adds g++ and the Python headers with apt, so the runtime stage stays without them.
#
# Environment: RADIXSERVE_BASE_TAG (image tag), DEBIAN_SUITE (bookworm), DEBIAN_MIRROR
# (http://deb.debian.org/debian), FORCE=1 (rebuild even when the tag exists). Needs root.
set -euo pipefail

tag=${RADIXSERVE_BASE_TAG:-radixserve-base:bookworm}
suite=${DEBIAN_SUITE:-bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
packages=python3,python3-venv,python-is-python3,ca-certificates

if [ "${FORCE:-0}" != 1 ] && docker image inspect "$tag" >/dev/null 2>&1; then
  echo "base-image: $tag exists; FORCE=1 rebuilds it"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "base-image: debootstrap needs root" >&2
  exit 1
fi
command -v debootstrap >/dev/null || {
  echo "base-image: debootstrap is missing (apt-get install debootstrap)" >&2
  exit 1
}

root=$(mktemp -d "${TMPDIR:-/tmp}/radixserve-base.XXXXXX")
trap 'rm -rf "$root"' EXIT
echo "base-image: debootstrap $suite from $mirror into $root"
debootstrap --variant=minbase --include="$packages" "$suite" "$root" "$mirror" >"$root.log" 2>&1 || {
  tail -n 40 "$root.log" >&2
  echo "base-image: debootstrap failed (full log: $root.log)" >&2
  exit 1
}
rm -f "$root.log"

# Image hygiene: the Debian docker images' apt settings (no recommends, no caches, no docs), the
# updates and security suites, and nothing left over from the bootstrap.
cat >"$root/etc/apt/sources.list" <<SOURCES
deb $mirror $suite main
deb $mirror $suite-updates main
deb http://deb.debian.org/debian-security $suite-security main
SOURCES
cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'APT'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache ""; Dir::Cache::srcpkgcache "";
APT
cat >"$root/etc/dpkg/dpkg.cfg.d/docker-nodoc" <<'DPKG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
DPKG
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
  "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* \
  "$root"/var/log/*.log "$root"/tmp/* "$root"/dev/*

tar -C "$root" --numeric-owner -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["bash"]' \
  --message "debootstrap --variant=minbase $suite + $packages" - "$tag" >/dev/null
echo "base-image: built $tag ($(docker image inspect -f '{{.Size}}' "$tag" | numfmt --to=iec))"
