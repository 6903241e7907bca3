#!/usr/bin/env bash
# Build only the named Cython kernel modules in place, e.g. `tools/build_kernel.sh pooling neuron`
# (a quick rebuild while working on one kernel; `pip install -e .` builds them all).
set -euo pipefail
cd "$(dirname "$0")/.."
for stem in "$@"; do
    PYCAFFE_DIST_KERNELS="$stem" python3 setup.py -q build_ext --inplace --build-temp "build/tmp-$stem"
done
