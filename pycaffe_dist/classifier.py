"""pycaffe's caffe.Classifier (python/caffe/classifier.py): a TEST-phase Net that takes HxWxK images, brings them
to `image_dims`, takes the centre crop of the net's input size (or Caffe's ten oversampled crops, their
predictions averaged) and preprocesses them with caffe.io's Transformer.

`input_transformer` is shared with the Detector: both configure the same Transformer from the same arguments.
"""
import numpy as np

from .errors import PycaffeDistError
from .io import pycaffe_io
from .pycaffe import TEST, Net


class InferenceInputError(PycaffeDistError, ValueError):
    """Images or arguments a Classifier or Detector cannot take. A ValueError too, as the errors pycaffe's own
    classes end in for such input (numpy's broadcasting and shape errors)."""


def input_transformer(net, mean=None, input_scale=None, raw_scale=None, channel_swap=None):
    """A Transformer for the net's first input: HxWxK images transposed to KxHxW, then the channel swap, the raw
    scale, the mean and the input scale, in that order (Transformer.preprocess), as Caffe's Classifier and
    Detector configure theirs."""
    in_ = net.inputs[0]
    transformer = pycaffe_io.Transformer({in_: net.blobs[in_].data.shape})
    transformer.set_transpose(in_, (2, 0, 1))
    if mean is not None:
        transformer.set_mean(in_, np.asarray(mean))
    if input_scale is not None:
        transformer.set_input_scale(in_, input_scale)
    if raw_scale is not None:
        transformer.set_raw_scale(in_, raw_scale)
    if channel_swap is not None:
        transformer.set_channel_swap(in_, channel_swap)
    return transformer


def first_input(net, what):
    """The name of the net's first input blob; a net without one (a train_test net's Data layers) cannot take
    images, so say so instead of failing on net.inputs[0]."""
    if not net.inputs:
        raise InferenceInputError("%s needs a deploy net whose first input takes the images (an Input layer); "
                                  "net '%s' has no input blobs" % (what, net.name))
    return net.inputs[0]


def check_channels(net, images, what):
    """The channel count K of HxWxK images, which must be the same for all and match the net's first input (a
    mismatch would otherwise surface as a numpy broadcasting error deep in forward)."""
    shapes = {np.shape(image)[2:] for image in images}
    wanted = net.blobs[net.inputs[0]].data.shape[1]
    if len(shapes) != 1 or len(next(iter(shapes))) != 1:
        raise InferenceInputError("%s: images must all be H x W x K arrays with the same K, got shapes %s"
                                  % (what, sorted({np.shape(image) for image in images})[:4]))
    channels = next(iter(shapes))[0]
    if channels != wanted:
        raise InferenceInputError("%s: the images have %d channel(s) but the net's input '%s' takes %d%s"
                                  % (what, channels, net.inputs[0], wanted,
                                     " (load them in grey: color=False)" if wanted == 1 else ""))
    return channels


class Classifier(Net):
    """Classifier(model_file, pretrained_file, image_dims=None, mean=None, input_scale=None, raw_scale=None,
    channel_swap=None): image classification by resizing to image_dims (default: the net's input size), then the
    centre crop or ten oversampled crops of the input size. predict(inputs, oversample=True) returns N x C."""

    def __init__(self, model_file, pretrained_file, image_dims=None, mean=None, input_scale=None, raw_scale=None,
                 channel_swap=None):
        super().__init__(model_file, TEST, weights=pretrained_file)
        in_ = first_input(self, "Classifier")
        self.transformer = input_transformer(self, mean, input_scale, raw_scale, channel_swap)
        self.crop_dims = np.array(self.blobs[in_].data.shape[2:])
        if image_dims is None or len(image_dims) == 0:
            image_dims = self.crop_dims
        self.image_dims = image_dims
        if len(image_dims) != 2 or np.any(np.asarray(image_dims) < self.crop_dims):
            # Caffe would crop out of range and fail later on a shape mismatch; say it here
            raise InferenceInputError("image_dims %s must be (height, width) at least the net's input size %s"
                                      % (tuple(int(d) for d in image_dims), tuple(int(d) for d in self.crop_dims)))

    def predict(self, inputs, oversample=True):
        """Class scores (the net's first output) of a list of HxWxK images: N x C, averaged over the ten crops of
        caffe.io.oversample when `oversample`, else from the centre crop alone."""
        if len(inputs) == 0:
            raise InferenceInputError("Classifier.predict: no images given")
        height, width = (int(d) for d in self.image_dims)
        channels = check_channels(self, inputs, "Classifier.predict")
        images = np.zeros((len(inputs), height, width, channels), dtype=np.float32)
        for ix, image in enumerate(inputs):
            # An image already at image_dims is used as it is: resize_image to its own size only adds rounding.
            images[ix] = image if np.shape(image)[:2] == (height, width) else \
                pycaffe_io.resize_image(image, (height, width))
        if oversample:
            crops = pycaffe_io.oversample(images, self.crop_dims)
        else:
            # Caffe's centre crop: from centre - crop/2 (truncated), crop_dims high and wide
            top, left = (np.array((height, width)) / 2.0 - self.crop_dims / 2.0).astype(int)
            crop_h, crop_w = (int(d) for d in self.crop_dims)
            crops = images[:, top:top + crop_h, left:left + crop_w, :]
        in_ = self.inputs[0]
        caffe_in = np.zeros((len(crops), channels, crops.shape[1], crops.shape[2]), dtype=np.float32)
        for ix, crop in enumerate(crops):
            caffe_in[ix] = self.transformer.preprocess(in_, crop)
        predictions = self.forward_all(**{in_: caffe_in})[self.outputs[0]]
        if oversample:
            predictions = predictions.reshape((len(predictions) // 10, 10, -1)).mean(1)
        return predictions
