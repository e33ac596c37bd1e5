#!/usr/bin/env bash
# System packages the test suite uses as real services: Prometheus (scrapes the server's /metrics in a test) and
# headless Chromium (renders the HTML report in a test).
# Idempotent and quick when already installed; installs with apt-get when run as root, otherwise says what to run.
set -u
missing=()
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "system-deps: installing ${missing[*]} (Debian packages)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || { echo "system-deps: apt-get install ${missing[*]} failed" >&2; exit 1; }
  # The package's service is not wanted: tests start their own instance on a free port.
  (command -v systemctl >/dev/null && systemctl disable --now prometheus >/dev/null 2>&1) || true
  pkill -x prometheus >/dev/null 2>&1 || true
else
  echo "system-deps: WARNING: ${missing[*]} not installed and not root: tests that need them will skip" >&2
  echo "system-deps: run: sudo apt-get install ${missing[*]}" >&2
fi
exit 0
