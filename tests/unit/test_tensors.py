import numpy as np
import pytest

from edgesdk.errors import InputError
from edgesdk.runtime.tensors import TensorSpec, adapt_layout, validate_inputs

IMAGE = TensorSpec("image", (None, 3, 4, 4), np.dtype(np.float32))
MASK = TensorSpec("mask", (1, 4), np.dtype(np.int64))


def test_single_array_maps_to_the_only_input_and_dynamic_dims_accept_any_size():
    x = np.zeros((5, 3, 4, 4), np.float32)
    assert validate_inputs((IMAGE,), x)["image"] is x


def test_dict_inputs_are_matched_by_name():
    feeds = {"mask": np.zeros((1, 4), np.int64), "image": np.zeros((1, 3, 4, 4), np.float32)}
    assert set(validate_inputs((IMAGE, MASK), feeds)) == {"image", "mask"}


def test_missing_input_name_is_named():
    with pytest.raises(InputError, match=r"missing \['mask'\]"):
        validate_inputs((IMAGE, MASK), {"image": np.zeros((1, 3, 4, 4), np.float32)})


def test_unexpected_input_name_is_named():
    with pytest.raises(InputError, match=r"unexpected \['imgae'\]"):
        validate_inputs((IMAGE,), {"imgae": np.zeros((1, 3, 4, 4), np.float32)})


def test_wrong_rank_says_expected_and_got():
    with pytest.raises(InputError, match=r"wrong rank.*image: float32\[\?, 3, 4, 4\].*got shape \(3, 4, 4\)"):
        validate_inputs((IMAGE,), np.zeros((3, 4, 4), np.float32))


def test_wrong_static_dim_is_a_shape_error():
    with pytest.raises(InputError, match=r"wrong shape.*got shape \(1, 1, 4, 4\)"):
        validate_inputs((IMAGE,), np.zeros((1, 1, 4, 4), np.float32))


def test_dtype_is_never_cast_silently():
    with pytest.raises(InputError, match=r"expects dtype float32, got float64.*astype\(np.float32\)"):
        validate_inputs((IMAGE,), np.zeros((1, 3, 4, 4), np.float64))


def test_non_array_input_is_refused_with_the_fix():
    with pytest.raises(InputError, match=r"must be a numpy array.*got list"):
        validate_inputs((MASK,), [[1, 2, 3, 4]])


def test_single_array_for_a_multi_input_model_asks_for_a_dict():
    with pytest.raises(InputError, match="has 2 inputs"):
        validate_inputs((IMAGE, MASK), np.zeros((1, 3, 4, 4), np.float32))


def test_adapt_layout_transposes_only_data_in_the_other_layout_whatever_the_batch():
    nchw_input = TensorSpec("x", (1, 16, 16, 16), np.dtype(np.float32))  # fixed batch 1, C == H == W
    stack = np.arange(4 * 16 * 16 * 16, dtype=np.float32).reshape(4, 16, 16, 16)
    assert adapt_layout({"x": stack}, [nchw_input])["x"] is stack  # four samples already NCHW: untouched
    nhwc_input = TensorSpec("x", (1, 8, 8, 3), np.dtype(np.float32))  # an onnx2tf TFLite input
    nchw = np.zeros((4, 3, 8, 8), np.float32)
    assert adapt_layout({"x": nchw}, [nhwc_input])["x"].shape == (4, 8, 8, 3)
