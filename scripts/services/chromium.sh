#!/usr/bin/env bash
# Headless Chromium and its WebDriver for the console's browser tests, from Debian's packages.
#
#   chromium.sh install     # prints the chromedriver path
set -euo pipefail

log() { echo "chromium.sh: $*" >&2; }
# shellcheck source=common.sh
. "$(dirname "$0")/common.sh"

have_chromium() { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; }

install() {
  have_chromium || with_lock apt install_once
  command -v chromedriver
}

install_once() {
  have_chromium && return 0 # installed by the process this one waited for
  log "installing chromium and chromium-driver from Debian's packages"
  apt_install chromium chromium-driver
}

case "${1:-}" in
  install) install ;;
  *) echo "usage: chromium.sh install" >&2; exit 2 ;;
esac
