"""The image preprocessing the converter records and the device replays."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.errors import DataError
from edgesdk.runtime.preprocess import ImagePreprocessing, image_to_tensor
from edgesdk.runtime.tensors import TensorSpec


def test_a_manifest_round_trip_gives_the_same_settings():
    prep = ImagePreprocessing(color="BGR", scale=0.5, mean=(1.0, 2.0, 3.0), std=(2.0, 2.0, 2.0))
    assert ImagePreprocessing.from_manifest(prep.as_dict()) == prep
    assert ImagePreprocessing.from_manifest({}) == ImagePreprocessing()


@pytest.mark.parametrize("shape, expected", [((None, 3, 4, 6), (1, 3, 4, 6)), ((1, 4, 6, 3), (1, 4, 6, 3)),
                                             ((1, 1, 4, 6), (1, 1, 4, 6))])
def test_frames_become_one_batch_in_the_models_layout(shape, expected):
    frame = np.zeros((8, 12, 3), np.uint8)
    frame[..., 2] = 255  # pure red in BGR
    tensor = image_to_tensor(frame, TensorSpec("image", shape, np.dtype(np.float32)), ImagePreprocessing())
    assert tensor.shape == expected and tensor.dtype == np.float32
    if expected[1] == 3:  # RGB: red is channel 0
        assert tensor[0, 0].min() == pytest.approx(1.0) and tensor[0, 2].max() == 0.0


def test_a_non_image_input_is_refused():
    with pytest.raises(DataError, match="4-D"):
        image_to_tensor(np.zeros((8, 8), np.uint8), TensorSpec("x", (1, 64), np.dtype(np.float32)), ImagePreprocessing())
