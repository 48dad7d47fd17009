#!/usr/bin/env bash
# Installs dist-launch's build and test dependencies from Debian's packages.
# Idempotent: checks what is present and installs only what is missing. Run as root (or with sudo).
set -euo pipefail

# Build: compiler toolchain and libraries.
BUILD_PKGS=(
  g++ cmake make ninja-build pkg-config   # Ninja: the demo's quick build (scripts/demo.sh)
  libboost-dev          # Asio (header-only)
  libcli11-dev          # command lines
  libspdlog-dev         # the agent's and daemon's logs
  nlohmann-json3-dev    # error files, status output
  libgloo-dev           # CPU process group (worker SDK)
  libhwloc-dev          # CPU and NUMA placement of workers (agent)
  libssl-dev            # headers for etcd's TLS (libssl.so.3 loaded when used); ddp_train's digests
  libeigen3-dev         # CPU math of the training example
  zlib1g-dev            # reading the example data set (.csv.gz)
  libgtest-dev libgmock-dev
)
# Tests: PyTorch 1.13 (legacy TCPStore dialect) as a real client, clang-format for lint, network
# namespaces for named hosts (iproute2, util-linux's unshare), a real Slurm (munge, slurmctld,
# three slurmd on this machine), etcd 3.4 members and etcdctl for the etcd rendezvous store,
# openssl for its TLS tests' certificates, OpenSSH (sshd per test host, the client) for
# dist-launch --hosts, venvs for the Python package's pip install test, and headless Chromium for
# the agent's status page (tests/status_page).
TEST_PKGS=(python3-torch clang-format iproute2 procps util-linux
  munge slurmctld slurmd slurm-client etcd-server etcd-client openssl
  openssh-server openssh-client python3-venv chromium)

missing=()
for pkg in "${BUILD_PKGS[@]}" "${TEST_PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all dependencies present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
