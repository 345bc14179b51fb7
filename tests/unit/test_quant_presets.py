"""Per-target quantization presets: what each target's ONNX Runtime kernels need, typed and frozen."""

from __future__ import annotations

import dataclasses

import pytest

from edgesdk.converters.quantization.config import QuantizationConfig, QuantType
from edgesdk.errors import ConversionError
from edgesdk.runtime.profiles import load_profile


def test_arm64_preset_has_int8_asymmetric_activations_and_symmetric_per_channel_weights():
    config = QuantizationConfig.arm64()
    assert config.activation_type is QuantType.INT8 and config.activation_symmetric is False
    assert config.weight_type is QuantType.INT8 and config.weight_symmetric and config.per_channel
    assert config.decompose_activations and not config.reduce_range
    assert config.preset.startswith("aarch64: asymmetric int8 activations") and "ConvSym" in config.preset


def test_x86_64_preset_has_uint8_activations_so_qlinearconv_fuses():
    config = QuantizationConfig.x86_64()
    assert config.activation_type is QuantType.UINT8 and not config.activation_symmetric
    assert config.weight_type is QuantType.INT8 and config.weight_symmetric and config.per_channel
    assert config.decompose_activations
    assert config.preset.startswith("x86_64: uint8 activations") and "single-consumer" in config.preset


def test_tensorrt_preset_is_symmetric_int8_and_leaves_activations_whole():
    config = QuantizationConfig.tensorrt()
    assert config.activation_type is config.weight_type is QuantType.INT8
    assert config.activation_symmetric and config.weight_symmetric
    assert not config.decompose_activations and config.preset.startswith("tensorrt:")


@pytest.mark.parametrize(("board", "factory"), [
    ("rk3588", "arm64"), ("raspberry-pi-5", "arm64"), ("raspberry-pi-4", "arm64"), ("generic-aarch64", "arm64"),
    ("generic-x86_64", "x86_64"), ("jetson-orin-nano", "tensorrt"), ("jetson-nano", "tensorrt")])
def test_for_profile_picks_the_board_preset(board, factory):
    config = QuantizationConfig.for_profile(load_profile(board))
    made = getattr(QuantizationConfig, factory)
    assert dataclasses.replace(config, preset="") == dataclasses.replace(made(), preset="")
    assert config.preset.split(":")[0] == {"arm64": "aarch64"}.get(factory, factory)


def test_arm64_preset_names_the_cores_with_dot_product():
    rk3588 = QuantizationConfig.for_profile(load_profile("rk3588"))  # Cortex-A55 + Cortex-A76: both have sdot
    assert rk3588 == QuantizationConfig.arm64(dot_product_cores=("cortex-a55", "cortex-a76"))
    assert "sdot on cortex-a55, cortex-a76" in rk3588.preset
    pi4 = QuantizationConfig.for_profile(load_profile("raspberry-pi-4"))  # Cortex-A72: Armv8.0, no dot product
    assert "no dot product" in pi4.preset and "sdot" not in pi4.preset


def test_presets_are_frozen_and_changed_with_replace():
    config = QuantizationConfig.arm64()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.activation_type = QuantType.UINT8  # type: ignore[misc]
    changed = dataclasses.replace(config, decompose_activations=False)
    assert not changed.decompose_activations and config.decompose_activations
    assert changed.preset == config.preset


def test_strings_become_enums_and_bad_values_are_refused():
    config = QuantizationConfig(activation_type="int8", weight_type="int8")  # type: ignore[arg-type]
    assert config.activation_type is QuantType.INT8 and config.activation_symmetric
    with pytest.raises(ConversionError, match="activation_type: 'int4' is not one of"):
        QuantizationConfig(activation_type="int4")  # type: ignore[arg-type]
    with pytest.raises(ConversionError, match="weight_symmetric must be True or False, got 'yes'"):
        QuantizationConfig(weight_symmetric="yes")  # type: ignore[arg-type]


def test_manifest_dict_says_how_each_tensor_kind_was_quantized():
    data = QuantizationConfig.arm64().to_dict()
    assert data["activation_type"] == "int8" and data["activation_symmetric"] is False
    assert data["weight_type"] == "int8" and data["weight_symmetric"] is True and data["per_channel"] is True
    assert data["decompose_activations"] is True and data["preset"].startswith("aarch64")
    assert QuantizationConfig.x86_64().to_dict()["activation_symmetric"] is False
