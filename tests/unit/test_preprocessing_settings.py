"""The preprocessing and class names a bundle records: resolved against the model input, read back on the device."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.converters.planning.data import check_class_names, load_class_names
from edgesdk.errors import DataError
from edgesdk.runtime.preprocess import ImagePreprocessing, class_names, image_layout, image_to_tensor
from edgesdk.runtime.tensors import TensorSpec

F32 = np.dtype(np.float32)
RGB_NCHW = TensorSpec("image", (None, 3, 8, 8), F32)
GRAY_NCHW = TensorSpec("image", (None, 1, 8, 8), F32)
SCORES = (TensorSpec("scores", (None, 4), F32),)


def test_unstated_settings_come_from_the_input():
    assert ImagePreprocessing.for_input(RGB_NCHW) == ImagePreprocessing("RGB", 1 / 255, (0.0,), (1.0,), "NCHW")
    assert ImagePreprocessing.for_input(GRAY_NCHW).color == "GRAY"
    stated = ImagePreprocessing.for_input(RGB_NCHW, color="BGR", scale=1.0, mean=(1, 2, 3), std=(2,))
    assert stated == ImagePreprocessing("BGR", 1.0, (1.0, 2.0, 3.0), (2.0,), "NCHW")


def test_a_stated_layout_overrides_the_guess_and_is_replayed_on_frames():
    square = TensorSpec("image", (1, 3, 4, 3), F32)  # dim 1 and dim 3 are both 3: the guess says NHWC
    assert image_layout(square)[0] == "NHWC"
    prep = ImagePreprocessing.for_input(square, layout="NCHW")
    assert prep.layout == "NCHW" and image_to_tensor(np.zeros((8, 8, 3), np.uint8), square, prep).shape == (1, 3, 4, 3)
    assert image_layout(square, "NCHW") == ("NCHW", 3, 4, 3)


@pytest.mark.parametrize(("spec", "stated", "pattern"), [
    (RGB_NCHW, {"color": "GRAY"}, r"color GRAY: input image: float32\[\?, 3, 8, 8\] has 3 channel\(s\) \(NCHW\); use RGB or"),
    (GRAY_NCHW, {"color": "RGB"}, "has 1 channel.*; use GRAY"),
    (GRAY_NCHW, {"mean": (0.5, 0.5, 0.5)}, r"mean \[0.5, 0.5, 0.5\] has 3 values; .* has 1 channel\(s\): give 1$"),
    (RGB_NCHW, {"layout": "NHWC"}, "layout NHWC: .* would have 8 channels, an image has 1 or 3"),
    (TensorSpec("x", (None, 8, 8, 5), F32), {}, "has 5 channels .*, an image has 1 or 3"),
    (TensorSpec("x", (None, 64), F32), {}, "images need a 4-D model input"),
])
def test_a_stated_setting_that_cannot_fit_the_input_is_refused(spec, stated, pattern):
    with pytest.raises(DataError, match=pattern):
        ImagePreprocessing.for_input(spec, **stated)


@pytest.mark.parametrize(("settings", "pattern"), [
    ({"mean": (0.1, 0.2)}, "has 2 values"), ({"std": (1.0, 0.0, 1.0)}, "has a zero"),
    ({"mean": (float("inf"),)}, "not all finite"), ({"scale": float("nan")}, "non-zero number"),
    ({"layout": "CHW"}, "layout must be NCHW or NHWC, got 'CHW'"),
])
def test_bad_settings_are_refused_with_the_value(settings, pattern):
    with pytest.raises(DataError, match=pattern):
        ImagePreprocessing(**settings)


def test_the_manifest_form_round_trips_and_bundles_of_older_converters_are_read():
    prep = ImagePreprocessing("BGR", 0.5, (1.0, 2.0, 3.0), (2.0,), "NHWC")
    assert prep.as_dict() == {"color": "BGR", "scale": 0.5, "mean": [1.0, 2.0, 3.0], "std": [2.0], "layout": "NHWC"}
    assert ImagePreprocessing.from_manifest(prep.as_dict()) == prep
    assert "layout" not in ImagePreprocessing().as_dict()
    # Earlier `edgesdk convert` wrote the settings under "images"; the device must not fall back to the defaults.
    assert ImagePreprocessing.from_manifest({"images": prep.as_dict()}) == prep
    with pytest.raises(DataError, match="wrong type"):
        ImagePreprocessing.from_manifest({"mean": "0.5"})


def test_class_names_are_read_from_the_manifest():
    assert class_names({"labels": ["cat", "dog"], "color": "RGB"}) == ("cat", "dog")
    assert class_names({}) == () == class_names({"labels": "cat"})


def test_names_files_one_per_line_or_json(tmp_path):
    lines = tmp_path / "names.txt"
    lines.write_text("  cat\ndog \r\nbird\n\n")
    assert load_class_names(lines) == ("cat", "dog", "bird")
    listed = tmp_path / "names.json"
    listed.write_text('["cat", "dog"]')
    assert load_class_names(listed) == ("cat", "dog")
    listed.write_text('{"0": "cat"}')
    with pytest.raises(DataError, match="must be a list of strings"):
        load_class_names(listed)
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(DataError, match="no class names"):
        load_class_names(tmp_path / "empty.txt")


def test_names_must_fit_the_class_output_and_the_labels():
    assert check_class_names(("a", "b", "c", "d"), SCORES) == ("a", "b", "c", "d")
    with pytest.raises(DataError, match=r"names.txt: 3 names, the model's output scores: float32\[\?, 4\] has 4"):
        check_class_names(("a", "b", "c"), SCORES, where="names.txt")
    dynamic = (TensorSpec("scores", (None, None), F32),)
    assert check_class_names(("a", "b"), dynamic) == ("a", "b")  # a dynamic class dim cannot be checked
    with pytest.raises(DataError, match="2 names, but the labels have class id 5"):
        check_class_names(("a", "b"), dynamic, labels=np.array([0, 5, 1]))
