"""Calibration/evaluation data loading: arrays, and image folders through the documented preprocessing."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.converters.planning.data import ImagePreprocessing, check_arrays, load_arrays, load_labels, model_inputs
from edgesdk.errors import DataError
from edgesdk.runtime.tensors import TensorSpec

NCHW = (TensorSpec("image", (None, 3, 8, 8), np.dtype(np.float32)),)
NHWC = (TensorSpec("image", (None, 8, 8, 3), np.dtype(np.float32)),)


@pytest.fixture
def image_folder(tmp_path):
    import cv2

    folder = tmp_path / "images"
    folder.mkdir()
    bgr = np.zeros((16, 16, 3), np.uint8)
    bgr[..., 0], bgr[..., 1], bgr[..., 2] = 10, 100, 200  # OpenCV order: blue, green, red
    for i in range(3):
        cv2.imwrite(str(folder / f"{i}.png"), bgr)
    (folder / "notes.txt").write_text("not an image")
    return folder


def test_images_are_resized_converted_to_rgb_scaled_normalised_and_laid_out(image_folder):
    prep = ImagePreprocessing(color="RGB", scale=1 / 255, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    nchw = load_arrays(image_folder, NCHW, prep)["image"]
    assert nchw.shape == (3, 3, 8, 8) and nchw.dtype == np.float32
    expected_rgb = (np.array([200, 100, 10]) / 255 - 0.5) / 0.25
    np.testing.assert_allclose(nchw[0, :, 4, 4], expected_rgb, rtol=1e-5)
    nhwc = load_arrays(image_folder, NHWC, prep)["image"]
    np.testing.assert_allclose(nhwc[0, 4, 4, :], expected_rgb, rtol=1e-5)
    bgr = load_arrays(image_folder, NHWC, ImagePreprocessing(color="BGR"))["image"]
    np.testing.assert_allclose(bgr[0, 0, 0, :], np.array([10, 100, 200]) / 255, rtol=1e-5)


def test_undecodable_image_is_named(image_folder):
    (image_folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    with pytest.raises(DataError, match="broken.png: OpenCV cannot decode"):
        load_arrays(image_folder, NCHW)


def test_empty_image_folder_and_bad_preprocessing(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no images"):
        load_arrays(tmp_path / "empty", NCHW)
    with pytest.raises(DataError, match="std"):
        ImagePreprocessing(std=(1.0, 0.0, 1.0))


def test_npz_by_input_name_and_npy_for_single_input(tmp_path):
    specs = (TensorSpec("a", (None, 2), np.dtype(np.float32)), TensorSpec("b", (None, 3), np.dtype(np.int64)))
    np.savez(tmp_path / "d.npz", a=np.zeros((4, 2), np.float32), b=np.zeros((4, 3), np.int64))
    assert set(load_arrays(tmp_path / "d.npz", specs)) == {"a", "b"}
    np.save(tmp_path / "one.npy", np.zeros((4, 2), np.float32))
    with pytest.raises(DataError, match="one .npy array feeds one input"):
        load_arrays(tmp_path / "one.npy", specs)
    np.savez(tmp_path / "short.npz", a=np.zeros((4, 2), np.float32), b=np.zeros((5, 3), np.int64))
    with pytest.raises(DataError, match="different sample counts"):
        load_arrays(tmp_path / "short.npz", specs)
    (tmp_path / "corrupt.npy").write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(DataError, match="cannot read numpy data"):
        load_arrays(tmp_path / "corrupt.npy", specs[:1])


def test_labels_must_be_integer_ids_matching_the_evaluation_count(tmp_path):
    np.save(tmp_path / "ok.npy", np.arange(4))
    assert len(load_labels(tmp_path / "ok.npy", 4)) == 4
    with pytest.raises(DataError, match="4 labels for 5"):
        load_labels(tmp_path / "ok.npy", 5)
    np.save(tmp_path / "float.npy", np.zeros(4))
    with pytest.raises(DataError, match="integer"):
        load_labels(tmp_path / "float.npy", 4)


def test_data_is_checked_against_inputs_whose_minus_one_or_zero_dims_are_dynamic_and_fixed_by_input_shapes():
    # As ONNX Runtime reports an old exporter's x[-1, 3, -1, -1] (None) and x[0, 3, 0, 0] (0, kept as a size).
    reported = (TensorSpec("x", (None, 3, None, None), np.dtype(np.float32)),
                TensorSpec("z", (0, 3, 0, 0), np.dtype(np.float32)))
    specs = model_inputs(reported)
    assert [s.shape for s in specs] == [(None, 3, None, None), (None, 3, None, None)]
    data = {"x": np.zeros((2, 3, 48, 320), np.float32), "z": np.zeros((2, 3, 48, 320), np.float32)}
    assert check_arrays(data, specs, "evaluation data").keys() == {"x", "z"}
    fixed = model_inputs(reported, {"z": [1, 3, 48, 320]})
    assert fixed[1].shape == (1, 3, 48, 320) and fixed[0].shape == (None, 3, None, None)
    with pytest.raises(DataError, match=r"has shape \(2, 3, 48, 100\), the model takes z: float32\[1, 3, 48, 320\]"):
        check_arrays({**data, "z": np.zeros((2, 3, 48, 100), np.float32)}, fixed, "evaluation data")
