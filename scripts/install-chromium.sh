#!/usr/bin/env bash
# Makes sure a headless Chromium from the system packages is there for the browser tests
# (tests/browser: Playwright drives it through executable_path, so no browser is downloaded).
# Prints its path. Installs Debian's `chromium` with apt-get when it is missing and this runs as
# root; otherwise says what to install. XWORKMATE_CHROMIUM names another binary.
set -euo pipefail

find_chromium() {
  for candidate in "${XWORKMATE_CHROMIUM:-}" chromium chromium-browser google-chrome; do
    [ -n "$candidate" ] && command -v "$candidate" && return 0
  done
  return 1
}

if find_chromium; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing chromium from the system packages" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq chromium >&2
  find_chromium && exit 0
fi
echo "no chromium found: install it (Debian: apt-get install chromium) or set XWORKMATE_CHROMIUM" >&2
exit 1
