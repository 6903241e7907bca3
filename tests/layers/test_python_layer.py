"""The Python layer (pycaffe_dist/layers/python_layer.py): a user's class, found by module and name, runs forward
and backward in a net and makes its own parameters."""
import sys

import pytest

from pycaffe_dist.errors import NetError
from tests.layers.test_data import net_from_text


PYLAYER = '''
import pycaffe_dist as caffe

class Doubler(caffe.Layer):
    def setup(self, bottom, top):
        self.factor = float(self.param_str or 2)

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        top[0].data[...] = self.factor * bottom[0].data

    def backward(self, top, propagate_down, bottom):
        bottom[0].diff[...] = self.factor * top[0].diff


class Scaler(caffe.Layer):
    """A learned per-column scale, made as pycaffe layers make their parameters: self.blobs.add_blob."""
    def setup(self, bottom, top):
        self.blobs.add_blob(bottom[0].data.shape[1])
        self.blobs[0].data[...] = 2

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data * self.blobs[0].data

    def backward(self, top, propagate_down, bottom):
        self.blobs[0].diff[...] += (top[0].diff * bottom[0].data).sum(0)
'''


def test_python_layer_runs_users_class(tmp_path, monkeypatch):
    (tmp_path / "my_layers.py").write_text(PYLAYER)
    monkeypatch.syspath_prepend(str(tmp_path))
    net = net_from_text("""
        force_backward: true
        layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 2 } } }
        layer { name: "dbl" type: "Python" bottom: "x" top: "y"
                python_param { module: "my_layers" layer: "Doubler" param_str: "3" } }
    """)
    net.blob_by_name("x").data[...] = [[1, 2], [3, 4]]
    net.forward_from_to()
    assert net.blob_by_name("y").data.tolist() == [[3, 6], [9, 12]]
    net.blob_by_name("y").diff[...] = 1
    net.backward_from_to()
    assert net.blob_by_name("x").diff.tolist() == [[3, 3], [3, 3]]
    learned = net_from_text("""
        force_backward: true
        layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
        layer { name: "s" type: "Python" bottom: "x" top: "y" python_param { module: "my_layers" layer: "Scaler" } }
    """)
    scale, = learned.learnable_params                    # the blob add_blob made is a parameter of the net
    assert scale.shape == (3,)
    learned.blob_by_name("x").data[...] = [[1, 2, 3], [4, 5, 6]]
    learned.forward_from_to()
    assert learned.blob_by_name("y").data.tolist() == [[2, 4, 6], [8, 10, 12]]
    learned.blob_by_name("y").diff[...] = 1
    learned.backward_from_to()
    assert scale.diff.tolist() == [5, 7, 9]
    with pytest.raises(NetError, match="module 'my_layers' has no class 'Nope'"):
        net_from_text('layer { name: "p" type: "Python" python_param { module: "my_layers" layer: "Nope" } }')
    sys.modules.pop("my_layers", None)
