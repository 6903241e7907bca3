#!/usr/bin/env bash
# Set up and run the main job on real files. Until the solver lands this shows the foundation at work on
# model-zoo files: upgrade a 2014 V0 LeNet, then build ResNet-152 and print its layer table.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -e .
out=${OUT_DIR:-out}
mkdir -p "$out"
zoo=../shared/zoo
dist_caffe upgrade "$zoo/bvlc_history/v0.99-2014-03-19/examples/lenet/lenet.prototxt" "$out/lenet_v2.prototxt"
dist_caffe net-info "$out/lenet_v2.prototxt"
dist_caffe net-info "$zoo/KaimingHe_deep-residual-networks/prototxt/ResNet-152-deploy.prototxt" | tail -n 4
