"""Model formats: loading and shrinking ONNX, and the TFLite variants made by onnx2tf in its own environment."""
