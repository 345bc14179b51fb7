#!/usr/bin/env bash
# Create .venv and install edgesdk (editable) with the extras given as $1 (e.g. "dev").
# System packages the tests need are installed with apt-get when running as root;
# otherwise the script says which ones to install.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-dev}"
python="${PYTHON:-python3}"

if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
  echo "edgesdk needs Python >= 3.10; $python is $("$python" --version 2>&1). Set PYTHON=/path/to/python3.11" >&2
  exit 1
fi

apt_packages=()
# Debian splits venv/ensurepip out of python3.
"$python" -c 'import venv, ensurepip' 2>/dev/null || apt_packages+=(python3-venv)
# A C compiler builds the test-only LiteRT delegate plugin (tests/integration/test_delegates.py).
command -v cc >/dev/null 2>&1 || apt_packages+=(gcc libc6-dev)
# The MQTT broker the OTA tests and the demo run (started by them on a free loopback port).
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || apt_packages+=(mosquitto)
# PostgreSQL for the fleet-store tests and benchmarks (started by them in a temp dir on a free loopback
# port). Debian keeps its binaries off PATH, in /usr/lib/postgresql/<major>/bin.
command -v initdb >/dev/null 2>&1 || compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || apt_packages+=(postgresql)
# The converter's board estimates run each variant with the board's aarch64 wheels under qemu-user
# (the dynamic build: it loads the instruction-counting plugin). The userland is made from Debian's
# arm64 packages, so apt must list them (see converters/board/userland.py).
command -v qemu-aarch64 >/dev/null 2>&1 || apt_packages+=(qemu-user)
# The operator console's browser tests drive Debian's chromium through its WebDriver (tests/ota/test_console_browser.py).
command -v chromium >/dev/null 2>&1 || apt_packages+=(chromium)
command -v chromedriver >/dev/null 2>&1 || apt_packages+=(chromium-driver)
# benchmarks/endpoint/endpoint.py's load generator: h2load, in C, so the servers saturate before it does.
command -v h2load >/dev/null 2>&1 || apt_packages+=(nghttp2-client)
# benchmarks/endpoint/endpoint.py's PyTriton peer: Triton's Python backend stub links the system libpython3.11,
# so its venv is made from the system python3.11 (benchmarks/endpoint/endpoint_peers.py).
if [ -x /usr/bin/python3.11 ]; then
  /usr/bin/python3.11 -c 'import venv, ensurepip' 2>/dev/null || apt_packages+=(python3.11-venv)
else
  apt_packages+=(python3.11 python3.11-venv)
fi
compgen -G '/usr/lib/*/libpython3.11.so.1.0' >/dev/null || apt_packages+=(libpython3.11)
need_arm64=0
command -v dpkg >/dev/null 2>&1 && ! dpkg --print-foreign-architectures | grep -qx arm64 && need_arm64=1
if ((need_arm64)) && [ "$(id -u)" = 0 ]; then
  echo "adding Debian's arm64 architecture to apt (packages for the emulated board userland)" >&2
  dpkg --add-architecture arm64
  ((${#apt_packages[@]})) || apt-get update -qq
fi
if ((${#apt_packages[@]})); then
  if [ "$(id -u)" = 0 ]; then
    echo "installing system packages: ${apt_packages[*]}" >&2
    if [[ " ${apt_packages[*]} " == *" postgresql "* ]]; then
      # No system-wide "main" cluster on port 5432: the tests start their own servers.
      mkdir -p /etc/postgresql-common/createcluster.d
      echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.d/edgesdk.conf
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_packages[@]}" >/dev/null
  else
    echo "missing system packages: ${apt_packages[*]}; run: sudo apt-get install -y ${apt_packages[*]}" >&2
    exit 1
  fi
fi

[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[${extras}]"
# The emulated aarch64 userland (cached per user and runtime versions; ~10 s the first time).
if ! .venv/bin/edgesdk emulator setup >&2; then
  echo "edgesdk: no emulated board cores; conversions will scale this host's timings instead" >&2
  [ "$(id -u)" != 0 ] || exit 1
fi
