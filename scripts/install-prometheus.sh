#!/usr/bin/env bash
# Debian's prometheus package provides prometheus and promtool. We run it ourselves (the launcher
# starts it with our config), so the packaged systemd service is not used.
set -euo pipefail
if command -v prometheus >/dev/null && command -v promtool >/dev/null; then exit 0; fi
export DEBIAN_FRONTEND=noninteractive
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
