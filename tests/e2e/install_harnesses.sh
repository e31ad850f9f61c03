#!/usr/bin/env bash
# Install the pinned real harnesses (Claude Code, Codex) from the npm registry
# into a cache directory, for the end-to-end suite (pytest -m harness).
# Usage: tests/e2e/install_harnesses.sh [DIR]   (default: $STORM_HARNESS_DIR or ~/.cache/storm-harnesses)
# Prints the directory whose bin/ holds `claude` and `codex`.
set -euo pipefail
CLAUDE_CODE_VERSION="${CLAUDE_CODE_VERSION:-2.1.197}"   # newest that declares node >= 18
CODEX_VERSION="${CODEX_VERSION:-0.171.0}"
dir="${1:-${STORM_HARNESS_DIR:-$HOME/.cache/storm-harnesses}}"
mkdir -p "$dir"
stamp="$dir/.installed-$CLAUDE_CODE_VERSION-$CODEX_VERSION"
if [ ! -e "$stamp" ] || [ ! -x "$dir/node_modules/.bin/claude" ] || [ ! -x "$dir/node_modules/.bin/codex" ]; then
  npm install --prefix "$dir" --no-audit --no-fund --loglevel=error \
    "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" "@openai/codex@$CODEX_VERSION" >&2
  touch "$stamp"
fi
echo "$dir/node_modules/.bin"
