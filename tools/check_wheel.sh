#!/usr/bin/env bash
# A wheel that installs anywhere: build the sdist and, from it, the wheel (`python -m build`), install the wheel
# (not editable) into a fresh virtual environment outside the checkout, and from a directory outside the checkout
# run `dist_caffe --version` (it must print pycaffe_dist/__init__.py's __version__, the one place the version is
# kept), `import caffe, pycaffe_dist` (both from the virtual environment, not from the checkout) and a 20-iteration
# `dist_caffe train` of a tiny net. Part of .ci/run. Why a copy and a venv: an editable install and the checkout on
# sys.path hide files the sdist or the wheel forgot (a header, a .cu, caffe.proto); here nothing but the wheel is
# there to import.
#
# Building compiles the Cython kernels (a few minutes on 2 cores). The kernels are built for x86-64-v2 on x86-64
# (PYCAFFE_DIST_MARCH, see setup.py), so the wheel runs on machines other than the one that built it; set
# PYCAFFE_DIST_MARCH=native to build for this CPU. KEEP=1 keeps the work directory (it is named on stderr).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/pcd-check-wheel.XXXXXX")
if [ "${KEEP:-0}" = 1 ]; then
    trap 'echo "check_wheel: kept $work" >&2' EXIT
else
    trap 'rm -rf "$work"' EXIT
fi
start=$SECONDS
say() { echo "check_wheel: [$((SECONDS - start)) s] $*" >&2; }
fail() { echo "check_wheel: FAILED: $*" >&2; exit 1; }

version=$(sed -n 's/^__version__ *= *["'\'']\([^"'\'']*\)["'\''].*/\1/p' "$root/pycaffe_dist/__init__.py")
[ -n "$version" ] || fail "no __version__ = \"...\" line in pycaffe_dist/__init__.py"

# 1. A copy of the source tree: what git tracks, and new files git does not ignore (no build outputs, no data).
#    Building in the checkout would write csrc/*.c and egg-info beside an editable install others may be using.
mkdir "$work/src"
if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    (cd "$root" && git ls-files -z --cached --others --exclude-standard \
        | tar --null --files-from=- --ignore-failed-read -cf - 2>/dev/null) | tar -xf - -C "$work/src"
else
    tar -C "$root" --exclude=./build --exclude=./data --exclude=./out --exclude=./.git --exclude='*.so' -cf - . \
        | tar -xf - -C "$work/src"
fi
say "source copied to $work/src ($(du -sh "$work/src" | cut -f1))"

# 2. The sdist, then the wheel built from the sdist (so a file the sdist leaves out breaks the wheel here).
if [ -z "${PYCAFFE_DIST_MARCH:-}" ] && [ "$(uname -m)" = x86_64 ]; then
    export PYCAFFE_DIST_MARCH=x86-64-v2
fi
"$python" -m pip install --quiet --disable-pip-version-check build
say "python -m build (sdist, then the wheel from it; PYCAFFE_DIST_MARCH=${PYCAFFE_DIST_MARCH:-native})"
"$python" -m build --outdir "$work/dist" "$work/src" >"$work/build.log" 2>&1 \
    || { tail -n 40 "$work/build.log" >&2; fail "python -m build (log above)"; }
sdist=$(ls "$work"/dist/*.tar.gz) && wheel=$(ls "$work"/dist/*.whl) || fail "python -m build made no sdist or no wheel"
say "built $(basename "$sdist") and $(basename "$wheel")"
case $(basename "$wheel") in
    *-"$version"-*) ;;
    *) fail "the wheel's name $(basename "$wheel") does not carry the version $version" ;;
esac

# 3. A fresh virtual environment outside the checkout, the wheel installed into it (not editable).
"$python" -m venv "$work/venv"
venv_python=$work/venv/bin/python
"$venv_python" -m pip install --quiet --disable-pip-version-check "$wheel" \
    || fail "pip install $(basename "$wheel") into a fresh virtual environment"
say "installed into $work/venv"

# 4. From a directory outside the checkout, with nothing of the checkout on the path.
mkdir "$work/run"
cd "$work/run"
unset PYTHONPATH
export PATH=$work/venv/bin:$PATH

printed=$(dist_caffe --version) || fail "dist_caffe --version"
say "dist_caffe --version: $printed"
case " $printed " in
    *" $version "*) ;;
    *) fail "dist_caffe --version printed '$printed', not pycaffe_dist/__init__.py's version $version" ;;
esac

# Both packages from the venv, and every Cython kernel of csrc/ compiled into the wheel (an sdist without the
# kernels' sources gave a wheel without them), with the CUDA kernels' host library.
kernels=$(cd "$root/csrc" && ls ./*.pyx | sed 's#^\./##; s#\.pyx$##' | tr '\n' ' ')
# shellcheck disable=SC2086
"$venv_python" - "$work/venv" $kernels <<'EOF' || fail "import caffe, pycaffe_dist and the kernels from the venv"
import importlib
import os
import sys

import caffe
import pycaffe_dist

venv = os.path.realpath(sys.argv[1])
for module in (caffe, pycaffe_dist):
    where = os.path.realpath(module.__file__)
    if not where.startswith(venv + os.sep):
        sys.exit("%s was imported from %s, not from the virtual environment %s" % (module.__name__, where, venv))
for stem in sys.argv[2:]:
    importlib.import_module("pycaffe_dist._kernels." + stem)
host = os.path.join(os.path.dirname(pycaffe_dist.__file__), "_kernels", "cuda", "host_emulation.so")
if not os.path.exists(host):
    sys.exit("the wheel has no %s (the CUDA kernels built for the host)" % host)
print("check_wheel: import caffe, pycaffe_dist and %d kernels from %s"
      % (len(sys.argv) - 2, os.path.dirname(os.path.dirname(pycaffe_dist.__file__))), file=sys.stderr)
EOF

# A tiny net (DummyData, InnerProduct, SoftmaxWithLoss) and a solver of 20 iterations, no snapshot, on the CPU.
cat >tiny_net.prototxt <<'EOF'
name: "tiny"
layer {
  name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param {
    shape { dim: 8 dim: 4 } shape { dim: 8 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 1 }
  }
}
layer {
  name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "xavier" } }
}
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
EOF
cat >tiny_solver.prototxt <<'EOF'
net: "tiny_net.prototxt"
base_lr: 0.1
lr_policy: "fixed"
max_iter: 20
display: 5
snapshot: 0
snapshot_after_train: false
solver_mode: CPU
random_seed: 1
EOF
dist_caffe train --solver tiny_solver.prototxt >train.log 2>&1 \
    || { tail -n 20 train.log >&2; fail "dist_caffe train on the tiny net (log above)"; }
grep -q "Optimization Done" train.log || { tail -n 20 train.log >&2; fail "dist_caffe train did not finish"; }
say "dist_caffe train: $(grep -o 'Iteration 20, loss = [0-9.e+-]*' train.log || echo 'done')"
if ls ./*.caffemodel ./*.solverstate >/dev/null 2>&1; then
    fail "dist_caffe train wrote a snapshot, which the solver did not ask for"
fi
say "OK: $(basename "$wheel") installs and trains outside the checkout"
