"""The gradients' buckets (distributed/allreduce/buckets.py), hooked into a real net's backward: each bucket goes to
the exchange as soon as the backward is past every layer that uses its blobs (last layers first, a blob shared by
two layers only after the lower one), only on the last pass of iter_size, and finish() writes the mean into the
diffs. The ring is a stand-in here that records when each bucket came and sums N copies of it (ring.py is tested
in real MPI worlds in test_ring.py)."""
import numpy as np
from google.protobuf import text_format

from pycaffe_dist.distributed.allreduce import buckets as bucketing
from pycaffe_dist.distributed.allreduce.buckets import GradientBuckets
from pycaffe_dist.net.net import Net
from pycaffe_dist.proto import caffe_pb2

NET = """
name: "chain"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 4 dim: 6 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        param { name: "shared" }
        inner_product_param { num_output: 6 bias_term: false weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param { num_output: 300 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "ip3" type: "InnerProduct" bottom: "ip2" top: "ip3"
        inner_product_param { num_output: 6 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "ip4" type: "InnerProduct" bottom: "ip3" top: "ip4"
        param { name: "shared" } inner_product_param { num_output: 6 bias_term: false } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip4" bottom: "data" top: "loss" }
"""


class RecordingRing:
    """N workers that computed the same gradients: the sum is N times each; `came`: the layer the backward had
    reached when each bucket was sent (GradientBuckets._send, wrapped), and its size."""
    size = 3

    def __init__(self):
        self.came, self.reached = [], None

    def allreduce(self, buffer):
        buffer *= self.size
        return buffer


def net_and_buckets(passes=1, first=1 << 10):
    param = caffe_pb2.NetParameter()
    text_format.Parse(NET, param)
    net = Net(param, caffe_pb2.TRAIN)
    net.blob_by_name("data").data[...] = np.random.default_rng(0).standard_normal((4, 6))
    ring = RecordingRing()
    net.backward_hooks.insert(0, lambda layer_id: setattr(ring, "reached", layer_id))
    buckets = GradientBuckets(net, ring, passes, bucket_bytes=4 << 10, first_bucket_bytes=first)
    send = buckets._send

    def recorded(bucket):
        ring.came.append((ring.reached, bucket.buffer.size))
        send(bucket)
    buckets._send = recorded
    return net, ring, buckets


def test_buckets_go_last_layers_first_and_a_shared_blob_waits_for_its_lowest_user():
    net, ring, buckets = net_and_buckets()
    params = net.learnable_params
    order = [k for b in buckets.buckets for k in b.blobs]
    assert sorted(order) == list(range(len(params)))
    shared = [k for k, b in enumerate(params) if b.shape == (6, 6)]
    assert len(shared) == 1                     # ip1 and ip4 share one learnable blob
    # ip4's own blob is ip1's too: it is final only once the backward is past ip1, so it goes last
    ip1 = list(net.layer_names).index("ip1")
    assert buckets.buckets[-1].ready_at == ip1 and buckets.buckets[-1].blobs == shared
    assert [b.ready_at for b in buckets.buckets] == sorted((b.ready_at for b in buckets.buckets), reverse=True)
    buckets.close()


def test_a_bucket_is_sent_while_the_backward_goes_on_and_finish_writes_the_mean():
    net, ring, buckets = net_and_buckets()
    net.clear_param_diffs()
    net.forward_backward()
    alone = [b.diff.copy() for b in net.learnable_params]
    net.clear_param_diffs()
    buckets.start_iteration()
    buckets.flags[bucketing.LOSS] = 0.5
    net.forward_backward()
    flags, finite = buckets.finish()
    assert finite and flags[bucketing.LOSS] == 0.5 * RecordingRing.size
    assert len(ring.came) == len(buckets.buckets) > 1
    # the first bucket (ip3's blobs) came while the backward had ip2 and ip1 left to do
    assert ring.came[0][0] == list(net.layer_names).index("ip3")
    for mine, before in zip(net.learnable_params, alone):
        np.testing.assert_allclose(mine.diff, before, rtol=1e-6)     # the mean of N equal gradients: the gradient
    buckets.close()


def test_only_the_last_pass_of_iter_size_is_sent():
    net, ring, buckets = net_and_buckets(passes=2)
    net.clear_param_diffs()
    buckets.start_iteration()
    net.forward_backward()
    assert ring.came == []
    net.forward_backward()
    buckets.finish()
    assert len(ring.came) == len(buckets.buckets)
    buckets.close()


def test_nan_in_a_gradient_is_seen_by_finish():
    net, ring, buckets = net_and_buckets()
    net.clear_param_diffs()
    buckets.start_iteration()
    net.forward_backward()
    net.learnable_params[0].diff.reshape(-1)[0] = np.inf     # after its bucket was sent: not in the sum
    _, finite = buckets.finish()
    assert finite
    net.clear_param_diffs()
    buckets.start_iteration()
    net.forward_from_to(0, len(net.layers) - 1)
    net.learnable_params[0].diff.reshape(-1)[0] = np.nan     # no backward ran: finish sends every bucket now
    _, finite = buckets.finish()
    assert not finite
    buckets.close()


class SteppedRing(RecordingRing):
    """A ring with the non-blocking start() (ring.RingSum's interface): each sum needs `steps` calls of progress()
    or one wait(); `advanced` records the layer the backward had reached at each progress() call."""
    nonblocking = True
    steps = 2

    def __init__(self):
        super().__init__()
        self.advanced = []

    def start(self, buffer):
        ring = self

        class Sum:
            done, left = False, ring.steps

            def progress(self):
                ring.advanced.append(ring.reached)
                self.left -= 1
                if self.left <= 0 and not self.done:
                    ring.allreduce(buffer)
                    self.done = True
                return self.done

            def wait(self):
                while not self.progress():
                    pass
                return buffer
        return Sum()


def test_on_a_non_blocking_ring_the_backward_itself_advances_the_sums():
    param = caffe_pb2.NetParameter()
    text_format.Parse(NET, param)
    net = Net(param, caffe_pb2.TRAIN)
    net.blob_by_name("data").data[...] = np.random.default_rng(0).standard_normal((4, 6))
    net.clear_param_diffs()
    net.forward_backward()
    alone = [b.diff.copy() for b in net.learnable_params]
    ring = SteppedRing()
    net.backward_hooks.insert(0, lambda layer_id: setattr(ring, "reached", layer_id))
    buckets = GradientBuckets(net, ring, 1, bucket_bytes=4 << 10, first_bucket_bytes=1 << 10)
    assert buckets._thread is None and len(buckets.buckets) > 1
    net.clear_param_diffs()
    ring.reached = None
    buckets.start_iteration()
    net.forward_backward()
    # the first bucket's sum was advanced by the hooks of the layers below the one that made it ready, while the
    # backward went on: its two steps were taken at two layers before the backward's end
    first_ready = buckets.buckets[0].ready_at
    during = [layer for layer in ring.advanced if layer is not None]
    assert during[:2] == [first_ready, first_ready - 1] and buckets.buckets[0].done.is_set()
    flags, finite = buckets.finish()
    assert finite and all(b.done.is_set() for b in buckets.buckets)
    for mine, before in zip(net.learnable_params, alone):
        np.testing.assert_allclose(mine.diff, before, rtol=1e-6)
    buckets.close()
