"""pycaffe's caffe.Detector (python/caffe/detector.py): windowed detection as in R-CNN. Each window (ymin, xmin,
ymax, xmax) of an image is cropped, optionally with `context_pad` pixels of surrounding context in the net's input
(the part of the padded box outside the image filled with the mean), warped to the net's input size and classified;
one prediction per window.

Where Caffe's code no longer runs on today's numpy and Python 3 (float slice bounds, a zip iterated twice) we do
what it meant; its arithmetic, including the box's +1 sizes and rounding, is kept so the crops are Caffe's.
Selective search proposals need the external MATLAB tool Caffe calls; without it detect_selective_search says so.
"""
import os

import numpy as np

from .classifier import InferenceInputError, check_channels, first_input, input_transformer
from .errors import PycaffeDistError
from .io import pycaffe_io
from .pycaffe import TEST, Net


class SelectiveSearchUnavailable(PycaffeDistError, ImportError):
    """The selective search proposal tool (selective_search_ijcv_with_python and its MATLAB code) is not
    installed: an ImportError too, as Caffe's import of it fails."""


class Detector(Net):
    """Detector(model_file, pretrained_file, mean=None, input_scale=None, raw_scale=None, channel_swap=None,
    context_pad=None): detect_windows([(image file, [window, ...]), ...]) returns, per window in order,
    {'filename', 'window', 'prediction'} with the net's first output for that window."""

    def __init__(self, model_file, pretrained_file, mean=None, input_scale=None, raw_scale=None, channel_swap=None,
                 context_pad=None):
        super().__init__(model_file, TEST, weights=pretrained_file)
        first_input(self, "Detector")
        self.transformer = input_transformer(self, mean, input_scale, raw_scale, channel_swap)
        self.configure_crop(context_pad)

    def detect_windows(self, images_windows):
        """Classify every window of every image: images_windows is an iterable of (image file name, windows), a
        window (ymin, xmin, ymax, xmax) in pixels. Returns a list of {'window', 'prediction', 'filename'} dicts."""
        images_windows = [(name, list(windows)) for name, windows in images_windows]   # walked twice below
        in_ = self.inputs[0]
        color = self.blobs[in_].data.shape[1] != 1      # Caffe loads colour; a grey net takes grey images
        window_inputs = []
        for filename, windows in images_windows:
            image = pycaffe_io.load_image(filename, color=color).astype(np.float32)
            for window in windows:
                window_inputs.append(self._checked_crop(image, window, filename))
        if not window_inputs:
            return []
        channels = check_channels(self, window_inputs, "Detector.detect_windows")
        caffe_in = np.zeros((len(window_inputs), channels) + tuple(self.blobs[in_].data.shape[2:]), dtype=np.float32)
        for ix, window_in in enumerate(window_inputs):
            caffe_in[ix] = self.transformer.preprocess(in_, window_in)
        predictions = self.forward_all(**{in_: caffe_in})[self.outputs[0]]
        detections = []
        for filename, windows in images_windows:
            for window in windows:
                detections.append({"window": window, "prediction": predictions[len(detections)],
                                   "filename": filename})
        return detections

    def detect_selective_search(self, image_fnames):
        """detect_windows over the selective search proposals of each image (Caffe's R-CNN path); needs the
        selective_search_ijcv_with_python module and MATLAB, which this package does not ship."""
        try:
            import selective_search_ijcv_with_python as selective_search
        except ImportError:
            raise SelectiveSearchUnavailable(
                "detect_selective_search needs the selective search tool (the Python module "
                "selective_search_ijcv_with_python and MATLAB, https://github.com/sergeyk/"
                "selective_search_ijcv_with_python); compute proposals some other way and call detect_windows with "
                "them") from None
        image_fnames = [os.path.abspath(f) for f in image_fnames]     # MATLAB runs elsewhere: absolute paths
        windows_list = selective_search.get_windows(image_fnames, cmd="selective_search_rcnn")
        return self.detect_windows(zip(image_fnames, windows_list))

    def _checked_crop(self, image, window, filename):
        try:
            return self.crop(image, window)
        except InferenceInputError as exc:
            raise InferenceInputError("%s: %s" % (filename, exc)) from None

    def crop(self, im, window):
        """The window (ymin, xmin, ymax, xmax) of an HxWxK image; with context_pad, the window grown so that
        context_pad pixels of the net's (square) input are context, warped to the input size, and the part
        outside the image filled with the mean in image space."""
        box = np.asarray(window, dtype=np.float64)
        if box.shape != (4,):
            raise InferenceInputError("a window is (ymin, xmin, ymax, xmax), got %r" % (window,))
        im_h, im_w = im.shape[:2]
        crop = im[int(box[0]):int(box[2]), int(box[1]):int(box[3])]
        if not self.context_pad:
            if crop.size == 0:
                raise InferenceInputError("window %s of the %dx%d image holds no pixels"
                                          % (tuple(window), im_h, im_w))
            return crop
        crop_size = self.blobs[self.inputs[0]].width      # as Caffe: the input is taken to be square
        scale = crop_size / (1.0 * crop_size - self.context_pad * 2)
        half_h = (box[2] - box[0] + 1) / 2.0
        half_w = (box[3] - box[1] + 1) / 2.0
        center = (box[0] + half_h, box[1] + half_w)
        box = np.round(np.tile(center, 2) + scale * np.array((-half_h, -half_w, half_h, half_w)))
        scale_h = crop_size / (box[2] - box[0] + 1)
        scale_w = crop_size / (box[3] - box[1] + 1)
        pad_y = int(round(max(0, -box[0]) * scale_h))    # how much of the padded box lies above / left of the image
        pad_x = int(round(max(0, -box[1]) * scale_w))
        box = np.clip(box, 0.0, [im_h, im_w, im_h, im_w])
        crop_h = min(int(round((box[2] - box[0] + 1) * scale_h)), crop_size - pad_y)
        crop_w = min(int(round((box[3] - box[1] + 1) * scale_w)), crop_size - pad_x)
        context_crop = im[int(box[0]):int(box[2]), int(box[1]):int(box[3])]
        if context_crop.size == 0 or crop_h < 1 or crop_w < 1:
            raise InferenceInputError("window %s with context lies outside the %dx%d image"
                                      % (tuple(window), im_h, im_w))
        context_crop = pycaffe_io.resize_image(context_crop, (crop_h, crop_w))
        crop = np.ones(self.crop_dims, dtype=np.float32) * self.crop_mean
        crop[pad_y:pad_y + crop_h, pad_x:pad_x + crop_w] = context_crop
        return crop

    def configure_crop(self, context_pad):
        """Set crop_dims (the input's H x W x K) and context_pad; with context, crop_mean is the mean taken back to
        image space (un-transposed, channels un-swapped, divided by raw_scale) to fill padding with, or zeros."""
        in_ = self.inputs[0]
        inverse = np.argsort(self.transformer.transpose[in_])
        self.crop_dims = np.array(self.blobs[in_].data.shape[1:])[inverse]
        self.context_pad = context_pad
        if not self.context_pad:
            return
        mean = self.transformer.mean.get(in_)
        if mean is None:
            self.crop_mean = np.zeros(self.crop_dims, dtype=np.float32)
            return
        crop_mean = np.array(mean, dtype=np.float32).transpose(inverse)
        channel_order = self.transformer.channel_swap.get(in_)
        if channel_order is not None:
            crop_mean = crop_mean[:, :, np.argsort(channel_order)]
        raw_scale = self.transformer.raw_scale.get(in_)
        if raw_scale is not None:
            crop_mean /= raw_scale
        self.crop_mean = crop_mean
