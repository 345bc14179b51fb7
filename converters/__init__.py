"""Model conversion and quantization (``edgesdk.converters``); needs the ``[convert]`` extra.

Installed into the ``edgesdk`` namespace by pyproject.toml's ``package-dir`` mapping, so
users write ``from edgesdk.converters import ...``::

    from edgesdk.converters import ConversionRequest, Data, Output, Source, Target, convert

    report = convert(ConversionRequest(Source("model.onnx"), Target("rk3588"),
                                       Data(calibration={"input": x_cal}, evaluation={"input": x_eval}),
                                       Output("out", name="digits", version="1.4.0")))

The request's parts are in :mod:`.request`, the steps in :mod:`.pipeline`, the
quantization settings in :mod:`edgesdk.converters.quantization.config` and measuring on a board of the fleet in
:mod:`edgesdk.converters.board.remote`.
"""

from edgesdk.converters.board.remote import board_measure
from edgesdk.converters.pipeline import ConversionReport, Progress, convert
from edgesdk.converters.quantization.config import CalibrationMethod, QuantizationConfig, QuantType
from edgesdk.converters.request import BoardMeasure, Bounds, ConversionRequest, Data, Output, Source, Target

__all__ = ["convert", "ConversionRequest", "Source", "Target", "Data", "Bounds", "Output", "ConversionReport",
           "Progress", "BoardMeasure", "QuantizationConfig", "CalibrationMethod", "QuantType", "board_measure"]
