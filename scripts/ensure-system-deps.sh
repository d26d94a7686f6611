#!/usr/bin/env bash
# Installs the system packages tailguard needs, only when they are missing:
#   prometheus (with promtool), prometheus-alertmanager, python3-venv; with --with-browser also chromium (the
#   status page's headless browser test: `make test` asks for it, `make demo` does not, which keeps a fresh clone's
#   demo from downloading a browser it never starts).
# Idempotent: when everything is present it changes nothing and touches no network.
set -euo pipefail

with_browser=0
for argument in "$@"; do
  case "$argument" in
    --with-browser) with_browser=1 ;;
    *) echo "usage: $0 [--with-browser]" >&2; exit 2 ;;
  esac
done

missing=()
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
# promtool ships in Debian's prometheus package.
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || missing+=(prometheus-alertmanager)
# Debian splits ensurepip out of python3; without it `python3 -m venv` fails.
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
# The status page's browser test (tests/integration/test_status_page_browser.py) renders it in headless chromium.
if [ "$with_browser" -eq 1 ]; then
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
fi

if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi
# Remove repeats while keeping the order (prometheus may be listed twice).
packages=$(printf '%s\n' "${missing[@]}" | awk '!seen[$0]++' | tr '\n' ' ')

if ! command -v apt-get >/dev/null 2>&1; then
  echo "tailguard needs these system packages, and this machine has no apt-get: please install ${packages}(the Prometheus server with promtool, Alertmanager and Python's venv module) and re-run." >&2
  exit 1
fi

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then
    sudo_cmd=(sudo -n)
  else
    echo "tailguard needs these system packages and installing them requires root: please run 'apt-get install --no-install-recommends ${packages}' as root and re-run." >&2
    exit 1
  fi
fi

echo "installing system packages: ${packages}"
export DEBIAN_FRONTEND=noninteractive
# shellcheck disable=SC2086  # word splitting of the package list is intended
"${sudo_cmd[@]}" apt-get update -qq
# shellcheck disable=SC2086
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends ${packages} >/dev/null
