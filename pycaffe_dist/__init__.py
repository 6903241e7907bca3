"""pycaffe-dist: a Caffe-compatible trainer. `import pycaffe_dist as caffe` gives pycaffe's interface."""
import os

# Our OpenMP threads are the only ones that compute: they split the GEMMs too, each BLAS call single-threaded
# (csrc/gemm.pyx says why). Set before numpy loads, this keeps OpenBLAS from starting a thread pool at all;
# pycaffe_dist.common.single_threaded_blas covers a numpy imported earlier. (OpenMP keeps its default wait
# policy: a short spin, then sleep, which the many small parallel regions of a net step need.)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
from .common import set_device, set_mode_cpu, set_mode_gpu, set_random_seed
from .errors import (DataError, ModelFileError, NetError, PrototxtError, PycaffeDistError, SolverError, StoreError,
                     UpgradeError)
from . import io
from .layers.python_layer import UserLayer as Layer
from .blob.blob import Blob
from .classifier import Classifier
from .detector import Detector
from .net_spec import NetSpec, layers, params, to_proto
from .proto import caffe_pb2
from .pycaffe import (NCCL, TEST, TRAIN, AdaDeltaSolver, AdaGradSolver, AdamSolver, Net, NesterovSolver,
                      RMSPropSolver, SGDSolver, Timer, get_solver, has_nccl, init_log, layer_type_list, log,
                      set_multiprocess, set_solver_count, set_solver_rank, solver_count, solver_rank)

__version__ = "0.1.0"

__all__ = ["AdaDeltaSolver", "AdaGradSolver", "AdamSolver", "Blob", "Classifier", "DataError", "Detector", "Layer",
           "ModelFileError", "NCCL", "NesterovSolver", "Net", "NetError", "NetSpec", "PrototxtError",
           "PycaffeDistError", "RMSPropSolver", "SGDSolver", "SolverError", "StoreError", "TEST", "TRAIN", "Timer",
           "UpgradeError", "caffe_pb2", "get_solver", "has_nccl", "init_log", "io", "layer_type_list", "layers",
           "log", "params", "set_device", "set_mode_cpu", "set_mode_gpu", "set_multiprocess", "set_random_seed",
           "set_solver_count", "set_solver_rank", "solver_count", "solver_rank", "to_proto"]
