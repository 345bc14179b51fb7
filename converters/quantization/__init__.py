"""Making the INT8 and FP16 variants: settings, calibration, the quantizers and the methods that keep accuracy.

``config`` (the settings and per-board presets), ``calibrate`` (one streaming pass for tensor
ranges), ``decompose`` (activations rewritten into ops with int8 kernels), ``quantize`` (the
FP16, dynamic and static builders); the methods that keep accuracy where min-max calibration
fails, each returning a ``methods.MethodResult``: ``graph_fixes`` (known traps), ``equalize``
(cross-layer equalization), ``bias_correction``, ``smoothquant``, ``adaround``, combined by
``recipes``; and mixed precision: ``qdq`` (editing a QDQ graph: a block back in float),
``added_error`` (the error each block adds in context) and ``search`` (the timed search).
"""
