"""Write the benchmark copies of model-zoo nets (bench/nets/*_input.prototxt) from tests/fixtures/zoo: their data
layers become Input layers of random data and labels (no mirror, crop or mean), batch norm computes batch
statistics (TRAIN), and a deploy net gets Caffe's SoftmaxWithLoss on its last InnerProduct in place of its
Softmax. bench/nets.py sets the batch size when it loads them.

    python bench/nets/make_inputs.py      # rewrites the files below; they are committed
"""
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
ZOO = HERE.parent.parent / "tests" / "fixtures" / "zoo"
NETS = {   # output stem: (zoo file, input image size, classes)
    "resnet50": ("KaimingHe_deep-residual-networks/prototxt/ResNet-50-deploy.prototxt", 224, 1000),
    "googlenet": ("bvlc/models/bvlc_googlenet/train_val.prototxt", 224, 1000),
    "squeezenet": ("forresti_SqueezeNet/SqueezeNet_v1.1/train_val.prototxt", 227, 1000),
}


def input_layer(caffe_pb2, batch, size, phase):
    layer = caffe_pb2.LayerParameter(name="data", type="Input", top=["data", "label"])
    layer.include.add(phase=phase)
    layer.input_param.shape.add(dim=[batch, 3, size, size])
    layer.input_param.shape.add(dim=[batch])
    return layer


def convert(stem, source, size):
    sys.path.insert(0, str(HERE.parent.parent))
    from google.protobuf import text_format
    from pycaffe_dist.io.load import read_net
    from pycaffe_dist.proto import caffe_pb2
    param = read_net(str(ZOO / source))
    out = caffe_pb2.NetParameter(name=param.name)
    out.layer.extend([input_layer(caffe_pb2, 32, size, caffe_pb2.TRAIN), input_layer(caffe_pb2, 32, size,
                                                                                      caffe_pb2.TEST)])
    data_types = ("Data", "ImageData", "Input", "DummyData", "HDF5Data")
    deploy = not any(layer.type.endswith("Loss") for layer in param.layer)
    for layer in param.layer:
        if layer.type in data_types:
            continue
        copy = out.layer.add()
        copy.CopyFrom(layer)
        if copy.type == "BatchNorm":
            copy.batch_norm_param.ClearField("use_global_stats")
        if copy.type == "Softmax" and deploy:               # the class scores' loss
            copy.type, copy.name = "SoftmaxWithLoss", "loss"
            del copy.top[:]
            copy.bottom.append("label")
            copy.top.append("loss")
            copy.ClearField("softmax_param")
    header = "# bench copy of tests/fixtures/zoo/%s (data -> Input: no mirror, crop or mean; batch norm in TRAIN " \
             "computes batch statistics); bench/nets.py sets the batch size\n" % source
    (HERE / ("%s_input.prototxt" % stem)).write_text(header + text_format.MessageToString(out))


if __name__ == "__main__":
    for stem, (source, size, _) in NETS.items():
        convert(stem, source, size)
        print(HERE / ("%s_input.prototxt" % stem))
