"""`edgesdk convert --color/--scale/--mean/--std/--layout/--class-names` with .npy data: recorded for the device.

Arrays are taken as already preprocessed (the health check's sample is the first array as
given); the manifest records what the model expects, and the device side replays it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from edgesdk import Runtime
from edgesdk.cli import cli
from edgesdk.runtime.bundle import read_bundle
from edgesdk.runtime.preprocess import ImagePreprocessing, class_names, image_to_tensor

CLASSES = ["cat", "dog", "bird", "fish"]
IMAGENET = ["--mean", "0.485,0.456,0.406", "--std", "0.229,0.224,0.225"]


@pytest.fixture(scope="module")
def image_model(tmp_path_factory) -> Path:
    """Conv 3->4, ReLU, global average pool, flatten: image[batch, 3, 8, 8] -> scores[batch, 4]; with eval.npy."""
    folder = tmp_path_factory.mktemp("image-model")
    x = helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 8, 8])
    y = helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 4])
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["image", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]), helper.make_node("Flatten", ["p"], ["scores"])]
    model = helper.make_model(helper.make_graph(nodes, "tiny-image", [x], [y], [w]),
                              opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(folder / "model.onnx"))
    np.save(folder / "eval.npy", np.random.default_rng(1).standard_normal((24, 3, 8, 8)).astype(np.float32))
    return folder




def _convert(folder: Path, out: Path, *args: str):
    return CliRunner().invoke(cli, ["convert", str(folder / "model.onnx"), "--profile", "raspberry-pi-5", "--eval",
                                    str(folder / "eval.npy"), "--out", str(out), "--holdout", "0", "--no-emulate",
                                    "--json", *args])


def test_npy_data_records_the_stated_preprocessing_and_class_names_and_the_device_replays_them(image_model, tmp_path):
    names = tmp_path / "names.txt"
    names.write_text("\n".join(CLASSES) + "\n\n")
    result = _convert(image_model, tmp_path / "out", "--color", "BGR", "--layout", "NCHW", *IMAGENET,
                      "--class-names", str(names))
    assert result.exit_code == 0, result.output
    bundle = read_bundle(tmp_path / "out" / "bundle")
    assert dict(bundle.manifest.preprocessing) == {
        "color": "BGR", "scale": pytest.approx(1 / 255), "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225],
        "layout": "NCHW", "labels": CLASSES}
    # The arrays were taken as already preprocessed: the health check's sample is the first one, unchanged.
    inputs, _ = bundle.health_sample()
    np.testing.assert_array_equal(inputs["image"][0], np.load(image_model / "eval.npy")[0])

    # The device side: the bundle's runtime reads the settings and names, and a frame becomes normalised input.
    with Runtime(tmp_path / "out" / "bundle", profile="generic-x86_64") as rt:
        manifest = rt.bundle.manifest
        prep = ImagePreprocessing.from_manifest(manifest.preprocessing)
        assert prep == ImagePreprocessing("BGR", 1 / 255, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), "NCHW")
        assert class_names(manifest.preprocessing) == tuple(CLASSES)
        frame = np.zeros((16, 16, 3), np.uint8)
        frame[..., 0] = 255  # blue in OpenCV's BGR order; BGR is kept, so channel 0
        tensor = image_to_tensor(frame, rt.inputs[0], prep)
        np.testing.assert_allclose(tensor[0, :, 0, 0], [(1 - 0.485) / 0.229, -0.456 / 0.224, -0.406 / 0.225],
                                   rtol=1e-5)
        assert rt.predict(tensor).shape == (1, 4)


def test_npy_data_with_nothing_stated_records_nothing_and_names_alone_are_recorded(sample, tmp_path):
    result = _convert(sample, tmp_path / "plain")
    assert result.exit_code == 0, result.output
    assert dict(read_bundle(tmp_path / "plain" / "bundle").manifest.preprocessing) == {}

    names = tmp_path / "digits.json"
    names.write_text(json.dumps([f"digit {d}" for d in range(10)]))
    named = _convert(sample, tmp_path / "named", "--class-names", str(names), "--labels", str(sample / "labels.npy"))
    assert named.exit_code == 0, named.output
    preprocessing = read_bundle(tmp_path / "named" / "bundle").manifest.preprocessing
    assert dict(preprocessing) == {"labels": [f"digit {d}" for d in range(10)]}
    assert class_names(preprocessing)[3] == "digit 3"


def test_an_image_folder_records_the_preprocessing_it_was_transformed_with(image_model, tmp_path):
    import cv2

    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(4):
        cv2.imwrite(str(folder / f"{i}.png"), np.full((12, 12, 3), 40 * i, np.uint8))
    result = CliRunner().invoke(cli, ["convert", str(image_model / "model.onnx"), "--profile", "raspberry-pi-5",
                                      "--eval", str(folder), "--out", str(tmp_path / "out"), "--holdout", "0",
                                      "--no-emulate", "--json", "--scale", "0.5"])
    assert result.exit_code == 0, result.output
    bundle = read_bundle(tmp_path / "out" / "bundle")
    assert dict(bundle.manifest.preprocessing) == {"color": "RGB", "scale": 0.5, "mean": [0.0], "std": [1.0],
                                                   "layout": "NCHW"}
    inputs, _ = bundle.health_sample()
    np.testing.assert_array_equal(inputs["image"][0], np.zeros((3, 8, 8), np.float32))  # 0.png, black, x 0.5


def _names(tmp_path: Path, text: str, suffix: str = ".txt") -> str:
    path = tmp_path.parent / f"{tmp_path.name}-names{suffix}"  # outside tmp_path, which must stay empty
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(("args", "option", "pattern"), [
    (["--mean", "0.5,0.5"], "--mean", "mean [0.5, 0.5] has 2 values; give 1 (all channels) or 3"),
    (["--std", "0"], "--std", "std [0.0] has a zero; every channel's std must be non-zero"),
    (["--std", "1,nan,1"], "--std", "is not all finite numbers"),
    (["--scale", "0"], "--scale", "scale 0.0 must be a non-zero number"),
    (["--color", "GRAY"], "--color", "color GRAY: input image: float32[?, 3, 8, 8] has 3 channel(s) (NCHW); use RGB"),
    (["--layout", "NHWC"], "--layout", "layout NHWC: input image: float32[?, 3, 8, 8] would have 8 channels"),
    (["--class-names", "3 names"], "--class-names", "3 names, the model's output scores: float32[?, 4] has 4 classes"),
    (["--class-names", "dup"], "--class-names", "class name(s) ['cat'] given more than once"),
    (["--class-names", "gap"], "--class-names", "class 1 has an empty name"),
    (["--class-names", "bad json"], "--class-names", "not valid JSON"),
], ids=lambda v: "_".join(v) if isinstance(v, list) else None)
def test_a_bad_preprocessing_or_names_value_is_a_usage_error_naming_it_before_any_work(image_model, tmp_path, args,
                                                                                         option, pattern):
    files = {"3 names": ("cat\ndog\nbird\n", ".txt"), "dup": ("cat\ndog\ncat\nfish", ".txt"),
             "gap": ("cat\n\nbird\nfish", ".txt"), "bad json": ('["cat", "dog"', ".json")}
    result = _convert(image_model, tmp_path / "out", *[_names(tmp_path, *files[a]) if a in files else a for a in args])
    assert result.exit_code == 2, result.output
    assert option in result.output and pattern in " ".join(result.output.split()), result.output
    assert list(tmp_path.iterdir()) == []


def test_preprocessing_for_a_model_that_takes_no_image_is_refused(sample, tmp_path):
    result = _convert(sample, tmp_path / "out", *IMAGENET)
    assert result.exit_code == 2, result.output
    output = " ".join(result.output.split())
    assert "--mean 0.485,0.456,0.406 --std 0.229,0.224,0.225 does not fit the model input" in output
    assert "images need a 4-D model input (NCHW or NHWC); input: float32[?, 64] is not" in output
    assert list(tmp_path.iterdir()) == []
