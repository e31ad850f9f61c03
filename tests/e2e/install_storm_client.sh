#!/usr/bin/env bash
# Install the STORM paper's file-editor client (shared/data/storm-client: its OpenHands SDK
# fork) and git storm into a Python 3.12 virtualenv in a cache directory, for
# tests/e2e/test_storm_client.py. Usage: install_storm_client.sh CLIENT_DIR REPO [DIR]
# (DIR defaults to $STORM_CLIENT_VENV or ~/.cache/storm-client-venv). Prints the venv's python.
set -euo pipefail
client="$1"; repo="$2"
dir="${3:-${STORM_CLIENT_VENV:-$HOME/.cache/storm-client-venv}}"
py312=""
for c in "$HOME"/.pyenv/versions/3.12*/bin/python3.12 python3.12; do  # a pyenv shim may not run: try it
  if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
    py312="$(command -v "$c")"; break
  fi
done
[ -n "$py312" ] || { echo "no Python 3.12 interpreter (python3.12 or ~/.pyenv/versions/3.12*)" >&2; exit 3; }
stamp="$dir/.installed-$(sha256sum "$client/sdk/openhands-sdk-tools-1.18.0.tar.gz" "$client/sdk/constraints.txt" | sha256sum | cut -c1-16)"
if [ ! -e "$stamp" ] || [ ! -x "$dir/bin/python" ]; then
  rm -rf "$dir"
  "$py312" -m venv "$dir"
  mkdir -p "$dir/src"
  tar xzf "$client/sdk/openhands-sdk-tools-1.18.0.tar.gz" -C "$dir/src"
  "$dir/bin/python" -m pip install --quiet --upgrade pip >&2
  "$dir/bin/python" -m pip install --quiet -c "$client/sdk/constraints.txt" \
    -e "$dir/src/openhands-sdk" -e "$dir/src/openhands-tools" >&2
  touch "$stamp"
fi
# git storm itself from this checkout, every time (cheap: an editable install)
"$dir/bin/python" -m pip install --quiet -c "$client/sdk/constraints.txt" -e "$repo" >&2
echo "$dir/bin/python"
