"""Making the INT8 and FP16 variants: settings, calibration, the quantizers and the methods that keep accuracy.

``config`` (the settings and per-board presets), ``calibrate`` (one streaming pass for tensor
ranges), ``decompose`` (activations rewritten into ops with int8 kernels), ``quantize`` (the
FP16, dynamic and static builders), ``qdq`` (editing a QDQ graph: a block back in float) and
``search`` (the mixed-precision search).
"""
