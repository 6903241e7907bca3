#!/usr/bin/env bash
# Run the real Caffe's own pycaffe tests (python/caffe/test/, 10 files, 52 tests), unmodified, against this project's
# `import caffe`. They are Caffe's, not ours, so they are not in this repository: give a Caffe checkout, or let this
# clone BVLC's. test_draw walks Caffe's models/ and examples/, so those come along; Caffe's python/caffe package does
# not, so that `import caffe` finds ours.
#   usage: tools/run_caffe_pytests.sh [CAFFE_CHECKOUT] [pytest arguments]
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
caffe="${1:-}"
if [ -z "$caffe" ]; then
    git clone --quiet --depth 1 https://github.com/BVLC/caffe "$work/src"
    caffe="$work/src"
else
    shift
fi
mkdir -p "$work/root/python/caffe"
cp -r "$caffe/models" "$caffe/examples" "$work/root/"
cp -r "$caffe/python/caffe/test" "$work/root/python/caffe/test"
cd "$work/root/python/caffe/test"
PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" python3 -m pytest -q -p no:cacheprovider -W ignore::DeprecationWarning "$@" .
