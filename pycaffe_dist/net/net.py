"""Net: the layer graph built once from a NetParameter and a NetState, then only run (Caffe's src/caffe/net.cpp).

Init order, as Caffe's: filter layers by the state's rules, insert Split layers, then for each layer connect
bottoms (consuming them from the set of available blobs), create or reuse tops (same name as the bottom at that
index = in place), set the layer up, register its parameters (sharing by ParamSpec.name), and work out which
layers and blobs need a backward pass. What is still available at the end is the net's output.
"""
import logging

import numpy as np

from ..backend import select
from ..blob.blob import Blob
from ..errors import NetError
from ..layers import create_layer
from ..proto import caffe_pb2
from . import debug_info as debug_log
from . import gpu_fusion
from .gradient_arena import GradientArena
from .splits import insert_splits
from .state import filter_net, make_state

log = logging.getLogger("pycaffe_dist")


class Net:
    """Net(param, phase, level, stages) or Net(param, state=NetState). fill_params=False leaves parameters
    unfilled (and unallocated) until used: for shape-only work. pycaffe's Net (pycaffe.py) is a subclass that
    adds pycaffe's interface."""
    def __init__(self, param, phase=caffe_pb2.TEST, level=0, stages=(), state=None, fill_params=True):
        if len(param.layers):
            raise NetError("net '%s' still has V1 'layers': upgrade it first (pycaffe_dist.io.upgrade)" % param.name)
        if state is None:
            state = make_state(phase, level, stages)
            # Caffe merges the net's own state under the one asked for (phase/level/stages given win).
            if param.HasField("state"):
                merged = caffe_pb2.NetState()
                merged.CopyFrom(param.state)
                merged.MergeFrom(state)
                merged.phase, merged.level = phase, level
                state = merged
        self.state = state
        self.phase = state.phase
        self.name = param.name
        self.debug_info = param.debug_info   # log what each layer wrote (net/debug_info.py)
        self.param = insert_splits(filter_net(param, state))
        self.layers, self.layer_names = [], []
        self.blob_list, self.blob_names = [], []       # all blobs, in order of creation
        self.bottom_ids, self.top_ids = [], []         # per layer, indices into self.blob_list
        self.bottom_need_backward, self.layer_need_backward = [], []
        self.input_ids, self.output_ids = [], []
        self.param_blobs = []                          # every param blob of every layer, shared ones repeated
        self.param_owner = []                          # -1, or the index in self.params that owns it
        self.param_layer_index = []                    # (layer id, blob index) of each entry in self.params
        self.param_display_names = []
        self.learnable_params, self.learnable_param_ids = [], []
        self.params_lr, self.params_weight_decay = [], []
        self._has_lr, self._has_decay = [], []
        self._blob_index = {}
        self._build()
        self._reshaped = [None] * len(self.layers)       # per layer: the shapes around its last reshape
        if fill_params:
            # Run the fillers now, in layer order as Caffe does, so that a seeded net is reproducible.
            for layer in self.layers:
                for blob in layer.blobs:
                    blob.data

    @classmethod
    def from_state(cls, param, state):
        """A net of this class built for a full NetState (phase, level, stages), as the Solver builds its nets;
        it bypasses a subclass's own constructor (pycaffe's takes file names)."""
        net = cls.__new__(cls)
        Net.__init__(net, param, state=state)
        return net

    # --- construction -------------------------------------------------------------------------------------

    def _build(self):
        blob_need_backward = []
        available = set()
        param_names = {}
        for layer_id, lp in enumerate(self.param.layer):
            if not lp.HasField("phase"):
                lp.phase = self.phase
            if len(lp.propagate_down) and len(lp.propagate_down) != len(lp.bottom):
                raise NetError("layer '%s': propagate_down must be given once per bottom (%d bottoms, %d values)"
                               % (lp.name, len(lp.bottom), len(lp.propagate_down)))
            layer = create_layer(lp, lp.phase)
            self.layers.append(layer)
            self.layer_names.append(lp.name)
            need_backward = False
            bottoms, bottom_need = [], []
            for j, name in enumerate(lp.bottom):
                if name not in available:
                    raise NetError("layer '%s': unknown bottom blob '%s' (bottom index %d)" % (lp.name, name, j))
                blob_id = self._blob_index[name]
                available.discard(name)
                need = bool(lp.propagate_down[j]) if len(lp.propagate_down) else blob_need_backward[blob_id]
                bottoms.append(blob_id)
                bottom_need.append(need)
                need_backward |= blob_need_backward[blob_id]
            tops = []
            for j, name in enumerate(lp.top):
                if j < len(lp.bottom) and name == lp.bottom[j]:
                    tops.append(self._blob_index[name])          # in place: the bottom blob itself
                elif name in self._blob_index:
                    raise NetError("layer '%s': top blob '%s' produced by multiple sources" % (lp.name, name))
                else:
                    tops.append(self._new_blob(name))
                    blob_need_backward.append(False)
                    if lp.type == "Input":
                        self.input_ids.append(tops[-1])
                available.add(name)
            if layer.auto_top_blobs:
                wanted = max(layer.min_top or 0, layer.exact_num_top or 0)
                while len(tops) < wanted:
                    tops.append(self._new_blob(None))            # anonymous: never an input of another layer
                    blob_need_backward.append(False)
            self.bottom_ids.append(bottoms)
            self.top_ids.append(tops)
            self.bottom_need_backward.append(bottom_need)
            layer.setup([self.blob_list[i] for i in bottoms], [self.blob_list[i] for i in tops])
            if len(lp.param) > len(layer.blobs):
                raise NetError("layer '%s': too many params specified (%d param specs, the layer has %d blobs)"
                               % (lp.name, len(lp.param), len(layer.blobs)))
            for param_id in range(len(layer.blobs)):
                spec = lp.param[param_id] if param_id < len(lp.param) else caffe_pb2.ParamSpec()
                learns = spec.lr_mult != 0
                need_backward |= learns
                layer.param_propagate_down[param_id] = learns
            for param_id in range(len(layer.blobs)):
                self._append_param(layer_id, param_id, param_names)
            self.layer_need_backward.append(need_backward)
            if need_backward:
                for i in tops:
                    blob_need_backward[i] = True
        self._prune_backward(force=self.param.force_backward)
        self.fusions = gpu_fusion.find(self)      # {first layer id: the layers from it the GPU may run as one}
        self._fusion_members = {i: f for f in self.fusions.values() for i in f.members()}
        self._gradient_arena = None     # the learnable params' device diffs in one array, made at the first clear
        # f(layer_id) once the backward is past a layer (from the last layer down to 0): an all-reduce starts on the
        # gradients that are final while the backward goes on (distributed/allreduce/buckets.py)
        self.backward_hooks = []
        self._last_writer = {}      # {blob id: the last layer with it as a top}
        for layer_id, tops in enumerate(self.top_ids):
            for blob_id in tops:
                self._last_writer[blob_id] = layer_id
        # net.cpp lists the outputs from a std::set<string>: in byte-wise order of their names
        outputs = sorted({n for n in self.blob_names if n in available}, key=lambda n: n.encode())
        self.output_ids = [self._blob_index[n] for n in outputs]
        self.share_weights()

    def _new_blob(self, name):
        self.blob_list.append(Blob())
        self.blob_names.append(name if name is not None else "(automatic)")
        if name is not None:
            self._blob_index[name] = len(self.blob_list) - 1
        return len(self.blob_list) - 1

    def _append_param(self, layer_id, param_id, param_names):
        """Caffe's Net::AppendParam: the first layer to use a name owns the blob; later users share it.

        Like Caffe it reads the layer's own LayerParameter, which the layer may have edited at setup (BatchNorm
        adds lr_mult 0 specs so its statistics are not learned), while _build's need-backward pass reads the net's.
        """
        layer = self.layers[layer_id]
        lp = layer.param
        has_spec = param_id < len(lp.param)
        spec = lp.param[param_id] if has_spec else caffe_pb2.ParamSpec()
        name = spec.name if has_spec else ""
        net_param_id = len(self.param_blobs)
        self.param_blobs.append(layer.blobs[param_id])
        self.param_layer_index.append((layer_id, param_id))
        self.param_display_names.append(name or str(param_id))
        if not name or name not in param_names:
            self.param_owner.append(-1)
            if name:
                param_names[name] = net_param_id
            self.learnable_param_ids.append(len(self.learnable_params))
            self.learnable_params.append(layer.blobs[param_id])
            self._has_lr.append(spec.HasField("lr_mult"))
            self._has_decay.append(spec.HasField("decay_mult"))
            self.params_lr.append(spec.lr_mult)
            self.params_weight_decay.append(spec.decay_mult)
            return
        owner_id = param_names[name]
        self.param_owner.append(owner_id)
        owner_layer, owner_param = self.param_layer_index[owner_id]
        mine, theirs = layer.blobs[param_id], self.layers[owner_layer].blobs[owner_param]
        owner_name = self.layer_names[owner_layer]
        if spec.share_mode == caffe_pb2.ParamSpec.PERMISSIVE:
            if mine.count != theirs.count:
                raise NetError("cannot share param '%s' owned by layer '%s' with layer '%s'; count mismatch. "
                               "Owner layer param shape is %s; sharing layer shape is %s"
                               % (name, owner_name, lp.name, theirs.shape, mine.shape))
        elif mine.shape != theirs.shape:
            raise NetError("cannot share param '%s' owned by layer '%s' with layer '%s'; shape mismatch. "
                           "Owner layer param shape is %s; sharing layer expects shape %s"
                           % (name, owner_name, lp.name, theirs.shape, mine.shape))
        learnable_id = self.learnable_param_ids[owner_id]
        self.learnable_param_ids.append(learnable_id)
        for has, values, field in ((self._has_lr, self.params_lr, "lr_mult"),
                                   (self._has_decay, self.params_weight_decay, "decay_mult")):
            if spec.HasField(field):
                if has[learnable_id]:
                    if getattr(spec, field) != values[learnable_id]:
                        raise NetError("shared param '%s' has mismatched %s (layer '%s')" % (name, field, lp.name))
                else:
                    has[learnable_id] = True
                    values[learnable_id] = getattr(spec, field)

    def share_weights(self):
        """Caffe's Net::ShareWeights (ShareData + ShareDiff of every shared parameter): a sharer of the owner's
        shape uses the owner's Blob object itself; one of another shape (PERMISSIVE, same count) keeps its own
        shape over the owner's memory. Run again after someone replaced a layer's blobs (the recurrent layers)."""
        for i, owner in enumerate(self.param_owner):
            if owner >= 0:
                layer_id, param_id = self.param_layer_index[i]
                owner_layer, owner_param = self.param_layer_index[owner]
                mine, theirs = self.layers[layer_id].blobs[param_id], self.layers[owner_layer].blobs[owner_param]
                if mine.shape == theirs.shape:
                    self.layers[layer_id].blobs[param_id] = theirs
                else:
                    mine.share_reshaped(theirs)
        self._refresh_param_lists()

    def _refresh_param_lists(self):
        """Derive param_blobs and learnable_params (the owners, in order) from the layers' blobs."""
        self.param_blobs = [self.layers[l].blobs[p] for l, p in self.param_layer_index]
        self.learnable_params = [b for b, owner in zip(self.param_blobs, self.param_owner) if owner < 0]

    def _prune_backward(self, force):
        """Caffe's second pass: only layers that lead to a loss run backward; force_backward turns all on."""
        under_loss, skip_backprop = set(), set()
        for layer_id in reversed(range(len(self.layers))):
            layer, lp = self.layers[layer_id], self.param.layer[layer_id]
            contributes, skip = False, True
            for k, top_id in enumerate(self.top_ids[layer_id]):
                name = self.blob_names[top_id]
                if layer.loss_weights[k] or name in under_loss:
                    contributes = True
                if name not in skip_backprop:
                    skip = False
                if contributes and not skip:
                    break
            if self.layer_need_backward[layer_id] and skip:
                self.layer_need_backward[layer_id] = False
                self.bottom_need_backward[layer_id] = [False] * len(lp.bottom)
            if not contributes:
                self.layer_need_backward[layer_id] = False
            for j, blob_id in enumerate(self.bottom_ids[layer_id]):
                if contributes:
                    under_loss.add(self.blob_names[blob_id])
                else:
                    self.bottom_need_backward[layer_id][j] = False
                if not self.bottom_need_backward[layer_id][j]:
                    skip_backprop.add(self.blob_names[blob_id])
        if force:
            for layer_id, layer in enumerate(self.layers):
                self.layer_need_backward[layer_id] = True
                for j in range(len(self.bottom_ids[layer_id])):
                    self.bottom_need_backward[layer_id][j] |= layer.allow_force_backward(j)
                layer.param_propagate_down = [True] * len(layer.blobs)

    # --- running ------------------------------------------------------------------------------------------

    def _vecs(self, layer_id):
        return ([self.blob_list[i] for i in self.bottom_ids[layer_id]],
                [self.blob_list[i] for i in self.top_ids[layer_id]])

    def _reshape_layer(self, layer_id, layer, bottom, top):
        """Caffe's Layer::Forward reshapes first: inputs may change shape. A layer whose reshape depends on shapes
        alone (Layer.reshape_from_shapes) is skipped while its bottoms and tops keep the shapes its last reshape
        left: those reshapes cost 10-25 us of Python each, 1 % of a LeNet iteration."""
        if layer.reshape_from_shapes:
            shapes = [b.shape for b in bottom] + [t.shape for t in top]
            if shapes == self._reshaped[layer_id]:
                return
        layer.reshape(bottom, top)
        if layer.reshape_from_shapes:
            self._reshaped[layer_id] = [b.shape for b in bottom] + [t.shape for t in top]

    @property
    def inputs(self):
        return [self.blob_names[i] for i in self.input_ids]

    @property
    def outputs(self):
        return [self.blob_names[i] for i in self.output_ids]

    def blob_by_name(self, name):
        try:
            return self.blob_list[self._blob_index[name]]
        except KeyError:
            raise NetError("net '%s' has no blob named '%s'" % (self.name, name)) from None

    def layer_index(self, name):
        try:
            return self.layer_names.index(name)
        except ValueError:
            raise NetError("net '%s' has no layer named '%s'" % (self.name, name)) from None

    def reshape(self):
        for layer_id, layer in enumerate(self.layers):
            layer.reshape(*self._vecs(layer_id))

    def forward_from_to(self, start=0, end=None, gpu=None):
        """Run layers start..end (inclusive) and return the sum of their weighted losses. gpu: run the layers'
        GPU code (default: whether GPU mode is on); a recurrent layer's unrolled net runs on the path of its layer."""
        return self._forward(start, end, gpu).value()

    def _forward(self, start=0, end=None, gpu=None):
        """forward_from_to, its losses read when asked for (WeightedLosses.value)."""
        end = len(self.layers) - 1 if end is None else end
        gpu = select.active() if gpu is None else gpu
        losses = WeightedLosses()
        layer_id = start
        while layer_id <= end:
            layer = self.layers[layer_id]
            bottom, top = self._vecs(layer_id)
            self._reshape_layer(layer_id, layer, bottom, top)
            fused = self._fused_forward(layer_id, end) if gpu else 0
            if fused:
                for done in range(layer_id, layer_id + fused):
                    self._after_forward(done, losses, gpu)
                layer_id += fused
                continue
            if layer_id in self._fusion_members:        # run alone: its run's next backward is not fused
                self._fusion_members[layer_id].forward_fused = None
            # A layer without GPU code runs its CPU code on the host copies, as Caffe's Forward_gpu falls back.
            if gpu and layer.forward_gpu is not None:
                layer.forward_gpu(bottom, top)
                if layer.defers_checks:
                    losses.checks.append(layer)
            else:
                layer.forward(bottom, top)
            self._after_forward(layer_id, losses, gpu)
            layer_id += 1
        return losses

    def _fused_forward(self, layer_id, end):
        """Run layer_id and the next ones as one on the GPU (net/gpu_fusion.py) where they may be fused and are in
        the range; how many layers that ran (0: none, the layer runs alone)."""
        fusion = self.fusions.get(layer_id)
        if fusion is None:
            return 0
        fusion.forward_fused = None
        layers = fusion.layers_in(end)
        if not layers or self.debug_info:
            return 0
        for next_id in range(layer_id + 1, layer_id + layers):
            self._reshape_layer(next_id, self.layers[next_id], *self._vecs(next_id))
        if not (fusion.holds_elements() and fusion.fits()):
            return 0
        fusion.forward(*self._vecs(layer_id), layers)
        return layers

    def _after_forward(self, layer_id, losses, gpu):
        """A layer's forward is done: its debug line, and its weighted losses added to `losses`: on the GPU read
        later where no later layer writes the top (so the host does not wait for the GPU here)."""
        if self.debug_info:
            debug_log.forward(self, layer_id)
        layer = self.layers[layer_id]
        for w, blob_id in zip(layer.loss_weights, self.top_ids[layer_id]):
            if w:
                blob = self.blob_list[blob_id]
                if gpu and self._last_writer[blob_id] == layer_id:
                    losses.terms.append(blob)
                else:
                    losses.terms.append(weighted_loss(blob))

    def backward_from_to(self, start=None, end=0, gpu=None):
        start = len(self.layers) - 1 if start is None else start
        gpu = select.active() if gpu is None else gpu
        layer_id = start
        while layer_id >= end:
            fused = self._fused_backward(layer_id, end) if gpu else 0
            if fused:
                for hook in self.backward_hooks:
                    for done in range(layer_id, layer_id - fused, -1):
                        hook(done)
                layer_id -= fused
                continue
            if self.layer_need_backward[layer_id]:
                bottom, top = self._vecs(layer_id)
                layer = self.layers[layer_id]
                if gpu and layer.backward_gpu is not None:
                    layer.backward_gpu(top, self.bottom_need_backward[layer_id], bottom)
                else:
                    layer.backward(top, self.bottom_need_backward[layer_id], bottom)
                if self.debug_info:
                    debug_log.backward(self, layer_id)
            for hook in self.backward_hooks:
                hook(layer_id)
            layer_id -= 1

    def _fused_backward(self, layer_id, end):
        """The backward of the fused layers that end at layer_id, as their last forward ran them
        (net/gpu_fusion.py), where the range holds them all; how many layers that was (0: none)."""
        fusion = self._fusion_members.get(layer_id)
        if fusion is None or not fusion.fuses_backward or not fusion.forward_fused or \
                fusion.first + fusion.forward_fused - 1 != layer_id or fusion.first < end or \
                not fusion.needs_backward():
            return 0
        fusion.backward(*self._vecs(fusion.first))
        return fusion.forward_fused

    def forward_backward(self):
        """Caffe's ForwardBackward: its Backward, unlike BackwardFromTo, ends with the norms of all params. The
        loss is read after the backward is queued: on the GPU the host waits for it only at the end."""
        losses = self._forward()
        self.backward_from_to()
        if self.debug_info:
            debug_log.param_norms(self)
        return losses.value()

    def set_input_arrays(self, data, labels):
        """Hand arrays to the net's first layer, which must be MemoryData (pycaffe's Net.set_input_arrays)."""
        if not self.layers or self.layers[0].param.type != "MemoryData":
            raise NetError("set_input_arrays needs a MemoryData layer as the net's first layer")
        self.layers[0].reset(data, labels)

    def clear_param_diffs(self):
        if select.active():
            # one memset of the arena that holds every diff on the device (net/gradient_arena.py)
            if self._gradient_arena is None or not self._gradient_arena.holds(self.learnable_params):
                self._gradient_arena = GradientArena(self.learnable_params)
            self._gradient_arena.clear()
            return
        for blob in self.learnable_params:
            blob.diff[...] = 0

    # --- weights ----------------------------------------------------------------------------------------

    def copy_trained_layers_from(self, source, source_name="weights"):
        """Caffe's CopyTrainedLayersFrom(NetParameter): copy blobs into layers of the same name (the first
        of that name, as Caffe's search from the front)."""
        index = {}
        for i, name in enumerate(self.layer_names):
            index.setdefault(name, i)
        for src in source.layer:
            layer_id = index.get(src.name)
            if layer_id is None:
                log.debug("Ignoring source layer %s", src.name)
                continue
            target = self.layers[layer_id].blobs
            if len(src.blobs) != len(target):
                raise NetError("%s: incompatible number of blobs for layer '%s': the file has %d, the net %d"
                               % (source_name, src.name, len(src.blobs), len(target)))
            for j, proto in enumerate(src.blobs):
                if not target[j].shape_matches_proto(proto):
                    raise NetError("%s: cannot copy param %d weights from layer '%s'; shape mismatch. Source param "
                                   "shape is %s; target param shape is %s. To learn this layer's parameters from "
                                   "scratch rather than copying from a saved net, rename the layer."
                                   % (source_name, j, src.name, Blob.proto_shape(proto), target[j].shape))
                target[j].from_proto(proto, reshape=False, what="layer '%s' blob %d" % (src.name, j))

    def share_with(self, other):
        """Use `other`'s parameter data (Caffe's ShareTrainedLayersWith, what the Solver does to its test nets and
        pycaffe's share_weights): layers matched by name; each net keeps its own diffs, so that backward passes
        in one do not add into the other's gradients."""
        index = dict(zip(other.layer_names, other.layers))
        for name, layer in zip(self.layer_names, self.layers):
            source = index.get(name)
            if source is None or not source.blobs:
                continue
            if len(source.blobs) != len(layer.blobs):
                raise NetError("incompatible number of blobs for layer '%s'" % name)
            for j, blob in enumerate(source.blobs):
                if blob.shape != layer.blobs[j].shape:
                    raise NetError("cannot share param %d of layer '%s': shape %s vs. %s"
                                   % (j, name, blob.shape, layer.blobs[j].shape))
                layer.blobs[j].share_data(blob)

    def to_proto(self, write_diff=False):
        """Caffe's Net::ToProto: the net's (filtered, split) layer params with their blobs."""
        out = caffe_pb2.NetParameter()
        out.name = self.name
        for layer in self.layers:
            layer_proto = out.layer.add()
            layer_proto.CopyFrom(layer.param)
            for blob in layer.blobs:
                blob.to_proto(write_diff, layer_proto.blobs.add())
        return out


def weighted_loss(blob):
    """Caffe's Layer::Forward: a dot of the top with its loss weights (in its diff), in the net's own precision
    (Dtype), not in double."""
    return np.dot(blob.cpu_data.reshape(-1), blob.cpu_diff.reshape(-1))


class WeightedLosses:
    """The weighted losses of one forward, summed in the layers' order when read (value). Caffe's Layer::Forward
    reads each loss as its layer runs, which on the GPU makes the host wait for the device in mid-pass, with
    nothing queued behind: the GPU idles while the host queues the next layers. Here a loss top that no later
    layer writes stays on the device until the sum is read (after the backward is queued, in forward_backward);
    the sum is the same float32 arithmetic in the same order. `checks`: layers whose GPU forward left a check of
    its input until then (Layer.defers_checks)."""

    def __init__(self):
        self.terms = []         # each top's weighted loss, or the blob to read it from
        self.checks = []

    def value(self):
        for layer in self.checks:
            layer.finish_forward_gpu()
        loss = None
        for term in self.terms:
            term = weighted_loss(term) if isinstance(term, Blob) else term
            loss = term if loss is None else loss + term
        return 0.0 if loss is None else float(loss)
