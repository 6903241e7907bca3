"""Trained nets in other formats: ONNX (onnx_graph.py writes the graph, onnx_check.py runs it in onnxruntime
against our forward). The onnx and onnxruntime packages are optional (the `onnx` extra): importing this package
does not need them, exporting says so in one line when they are missing."""
from .onnx_check import compare
from .onnx_graph import DEFAULT_OPSET, MIN_OPSET, REFUSED, build_model, load_net, to_onnx

__all__ = ["DEFAULT_OPSET", "MIN_OPSET", "REFUSED", "build_model", "compare", "load_net", "to_onnx"]
