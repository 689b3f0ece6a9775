#!/usr/bin/env bash
# Headless Chromium and its WebDriver for the console's browser tests, from Debian's packages.
#
#   chromium.sh install     # prints the chromedriver path
set -euo pipefail

log() { echo "chromium.sh: $*" >&2; }

install() {
  if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    log "installing chromium and chromium-driver from Debian's packages"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 || {
      apt-get update -q >/dev/null
      apt-get install -y -q chromium chromium-driver >/dev/null
    }
  fi
  command -v chromedriver
}

case "${1:-}" in
  install) install ;;
  *) echo "usage: chromium.sh install" >&2; exit 2 ;;
esac
