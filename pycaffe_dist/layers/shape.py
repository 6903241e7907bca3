"""Layers that move, combine or reduce blobs: Split, Concat, Slice, Flatten, Reshape, Crop, Tile, Eltwise, Silence, BatchReindex, Filter, ArgMax, Reduction, Softmax, Scale, Bias, Parameter."""
