"""Layers that move, copy, select or reshape the values of blobs: Split, Concat, Slice, Flatten, Reshape, Crop,
Tile, Silence, BatchReindex, Filter, Parameter. Arithmetic between blobs is in arithmetic.py, reductions in
reduction.py.

GPU code (Split, Concat, Slice, Crop, Tile, Silence, BatchReindex, Filter) mirrors Caffe's *_layer.cu with the
kernels of csrc/cuda/shape.cu and math.cu; Flatten and Reshape share memory either way, so their GPU code moves
nothing, on the device as on the host."""
import numpy as np

from ..backend import select
from ..blob.blob import count
from .base import Layer, checked_axis
from .gpu_helpers import gpu_table
from .registry import register


def _no_in_place(layer, bottom, top):
    for t in top:
        layer.check(t is not bottom[0], "%s Layer does not allow in-place computation." % layer.param.type)


def _share(layer, top, source):
    """top views source's data and diff (Caffe's ShareData + ShareDiff), so nothing is copied either way.
    Caffe shares before SetLossWeights writes a top's loss weight into its diff, so the weight lives in the
    shared diff, where the bottom's producer reads it; nothing else writes that diff."""
    top[0].share_reshaped(source)
    if layer.loss_weights and layer.loss_weights[0]:
        top[0].diff[...] = layer.loss_weights[0]


def _share_gpu(layer, top, source):
    """_share on the device: the loss weight goes into the shared diff's device copy."""
    top[0].share_reshaped(source)
    if layer.loss_weights and layer.loss_weights[0]:
        select.current().fill(top[0].mutable_gpu_diff, layer.loss_weights[0])


def _copy_axis_block(dev, src, src_dim, src_start, dst, dst_dim, dst_start, outer, block, inner):
    """Copy `block` entries of one axis, as (outer, block, inner), between blobs whose axis holds src_dim and dst_dim
    entries, from src_start to dst_start (concat_layer.cu / slice_layer.cu's kernels, as math.cu's gpu_copy_rows)."""
    width = block * inner
    dev.launch("gpu_copy_rows", outer * width, width, src, src_dim * inner, src_start * inner, dst, dst_dim * inner,
               dst_start * inner)


def _axis_slices(axis, start, stop):
    """The index tuple selecting [start, stop) along `axis`."""
    return (slice(None),) * axis + (slice(start, stop),)


@register("Split")
class SplitLayer(Layer):
    """Gives its bottom's data to every top (the net inserts these where one blob feeds several layers); the
    bottom's gradient is the sum of the tops' diffs."""
    reshape_from_shapes = True
    exact_num_bottom = 1
    min_top = 1

    def reshape(self, bottom, top):
        _no_in_place(self, bottom, top)     # split_layer.cpp
        for t in top:
            t.reshape(bottom[0].shape)

    def forward(self, bottom, top):
        for t in top:
            t.share_data(bottom[0])     # split_layer.cpp: tops share the bottom's data; each keeps its own diff

    forward_gpu = forward               # the shared memory holds the device copy too: nothing moves

    def backward_gpu(self, top, propagate_down, bottom):
        # split_layer.cu: copy one top diff, else add the first two and axpy the others (here in one launch with
        # the same sums, where there are more than two)
        if not propagate_down[0]:
            return
        dev = select.current()
        diff = bottom[0].mutable_gpu_diff
        if len(top) == 1:
            dev.copy(diff, top[0].gpu_diff)
        elif len(top) == 2:
            dev.launch("gpu_add", diff.size, top[0].gpu_diff, top[1].gpu_diff, diff)
        else:
            tops = gpu_table(self, "tops", [t.gpu_diff.ptr for t in top], np.int64)
            dev.launch("split_sum_many", diff.size, len(top), tops, diff)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        diff = bottom[0].diff
        if len(top) == 1:
            diff[...] = top[0].diff
            return
        np.add(top[0].diff, top[1].diff, out=diff)
        for t in top[2:]:
            diff += t.diff


@register("Concat")
class ConcatLayer(Layer):
    reshape_from_shapes = True
    min_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.concat_param
        self.check(not (p.HasField("axis") and p.HasField("concat_dim")),
                   "Either axis or concat_dim should be specified; not both.")

    def reshape(self, bottom, top):
        # concat_layer.cpp Reshape
        p = self.param.concat_param
        num_axes = len(bottom[0].shape)
        if p.HasField("concat_dim"):
            axis = p.concat_dim
            # Caffe casts the uint32 to int; a negative result is refused, as is an axis past the last.
            self.check(axis < num_axes, "concat_dim out of range (%d for %d-axis inputs)" % (axis, num_axes))
        else:
            axis = checked_axis(self, p.axis, num_axes, "concat axis")
        self.axis = axis
        shape = list(bottom[0].shape)
        for i, b in enumerate(bottom[1:], 1):
            self.check(len(b.shape) == num_axes, "All inputs must have the same #axes (bottom 0 %s, bottom %d %s)"
                       % (bottom[0].shape, i, b.shape))
            for j in range(num_axes):
                if j != axis:
                    self.check(shape[j] == b.shape[j], "All inputs must have the same shape, except at concat_axis "
                               "(axis %d; bottom 0 %s, bottom %d %s)" % (axis, bottom[0].shape, i, b.shape))
            shape[axis] += b.shape[axis]
        top[0].reshape(shape)

    def forward(self, bottom, top):
        if len(bottom) == 1:
            _share(self, top, bottom[0])     # concat_layer.cpp: one bottom is shared, not copied
            return
        np.concatenate([b.data for b in bottom], axis=self.axis, out=top[0].data)

    def backward(self, top, propagate_down, bottom):
        if len(bottom) == 1:
            return
        diff, start = top[0].diff, 0
        for b, down in zip(bottom, propagate_down):
            stop = start + b.shape[self.axis]
            if down:
                b.diff[...] = diff[_axis_slices(self.axis, start, stop)]
            start = stop

    # On the GPU every bottom is copied in one launch (concat_many), where concat_layer.cu launches one per bottom.
    def forward_gpu(self, bottom, top):
        if len(bottom) == 1:
            _share_gpu(self, top, bottom[0])
            return
        self._gpu_copies(bottom, top, [b.gpu_data for b in bottom], top[0].mutable_gpu_data, 1)

    def backward_gpu(self, top, propagate_down, bottom):
        if len(bottom) == 1 or not any(propagate_down):
            return
        self._gpu_copies(bottom, top, [b.mutable_gpu_diff if down else None
                                       for b, down in zip(bottom, propagate_down)], top[0].gpu_diff, 0)

    def _gpu_copies(self, bottom, top, arrays, top_array, forward):
        """concat_many over the top: `arrays` are the bottoms' (None: not copied)."""
        axis = self.axis
        starts = [0]
        for b in bottom:
            starts.append(starts[-1] + b.shape[axis])
        addresses = gpu_table(self, "forward" if forward else "backward", [a.ptr if a is not None else 0
                                                                          for a in arrays], np.int64)
        select.current().launch("concat_many", top[0].count, addresses, gpu_table(self, "starts", starts, np.int32),
                                top[0].shape[axis], top[0].count_range(axis + 1), forward, top_array)


@register("Slice")
class SliceLayer(Layer):
    exact_num_bottom = 1
    min_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.slice_param
        self.check(not (p.HasField("axis") and p.HasField("slice_dim")),
                   "Either axis or slice_dim should be specified; not both.")
        self.slice_points = list(p.slice_point)

    def reshape(self, bottom, top):
        # slice_layer.cpp Reshape
        p = self.param.slice_param
        shape = list(bottom[0].shape)
        if p.HasField("slice_dim"):
            axis = p.slice_dim
            self.check(axis < len(shape), "slice_dim out of range (%d for a %d-axis input)" % (axis, len(shape)))
        else:
            axis = checked_axis(self, p.axis, len(shape), "slice axis")
        self.axis = axis
        dim = shape[axis]
        if self.slice_points:
            self.check(len(self.slice_points) == len(top) - 1,
                       "slice_point must be given once per top but the last (%d tops, %d slice points)"
                       % (len(top), len(self.slice_points)))
            self.check(len(top) <= dim, "more tops (%d) than the slice axis %d has entries (bottom %s)"
                       % (len(top), axis, bottom[0].shape))
            sizes, prev = [], 0
            for point in self.slice_points:
                self.check(point > prev, "slice points must be strictly increasing and positive, got %s"
                           % self.slice_points)
                sizes.append(point - prev)
                prev = point
            # Caffe lets Blob::Reshape (a negative dim) catch a point past the end; say it plainly. A last point
            # at the end is accepted there, and gives an empty last top.
            self.check(prev <= dim, "slice point %d is past the end of slice axis %d (size %d)" % (prev, axis, dim))
            sizes.append(dim - prev)
        else:
            self.check(dim % len(top) == 0, "Number of top blobs (%d) should evenly divide input slice axis (%d)"
                       % (len(top), dim))
            sizes = [dim // len(top)] * len(top)
        self.starts = [0]
        for t, size in zip(top, sizes):
            shape[axis] = size
            t.reshape(shape)
            self.starts.append(self.starts[-1] + size)

    def _windows(self):
        return [_axis_slices(self.axis, a, b) for a, b in zip(self.starts, self.starts[1:])]

    def forward(self, bottom, top):
        if len(top) == 1:
            _share(self, top, bottom[0])     # slice_layer.cpp: one top is shared, not copied
            return
        data = bottom[0].data
        for t, window in zip(top, self._windows()):
            t.data[...] = data[window]

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0] or len(top) == 1:
            return
        diff = bottom[0].diff     # the tops cover the bottom: every element is written
        for t, window in zip(top, self._windows()):
            diff[window] = t.diff

    def forward_gpu(self, bottom, top):
        if len(top) == 1:
            _share_gpu(self, top, bottom[0])
            return
        dev = select.current()
        x, axis = bottom[0].gpu_data, self.axis
        outer, inner = bottom[0].count_range(0, axis), bottom[0].count_range(axis + 1)
        for t, start in zip(top, self.starts):
            _copy_axis_block(dev, x, bottom[0].shape[axis], start, t.mutable_gpu_data, t.shape[axis], 0, outer,
                             t.shape[axis], inner)

    def backward_gpu(self, top, propagate_down, bottom):
        if not propagate_down[0] or len(top) == 1:
            return
        dev = select.current()
        diff, axis = bottom[0].mutable_gpu_diff, self.axis
        outer, inner = bottom[0].count_range(0, axis), bottom[0].count_range(axis + 1)
        for t, start in zip(top, self.starts):
            _copy_axis_block(dev, t.gpu_diff, t.shape[axis], 0, diff, bottom[0].shape[axis], start, outer,
                             t.shape[axis], inner)


@register("Flatten")
class FlattenLayer(Layer):
    """Collapses axes [axis, end_axis] into one (flatten_layer.cpp)."""
    reshape_from_shapes = True
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        _no_in_place(self, bottom, top)

    def reshape(self, bottom, top):
        p = self.param.flatten_param
        shape = bottom[0].shape
        start = checked_axis(self, p.axis, len(shape), "flatten axis")
        end = checked_axis(self, p.end_axis, len(shape), "flatten end_axis")
        # Blob::count(start, end + 1) needs start <= end + 1; end_axis = axis - 1 inserts an axis of size 1.
        self.check(start <= end + 1, "flatten end_axis (%d) must not come before axis - 1 (%d)" % (end, start - 1))
        top[0].reshape(shape[:start] + (count(shape, start, end + 1),) + shape[end + 1:])

    def forward(self, bottom, top):
        _share(self, top, bottom[0])

    def backward(self, top, propagate_down, bottom):
        pass     # the top's diff is the bottom's diff

    def forward_gpu(self, bottom, top):
        _share_gpu(self, top, bottom[0])    # the device copy is shared too: no copy, no kernel

    backward_gpu = backward


@register("Reshape")
class ReshapeLayer(Layer):
    """reshape_param.shape replaces axes [axis, axis + num_axes) of the bottom; 0 copies the bottom's dimension,
    -1 is inferred from the count (reshape_layer.cpp)."""
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        _no_in_place(self, bottom, top)
        dims = list(self.param.reshape_param.shape.dim)
        self.copy_axes = [i for i, d in enumerate(dims) if d == 0]
        inferred = [i for i, d in enumerate(dims) if d == -1]
        self.check(len(inferred) <= 1, "new shape contains multiple -1 dims; at most a single (1) value of -1 may "
                   "be specified (only one dimension can be inferred)")
        self.inferred_axis = inferred[0] if inferred else None
        self.check(all(d >= -1 for d in dims), "new shape %s has a negative dimension other than -1" % dims)
        self.constant_count = count([d for d in dims if d > 0])

    def reshape(self, bottom, top):
        p = self.param.reshape_param
        bshape = bottom[0].shape
        n = len(bshape)
        start = p.axis if p.axis >= 0 else n + p.axis + 1
        self.check(0 <= start <= n, "axis %d out of range for %d-D input blob" % (p.axis, n))
        self.check(p.num_axes >= -1, "num_axes must be >= 0, or -1 for all")
        end = n if p.num_axes == -1 else start + p.num_axes
        self.check(end <= n, "end_axis = axis + num_axes is out of range (%d + %d > %d axes)"
                   % (start, p.num_axes, n))
        dims = list(p.shape.dim)
        shape = list(bshape[:start]) + dims + list(bshape[end:])
        for i in self.copy_axes:
            self.check(start + i < n, "new shape contains a 0, but there was no corresponding bottom axis to copy")
            shape[start + i] = bshape[start + i]
        if self.inferred_axis is not None:
            explicit = self.constant_count * count(bshape, 0, start) * count(bshape, end)
            for i in self.copy_axes:
                explicit *= shape[start + i]
            total = count(bshape)
            self.check(explicit != 0 and total % explicit == 0,
                       "bottom count (%d) must be divisible by the product of the specified dimensions (%d)"
                       % (total, explicit))
            shape[start + self.inferred_axis] = total // explicit
        self.check(count(shape) == count(bshape), "output count must match input count (bottom %s, top %s)"
                   % (bshape, tuple(shape)))
        top[0].reshape(shape)

    def forward(self, bottom, top):
        _share(self, top, bottom[0])

    def backward(self, top, propagate_down, bottom):
        pass     # the top's diff is the bottom's diff

    def forward_gpu(self, bottom, top):
        _share_gpu(self, top, bottom[0])    # the device copy is shared too: no copy, no kernel

    backward_gpu = backward


@register("Crop")
class CropLayer(Layer):
    """Crops bottom 0 to the shape of bottom 1 from crop_param.axis on, at crop_param.offset (crop_layer.cpp)."""
    exact_num_bottom = 2
    exact_num_top = 1

    def reshape(self, bottom, top):
        p = self.param.crop_param
        shape = list(bottom[0].shape)
        n = len(shape)
        start = checked_axis(self, p.axis, n, "crop axis")
        offsets = list(p.offset)
        if len(offsets) > 1:
            self.check(start + len(offsets) == n, "number of crop values specified must be equal to the number of "
                       "dimensions following axis (axis %d, %d offsets, %d axes)" % (start, len(offsets), n))
        self.check(len(bottom[1].shape) >= n, "the reference bottom %s has fewer axes than the cropped bottom %s"
                   % (bottom[1].shape, bottom[0].shape))
        self.offsets = [0] * n
        for i in range(start, n):
            offset = offsets[0] if len(offsets) == 1 else (offsets[i - start] if offsets else 0)
            size = bottom[1].shape[i]
            self.check(shape[i] - offset >= size, "the crop for dimension %d is out-of-bounds with size %d and "
                       "offset %d (input size %d)" % (i, size, offset, shape[i]))
            shape[i] = size
            self.offsets[i] = offset
        top[0].reshape(shape)
        self.window = tuple(slice(o, o + d) for o, d in zip(self.offsets, shape))

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data[self.window]

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:      # bottom 1 only gives the shape: Caffe leaves its diff alone
            diff = bottom[0].diff
            diff[...] = 0
            diff[self.window] = top[0].diff

    def _gpu_dims(self, bottom, top):
        """crop_forward's index table on the device: the top's shape, the bottom's strides, the offsets (int32),
        uploaded again only when they change (crop_layer.cu keeps them in blobs made at Reshape)."""
        dev = select.current()
        shape = bottom[0].shape
        table = tuple(top[0].shape) + tuple(count(shape, i + 1) for i in range(len(shape))) + tuple(self.offsets)
        held = self.__dict__.get("_gpu_dims_held")
        if held is None or held[0] is not dev or held[1] != table:
            held = self._gpu_dims_held = (dev, table, dev.to_device(np.array(table or (0,), np.int32)))
        return len(shape), held[2]

    def forward_gpu(self, bottom, top):
        num_axes, dims = self._gpu_dims(bottom, top)
        select.current().launch("crop_forward", top[0].count, num_axes, dims, bottom[0].gpu_data,
                                top[0].mutable_gpu_data)

    def backward_gpu(self, top, propagate_down, bottom):
        if propagate_down[0]:
            dev = select.current()
            num_axes, dims = self._gpu_dims(bottom, top)
            diff = bottom[0].mutable_gpu_diff
            dev.memset(diff, 0)
            dev.launch("crop_backward", top[0].count, num_axes, dims, top[0].gpu_diff, diff)


@register("Tile")
class TileLayer(Layer):
    exact_num_bottom = 1
    exact_num_top = 1

    def reshape(self, bottom, top):
        p = self.param.tile_param
        axis = checked_axis(self, p.axis, len(bottom[0].shape), "tile axis")
        self.check(p.HasField("tiles"), "Number of tiles must be specified")
        self.check(p.tiles > 0, "Number of tiles must be positive.")
        shape = list(bottom[0].shape)
        shape[axis] *= p.tiles
        top[0].reshape(shape)
        # tile_layer.cpp: the block of axes [axis, end) is repeated `tiles` times, outer_dim times over
        self.dims = (bottom[0].count_range(0, axis), p.tiles, bottom[0].count_range(axis))

    def forward(self, bottom, top):
        outer, _, inner = self.dims
        top[0].data.reshape(self.dims)[...] = bottom[0].data.reshape(outer, 1, inner)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            outer, _, inner = self.dims
            np.sum(top[0].diff.reshape(self.dims), axis=1, out=bottom[0].diff.reshape(outer, inner))

    def forward_gpu(self, bottom, top):
        _, tiles, inner = self.dims
        select.current().launch("tile_forward", top[0].count, inner, tiles, bottom[0].gpu_data,
                                top[0].mutable_gpu_data)

    def backward_gpu(self, top, propagate_down, bottom):
        if propagate_down[0]:
            _, tiles, inner = self.dims
            select.current().launch("tile_backward", bottom[0].count, inner, tiles, top[0].gpu_diff,
                                    bottom[0].mutable_gpu_diff)


@register("Silence")
class SilenceLayer(Layer):
    """Swallows its bottoms (no tops); backward sets their diffs to zero."""
    min_bottom = 1
    exact_num_top = 0

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        pass

    def backward(self, top, propagate_down, bottom):
        for b, down in zip(bottom, propagate_down):
            if down:
                b.diff[...] = 0

    forward_gpu = forward

    def backward_gpu(self, top, propagate_down, bottom):
        dev = select.current()
        for b, down in zip(bottom, propagate_down):
            if down:
                dev.memset(b.mutable_gpu_diff, 0)      # silence_layer.cu: caffe_gpu_set(0)


@register("BatchReindex")
class BatchReindexLayer(Layer):
    """top[i] = bottom0[index[i]] along the first axis (batch_reindex_layer.cpp)."""
    exact_num_bottom = 2
    exact_num_top = 1

    def reshape(self, bottom, top):
        self.check(len(bottom[1].shape) == 1, "the index bottom must have 1 axis, got %s" % (bottom[1].shape,))
        self.check(len(bottom[0].shape) >= 1, "the data bottom needs at least one axis")
        top[0].reshape(bottom[1].shape[:1] + bottom[0].shape[1:])

    def _index(self, bottom):
        # cpu_data: reading the index on the GPU path leaves its device copy current (Caffe checks it on the host
        # there too)
        index = bottom[1].cpu_data
        self.check(np.all(index >= 0), "Index specified for reindex layer was negative.")
        self.check(np.all(index < bottom[0].shape[0]), "Index specified for reindex layer was greater than batch "
                   "size (%d)." % bottom[0].shape[0])
        return index.astype(np.intp)       # truncates, as Caffe's static_cast<int>

    def forward(self, bottom, top):
        np.take(bottom[0].data, self._index(bottom), axis=0, out=top[0].data)

    def backward(self, top, propagate_down, bottom):
        self.check(not propagate_down[1], "Cannot backprop to index.")
        if propagate_down[0]:
            diff = bottom[0].diff
            diff[...] = 0
            np.add.at(diff, self._index(bottom), top[0].diff)    # rows picked several times accumulate

    def forward_gpu(self, bottom, top):
        # batch_reindex_layer.cu: the index checked on the host, then one thread per top value gathers
        self._index(bottom)
        inner = bottom[0].count_range(1)
        select.current().launch("batch_reindex_forward", top[0].count, inner, bottom[0].gpu_data, bottom[1].gpu_data,
                                top[0].mutable_gpu_data)

    def backward_gpu(self, top, propagate_down, bottom):
        self.check(not propagate_down[1], "Cannot backprop to index.")
        if not propagate_down[0]:
            return
        # batch_reindex_layer.cu's Backward_gpu: for each bottom item, the list of top items that picked it
        # (top_indexes[begins[b]:begins[b] + counts[b]]), so that one thread per bottom value sums its own list.
        # A stable sort keeps each list in ascending order: the sum in the order of the CPU code's np.add.at.
        index = self._index(bottom)
        num = bottom[0].shape[0]
        top_indexes = np.argsort(index, kind="stable")
        counts = np.bincount(index, minlength=num)
        begins = np.cumsum(counts) - counts
        table = np.concatenate([top_indexes, begins, counts]).astype(np.int32)
        dev = select.current()
        lists = self.buffer("index_lists", table.size, dtype=np.int32, device=True, at_least=True)
        if table.size:
            dev.upload(lists.at(0, table.size), table)
        m = len(index)
        dev.launch("batch_reindex_backward", bottom[0].count, bottom[0].count_range(1), top[0].gpu_diff,
                   lists.at(0, m), lists.at(m, num), lists.at(m + num, num), bottom[0].mutable_gpu_diff)

    def allow_force_backward(self, bottom_index):
        # Caffe's Backward CHECKs "Cannot backprop to index." (it does not override AllowForceBackward, so a
        # force_backward net would abort there); we leave the index out instead.
        return bottom_index != 1


@register("Filter")
class FilterLayer(Layer):
    """Forwards the items (first axis) of bottoms 0..K-1 whose selector (the last bottom) is non-zero
    (filter_layer.cpp). The first reshape keeps the full batch; later ones read the selector's data."""
    min_bottom = 2
    min_top = 1

    def layer_setup(self, bottom, top):
        self.check(len(top) == len(bottom) - 1, "Top.size() should be equal to bottom.size() - 1")
        self.first_reshape = True

    def reshape(self, bottom, top):
        selector = bottom[-1]
        self.check(len(selector.shape) >= 1, "the selector bottom needs at least one axis")
        for d in selector.shape[1:]:
            self.check(d == 1, "Selector blob dimensions must be singletons (1), except the first (got %s)"
                       % (selector.shape,))
        for b in bottom[:-1]:
            self.check(len(b.shape) >= 1 and b.shape[0] == selector.shape[0],
                       "Each bottom should have the same 0th dimension as the selector blob (%s vs %s)"
                       % (b.shape, selector.shape))
        # cpu_data: on the GPU path the selector's device copy stays current
        self.indices = np.flatnonzero(selector.cpu_data.reshape(-1))
        num = len(self.indices)
        if self.first_reshape:
            num = bottom[0].shape[0]
            self.first_reshape = False
        for b, t in zip(bottom, top):
            t.reshape((num,) + b.shape[1:])

    def forward(self, bottom, top):
        n = len(self.indices)
        for b, t in zip(bottom, top):
            t.data[:n] = b.data[self.indices]

    def backward(self, top, propagate_down, bottom):
        self.check(not propagate_down[-1], "cannot backpropagate to filter index inputs")
        for i, t in enumerate(top):
            if not propagate_down[i]:
                continue
            # Caffe's Backward divides by the top's item count and dies when no item was selected.
            self.check(t.shape[0] > 0, "no item passed the selector: Filter cannot backpropagate an empty top")
            diff = bottom[i].diff
            diff[...] = 0
            diff[self.indices] = t.diff

    def _gpu_rows(self, num):
        """The selected items (a device int array), then for each of the `num` bottom items its row in the tops or
        -1: uploaded once per selection, for forward_gpu's gather and backward_gpu's scatter."""
        n = len(self.indices)
        rows = self.buffer("rows", n + num, dtype=np.int32, device=True, at_least=True)
        uploaded = self.__dict__.get("_uploaded_rows")     # (the selection, the array it went to)
        if uploaded is None or uploaded[0] is not self.indices or uploaded[1] is not rows:
            top_rows = np.full(num, -1, np.int32)
            top_rows[self.indices] = np.arange(n, dtype=np.int32)
            if n + num:
                select.current().upload(rows.at(0, n + num), np.concatenate([self.indices.astype(np.int32),
                                                                             top_rows]))
            self._uploaded_rows = (self.indices, rows)
        return rows.at(0, n), rows.at(n, num)

    def forward_gpu(self, bottom, top):
        # filter_layer.cu copies each selected item with a caffe_copy; one gather launch per top does them all
        dev = select.current()
        selected, _ = self._gpu_rows(bottom[-1].shape[0])
        for b, t in zip(bottom, top):
            inner = b.count_range(1)
            dev.launch("filter_forward", len(self.indices) * inner, inner, b.gpu_data, selected, t.mutable_gpu_data)

    def backward_gpu(self, top, propagate_down, bottom):
        self.check(not propagate_down[-1], "cannot backpropagate to filter index inputs")
        dev = select.current()
        for i, t in enumerate(top):
            if not propagate_down[i]:
                continue
            self.check(t.shape[0] > 0, "no item passed the selector: Filter cannot backpropagate an empty top")
            _, top_rows = self._gpu_rows(bottom[i].shape[0])
            b = bottom[i]
            dev.launch("filter_backward", b.count, b.count_range(1), t.gpu_diff, top_rows, b.mutable_gpu_diff)

    def allow_force_backward(self, bottom_index):
        # Caffe's Backward refuses the selector (the last bottom): "cannot backpropagate to filter index inputs".
        return bottom_index != len(self.param.bottom) - 1


@register("Parameter")
class ParameterLayer(Layer):
    """Exposes one learnable blob of parameter_param.shape as its top (parameter_layer.hpp; no filler: zeros)."""
    exact_num_bottom = 0
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        if not self.blobs:
            self.blobs = [self.make_param(tuple(self.param.parameter_param.shape.dim))]

    def reshape(self, bottom, top):
        top[0].reshape(tuple(self.param.parameter_param.shape.dim))

    def forward(self, bottom, top):
        # parameter_layer.hpp: the top shares the blob's data and diff, so the consumer's backward writes the
        # parameter's gradient itself.
        top[0].share_reshaped(self.blobs[0])

    def backward(self, top, propagate_down, bottom):
        pass
