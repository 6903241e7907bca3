"""Learning rates equal to Caffe's float for float on every CPU, over long schedules.

Two references, neither of them numpy (whose vectorised pow/exp differ from libm by an ulp on some CPUs, which
is how an AVX-512 machine once failed the golden rates):
- Caffe's expressions written out with libm's powf/expf/pow called through ctypes, in numpy float32 scalars;
- Caffe's SGDSolver::GetLearningRate itself, compiled by g++ with Dtype = float (the overloads std::pow and
  std::exp pick are then the compiler's, not our reading of them).
"""
import ctypes
import ctypes.util
import shutil
import subprocess

import numpy as np
import pytest

from pycaffe_dist.proto import caffe_pb2
from pycaffe_dist.solver.lr_policy import learning_rate

f32 = np.float32
ITERATIONS = 50_000
LIBM = ctypes.CDLL(ctypes.util.find_library("m") or None)
LIBM.powf.restype, LIBM.powf.argtypes = ctypes.c_float, [ctypes.c_float, ctypes.c_float]
LIBM.expf.restype, LIBM.expf.argtypes = ctypes.c_float, [ctypes.c_float]

# (policy, base_lr, gamma, power, stepsize, max_iter, stepvalues): LeNet's inv, the golden cases' kind of
# settings, and others that reach far into the exponent's range.
SCHEDULES = [
    ("inv", 0.01, 0.0001, 0.75, 0, 0, ()),
    ("inv", 0.1, 0.001, 0.5, 0, 0, ()),
    ("inv", 0.03, 0.37, 2.25, 0, 0, ()),
    ("poly", 0.01, 0, 0.5, 0, ITERATIONS, ()),
    ("poly", 0.1, 0, 2.0, 0, ITERATIONS + 7, ()),
    ("poly", 0.07, 0, 1.3, 0, 60_000, ()),
    ("sigmoid", 0.01, 0.0005, 0, 25_000, 0, ()),
    ("sigmoid", 0.2, 0.01, 0, 700, 0, ()),
    ("step", 0.01, 0.1, 0, 3_333, 0, ()),
    ("exp", 0.01, 0.9999, 0, 0, 0, ()),
    ("multistep", 0.01, 0.31, 0, 0, 0, (1_000, 7_777, 20_000, 40_001)),
    ("fixed", 0.013, 0, 0, 0, 0, ()),
]


def solver_param(policy, base_lr, gamma, power, stepsize, max_iter, stepvalues):
    param = caffe_pb2.SolverParameter(lr_policy=policy, base_lr=base_lr, gamma=gamma, power=power,
                                      stepsize=stepsize, max_iter=max_iter)
    param.stepvalue.extend(stepvalues)
    return param


def ours(schedule):
    param, step, rates = solver_param(*schedule), 0, []
    for it in range(ITERATIONS):
        rate, step = learning_rate(param, it, step)
        rates.append(rate)
    return np.array(rates, dtype=f32)


@pytest.mark.parametrize("schedule", [s for s in SCHEDULES if s[0] in ("inv", "poly", "sigmoid")],
                         ids=lambda s: "%s-%g-%g" % s[:3])
def test_powf_and_expf_rates_are_libms(schedule):
    """base * powf(1 + gamma * iter, -power), base * powf(1 - iter / max_iter, power),
    base * (1 / (1 + expf(-gamma * (iter - stepsize)))), every operation in float."""
    policy, base, gamma, power, stepsize, max_iter, _ = schedule
    base, gamma, power = f32(base), f32(gamma), f32(power)
    want = []
    with np.errstate(over="ignore"):
        for it in range(ITERATIONS):
            if policy == "inv":
                rate = base * f32(LIBM.powf(f32(1) + gamma * f32(it), -power))
            elif policy == "poly":
                rate = base * f32(LIBM.powf(f32(1) - f32(it) / f32(max_iter), power))
            else:
                rate = base * (f32(1) / (f32(1) + f32(LIBM.expf(-gamma * (f32(it) - f32(stepsize))))))
            want.append(rate)
    got = ours(schedule)
    differ = np.flatnonzero(got.view(np.uint32) != np.array(want, dtype=f32).view(np.uint32))
    assert differ.size == 0, "%d of %d rates differ from libm's, first at iteration %d" % (
        differ.size, ITERATIONS, differ[0])


# Caffe's SGDSolver<Dtype>::GetLearningRate (src/caffe/solvers/sgd_solver.cpp), its expressions verbatim with
# the solver's fields as float (proto float fields) and iter_ as int.
CAFFE_RATES = r"""
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
using namespace std;
typedef float Dtype;
int main(int argc, char** argv) {
  std::string lr_policy = argv[1];
  float base_lr = atof(argv[2]), gamma = atof(argv[3]), power = atof(argv[4]);
  int stepsize = atoi(argv[5]), max_iter = atoi(argv[6]), iterations = atoi(argv[7]);
  std::vector<int> stepvalue;
  for (int i = 8; i < argc; ++i) stepvalue.push_back(atoi(argv[i]));
  int current_step_ = 0;
  for (int iter_ = 0; iter_ < iterations; ++iter_) {
    Dtype rate;
    if (lr_policy == "fixed") {
      rate = base_lr;
    } else if (lr_policy == "step") {
      current_step_ = iter_ / stepsize;
      rate = base_lr * pow(gamma, current_step_);
    } else if (lr_policy == "exp") {
      rate = base_lr * pow(gamma, iter_);
    } else if (lr_policy == "inv") {
      rate = base_lr * pow(Dtype(1) + gamma * iter_, - power);
    } else if (lr_policy == "multistep") {
      if (current_step_ < (int)stepvalue.size() && iter_ >= stepvalue[current_step_]) current_step_++;
      rate = base_lr * pow(gamma, current_step_);
    } else if (lr_policy == "poly") {
      rate = base_lr * pow(Dtype(1.) - (Dtype(iter_) / Dtype(max_iter)), power);
    } else {
      rate = base_lr * (Dtype(1.) / (Dtype(1.) + exp(-gamma * (Dtype(iter_) - Dtype(stepsize)))));
    }
    fwrite(&rate, sizeof rate, 1, stdout);
  }
  return 0;
}
"""


@pytest.fixture(scope="module")
def caffe_rates(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    folder = tmp_path_factory.mktemp("caffe_rates")
    (folder / "rates.cpp").write_text(CAFFE_RATES)
    # No -ffast-math and no -O: the float expressions as written, the maths calls to libm.
    subprocess.run(["g++", "-std=c++11", "-o", str(folder / "rates"), str(folder / "rates.cpp")], check=True)

    def run(schedule):
        policy, base, gamma, power, stepsize, max_iter, stepvalues = schedule
        # %.9g: a float's shortest round trip, so atof gives g++ the very float the protobuf field holds.
        args = [policy] + ["%.9g" % f32(v) for v in (base, gamma, power)]
        args += [str(v) for v in (stepsize, max_iter, ITERATIONS) + tuple(stepvalues)]
        out = subprocess.run([str(folder / "rates")] + args, check=True, stdout=subprocess.PIPE).stdout
        return np.frombuffer(out, dtype=f32)
    return run


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: "%s-%g-%g" % s[:3])
def test_every_policy_equals_caffes_compiled_expression(schedule, caffe_rates):
    want, got = caffe_rates(schedule), ours(schedule)
    assert want.shape == (ITERATIONS,)
    differ = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert differ.size == 0, "%d of %d rates differ from Caffe's, first at iteration %d: %r != %r" % (
        differ.size, ITERATIONS, differ[0], got[differ[0]], want[differ[0]])
