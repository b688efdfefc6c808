#!/usr/bin/env bash
# Prepares what a GPU device call needs and cannot fetch there (no network on that machine):
#   .whl/  the wheels of the agent graph's packages its image lacks (Python 3.12, x86_64), and
#          Debian's bubblewrap binary (uploads are refused without isolation);
#   .kb/   a copy of the KernelBench dev set (../shared is not sent with the working tree).
# Both folders are git-ignored; name them in the device call's `carry`. Run from the repo root.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl .kb
# Packages the device image already holds are dropped, so its own versions stay in charge.
ON_IMAGE='^(anyio|attrs|certifi|charset_normalizer|h11|httpcore|httpx|idna|packaging|pyyaml|regex|requests|tiktoken|typing_extensions|urllib3|xxhash)-'
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    --platform any -d "$tmp" "langgraph>=1.0,<2" "langgraph-checkpoint-sqlite>=2" "langchain-openai>=0.3" "einops>=0.7"
for w in "$tmp"/*.whl; do
    name=$(basename "$w")
    grep -Eqi "$ON_IMAGE" <<<"$name" || cp "$w" .whl/
done
if [ ! -x .whl/bwrap ]; then
    (cd "$tmp" && apt-get download bubblewrap >/dev/null && dpkg -x bubblewrap_*.deb root)
    cp "$tmp"/root/usr/bin/bwrap .whl/bwrap
fi
rm -rf .kb/kernelbench-dev && cp -r ../shared/kernelbench-dev .kb/
du -sh .whl .kb
