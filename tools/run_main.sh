#!/usr/bin/env bash
# The main job on a fresh machine: set up, convert Fashion-MNIST, train Caffe's LeNet on it with Caffe's
# lenet_solver (prototxt/), print the final test accuracy and plot the training curves.
#   ITERATIONS=N   train N iterations instead of the solver's 10000 (tests every 500 stay)
#   THREADS=N      CPU threads (default: all cores)
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -e .

idx=/usr/share/datasets/fashion-mnist
if [ ! -d "$idx" ]; then
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get update -qq && $sudo apt-get install -y -qq dataset-fashion-mnist
fi
mkdir -p data/fashion-mnist out
for split in train:train t10k:test; do
    src=${split%%:*} dst=data/fashion-mnist/${split##*:}.datumfile
    [ -f "$dst" ] || dist_caffe convert-idx "$idx/$src-images-idx3-ubyte.gz" "$idx/$src-labels-idx1-ubyte.gz" "$dst" \
        --backend datumfile
done

iterations=${ITERATIONS:-10000}
threads=()
[ -z "${THREADS:-}" ] || threads=(--threads "$THREADS")
rm -f out/lenet_train.log
dist_caffe train --solver prototxt/lenet_solver.prototxt --iterations "$iterations" "${threads[@]}" \
    --log out/lenet_train.log
# Score the final weights on all 10000 test images (100 batches of 100).
dist_caffe test --model prototxt/lenet_train_test.prototxt --weights "out/lenet_iter_$iterations.caffemodel" \
    --iterations 100 "${threads[@]}" 2>&1 | tail -n 2 | tee out/lenet_test.txt
dist_caffe plot out/lenet_train.log -o out/lenet_train.png
echo "final test accuracy (10000 Fashion-MNIST test images): $(grep -o 'accuracy = [0-9.]*' out/lenet_test.txt \
    | awk '{print $NF}')"
echo "log: out/lenet_train.log, plot: out/lenet_train.png, weights: out/lenet_iter_$iterations.caffemodel"
