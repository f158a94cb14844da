# shellcheck shell=bash
# Shared by cluster/build-*.sh: the pinned versions, the binary cache and its version stamps.
# Source it after setting LOG_TAG; a binary whose stamp matches its pinned version is not rebuilt.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=versions.env
source "$here/versions.env"
PREHEAT_CACHE="${PREHEAT_CACHE:-$HOME/.cache/preheat}"
bin="$PREHEAT_CACHE/bin"
work="$PREHEAT_CACHE/gobuild"
mkdir -p "$bin" "$work"
export GOFLAGS="${GOFLAGS:-} -trimpath"
export CGO_ENABLED=0

stamp_ok() { [ -x "$bin/$1" ] && [ "$(cat "$bin/.$1.version" 2>/dev/null)" = "$2" ]; }
stamp() { echo "$2" > "$bin/.$1.version"; }
log() { echo "[${LOG_TAG:-build}] $*" >&2; }
