"""pycaffe-dist: a Caffe-compatible trainer. `import pycaffe_dist as caffe` gives pycaffe's interface."""
import os

# Our OpenMP kernels and the BLAS's own threads take turns on the same cores. GNU OpenMP's default is to spin
# for a long while after each parallel region, which starves the BLAS threads of the next GEMM (measured: 2
# threads ran 4-8x slower than 1). Idle OpenMP threads must sleep instead; read when libgomp loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
from .common import set_device, set_mode_cpu, set_mode_gpu, set_random_seed
from .errors import (DataError, ModelFileError, NetError, PrototxtError, PycaffeDistError, SolverError, StoreError,
                     UpgradeError)
from . import io
from .layers.python_layer import UserLayer as Layer
from .net.blob import Blob
from .net_spec import NetSpec, layers, params, to_proto
from .proto import caffe_pb2
from .pycaffe import (TEST, TRAIN, AdaDeltaSolver, AdaGradSolver, AdamSolver, Net, NesterovSolver, RMSPropSolver,
                      SGDSolver, get_solver)

__version__ = "0.1.0"

__all__ = ["AdaDeltaSolver", "AdaGradSolver", "AdamSolver", "Blob", "DataError", "Layer", "ModelFileError", "Net",
           "NesterovSolver", "NetError", "NetSpec", "PrototxtError", "PycaffeDistError", "RMSPropSolver",
           "SGDSolver", "SolverError", "StoreError", "TEST", "TRAIN", "UpgradeError", "caffe_pb2", "get_solver",
           "io", "layers", "params", "set_device", "set_mode_cpu", "set_mode_gpu", "set_random_seed", "to_proto"]
