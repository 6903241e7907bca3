"""Does an exported ONNX model compute what our net computes? onnxruntime and our forward on the same inputs,
compared output by output: the largest difference relative to the largest magnitude of our output (so that a
check means the same on probabilities near 1 and on logits in the hundreds)."""
import numpy as np

from ..errors import ExportError

TOLERANCE = 1e-4


def _onnxruntime():
    try:
        import onnxruntime
    except ImportError:
        raise ExportError("checking an ONNX model needs onnxruntime: pip install 'pycaffe-dist[onnx]' "
                          "(or pip install onnxruntime)") from None
    return onnxruntime


def random_inputs(net, seed=0):
    """{input blob: standard normal float32 array of its shape}."""
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(net.blob_by_name(name).shape).astype(np.float32) for name in net.inputs}


def relative_difference(ours, theirs):
    """max |ours - theirs| / max |ours| over the finite values (absolute where ours is all zeros); infinite where
    the shapes or the places of NaN and infinity differ."""
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    if ours.shape != theirs.shape:
        return float("inf")
    finite = np.isfinite(ours)
    if not np.array_equal(finite, np.isfinite(theirs)):
        return float("inf")
    if not np.array_equal(ours[~finite], theirs[~finite], equal_nan=True):
        return float("inf")
    if not finite.any():
        return 0.0
    scale = np.abs(ours[finite]).max()
    diff = np.abs(ours[finite] - theirs[finite]).max()
    return float(diff / scale) if scale > 0 else float(diff)


def run_onnx(model, feeds, threads=None):
    """The model's outputs (in graph order) for `feeds`, from onnxruntime on the CPU."""
    ort = _onnxruntime()
    options = ort.SessionOptions()
    options.log_severity_level = 3      # no warnings about initializers being graph inputs etc.
    if threads:
        options.intra_op_num_threads = threads
    data = model if isinstance(model, bytes) else model.SerializeToString()
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def compare(net, model, inputs=None, seed=0, threads=None):
    """Forward `inputs` (default: random_inputs) through our net and the ONNX model (a ModelProto, or its bytes,
    exported from this net as it is shaped now); returns {output blob: relative_difference}."""
    feeds = inputs if inputs is not None else random_inputs(net, seed)
    for name, array in feeds.items():
        net.blob_by_name(name).data[...] = array
    net.forward_from_to(0, len(net.layers) - 1)
    ours = {name: np.array(net.blob_by_name(name).data) for name in net.outputs}
    theirs = run_onnx(model, {k: np.ascontiguousarray(v, np.float32) for k, v in feeds.items()}, threads)
    if len(theirs) != len(ours):
        raise ExportError("the ONNX model has %d outputs, the net %d (%s): was it exported from this net?"
                          % (len(theirs), len(ours), ", ".join(ours)))
    return {name: relative_difference(ours[name], y) for name, y in zip(net.outputs, theirs)}
