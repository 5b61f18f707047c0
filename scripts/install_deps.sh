#!/usr/bin/env bash
# Installs the Debian packages ridgeserve builds and tests with, if any are missing.
set -euo pipefail
packages=(
  cmake ninja-build g++ pkg-config
  libssl-dev openssl  # TLS: the server's PEM checks and token digests; tests make certificates
  libabsl-dev libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  libopenblas-dev libpcre2-dev nlohmann-json3-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  prometheus-cpp-dev prometheus
  python3-venv unzip bible-kjv jargon-text
  # make test-hardening: libFuzzer and the sanitizer runtimes for clang 14 (gcc's come with g++)
  clang-14 libclang-rt-14-dev libomp-14-dev
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
