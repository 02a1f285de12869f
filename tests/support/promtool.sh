#!/bin/sh
# Runs promtool with the given arguments for CTest; exits 77 (CTest: Skipped) when promtool is not installed.
if ! command -v promtool >/dev/null 2>&1; then
  echo "SKIPPED: promtool not installed (bash scripts/install-deps.sh --test-tools)"
  exit 77
fi
exec promtool "$@"
