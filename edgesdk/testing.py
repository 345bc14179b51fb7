"""Small real models for tests, demos and benchmarks, built locally without model hubs.

Needs the ``[dev]`` extra (onnx, scikit-learn). TFLite files are written with the
flatbuffer schema that ships inside ``ai-edge-litert``, so no TensorFlow is needed.
The same weights go into the ONNX and the TFLite file, so both backends must agree.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["MLPWeights", "DigitsData", "load_digits_data", "train_digits_mlp", "random_mlp", "mlp_forward",
           "write_mlp_onnx", "write_attention_onnx", "write_mlp_tflite", "digits_cnn", "write_sample"]


@dataclass(frozen=True)
class MLPWeights:
    """Dense layers as (weight [in, out], bias [out]) pairs; ReLU between, softmax at the end."""

    layers: tuple[tuple[np.ndarray, np.ndarray], ...]

    @property
    def n_inputs(self) -> int:
        """Width of the input vector."""
        return int(self.layers[0][0].shape[0])

    @property
    def n_outputs(self) -> int:
        """Number of classes (width of the softmax output)."""
        return int(self.layers[-1][0].shape[1])


@dataclass(frozen=True)
class DigitsData:
    """scikit-learn's bundled 8x8 digits, scaled to [0, 1], split 75/25."""

    #: float32 [n, 64] pixel rows.
    x_train: np.ndarray
    #: Digit labels 0..9, one per row.
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def load_digits_data(seed: int = 0) -> DigitsData:
    """The digits split stratified by label; ``seed`` picks the split (needs scikit-learn, no download)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, digits.target, test_size=0.25, random_state=seed,
                                                        stratify=digits.target)
    return DigitsData(x_train, y_train, x_test, y_test)


def train_digits_mlp(data: DigitsData, hidden: int = 64, seed: int = 0) -> MLPWeights:
    """Train a one-hidden-layer MLP on digits (about a second; ~97% test accuracy)."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    clf = MLPClassifier(hidden_layer_sizes=(hidden,), max_iter=300, random_state=seed)
    with warnings.catch_warnings():
        # Not fully converged at 300 epochs is fine: the test accuracy is what matters (~97%).
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(data.x_train, data.y_train)
    return MLPWeights(tuple((w.astype(np.float32), b.astype(np.float32)) for w, b in zip(clf.coefs_, clf.intercepts_)))


def random_mlp(widths: list[int], seed: int = 0) -> MLPWeights:
    """An untrained MLP of the given widths (He-initialised), for speed measurements."""
    rng = np.random.default_rng(seed)
    layers = []
    for n_in, n_out in zip(widths[:-1], widths[1:]):
        w = (rng.standard_normal((n_in, n_out)) * np.sqrt(2.0 / n_in)).astype(np.float32)
        layers.append((w, np.zeros(n_out, np.float32)))
    return MLPWeights(tuple(layers))


def mlp_forward(weights: MLPWeights, x: np.ndarray) -> np.ndarray:
    """Reference forward pass in numpy (float64 accumulate)."""
    h = x.astype(np.float64)
    for i, (w, b) in enumerate(weights.layers):
        h = h @ w + b
        if i < len(weights.layers) - 1:
            h = np.maximum(h, 0)
    e = np.exp(h - h.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def write_mlp_onnx(weights: MLPWeights, path: str | os.PathLike[str], batch: int | None = None,
                   input_name: str = "input", output_name: str = "probabilities", opset: int = 17) -> Path:
    """Write the MLP as ONNX (MatMul/Add/Relu/Softmax); ``batch=None`` leaves the batch dim dynamic."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    batch_dim: int | str = "batch" if batch is None else batch
    nodes, inits = [], []
    current = input_name
    for i, (w, b) in enumerate(weights.layers):
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes += [helper.make_node("MatMul", [current, f"w{i}"], [f"mm{i}"]),
                  helper.make_node("Add", [f"mm{i}", f"b{i}"], [f"z{i}"])]
        current = f"z{i}"
        if i < len(weights.layers) - 1:
            nodes.append(helper.make_node("Relu", [current], [f"h{i}"]))
            current = f"h{i}"
    nodes.append(helper.make_node("Softmax", [current], [output_name], axis=-1))
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, [batch_dim, weights.n_inputs])],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, [batch_dim, weights.n_outputs])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="edgesdk.testing")
    onnx.checker.check_model(model)
    path = Path(path)
    onnx.save(model, str(path))
    return path


def write_attention_onnx(path: str | os.PathLike[str], width: int = 64, opset: int = 17) -> Path:
    """A model whose cost grows with the square of its sequence length, as attention's does.

    Input ``tokens: float32[batch, length, width]`` (batch and length dynamic); output
    ``scores: float32[batch, length]``, the row sums of ``tokens @ tokens^T``. One request of
    length 16 takes microseconds, one of length 4,096 about a gigaflop: the case of a text,
    audio or dynamic-size image model whose single-row requests differ a thousandfold.
    """
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Transpose", ["tokens"], ["keys"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["tokens", "keys"], ["similarity"]),
             helper.make_node("ReduceSum", ["similarity", "axis"], ["scores"], keepdims=0)]
    axis = helper.make_tensor("axis", TensorProto.INT64, [1], [-1])
    graph = helper.make_graph(
        nodes, "attention",
        [helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["batch", "length", width])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", "length"])], [axis])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="edgesdk.testing")
    onnx.checker.check_model(model)
    path = Path(path)
    onnx.save(model, str(path))
    return path


def write_mlp_tflite(weights: MLPWeights, path: str | os.PathLike[str], batch: int = 1,
                     input_name: str = "input", output_name: str = "probabilities") -> Path:
    """Write the MLP as TFLite (FULLY_CONNECTED with fused ReLU, SOFTMAX); batch dim resizable."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as fb

    buffers = [fb.BufferT()]  # buffer 0 is the conventional empty buffer

    def tensor(name: str, shape: list[int], data: np.ndarray | None = None, dynamic_batch: bool = False) -> int:
        t = fb.TensorT()
        t.name, t.shape, t.type = name.encode(), shape, fb.TensorType.FLOAT32
        if dynamic_batch:
            t.shapeSignature = [-1, *shape[1:]]
        t.buffer = 0
        if data is not None:
            buf = fb.BufferT()
            buf.data = np.frombuffer(np.ascontiguousarray(data, np.float32).tobytes(), np.uint8)
            buffers.append(buf)
            t.buffer = len(buffers) - 1
        tensors.append(t)
        return len(tensors) - 1

    def opcode(code: int) -> fb.OperatorCodeT:
        c = fb.OperatorCodeT()
        c.builtinCode, c.deprecatedBuiltinCode, c.version = code, code, 1
        return c

    tensors: list[fb.TensorT] = []
    operators = []
    current = tensor(input_name, [batch, weights.n_inputs], dynamic_batch=True)
    first_input = current
    for i, (w, b) in enumerate(weights.layers):
        last = i == len(weights.layers) - 1
        w_idx = tensor(f"w{i}", [w.shape[1], w.shape[0]], w.T)  # TFLite wants [out, in]
        b_idx = tensor(f"b{i}", [w.shape[1]], b)
        out = tensor(f"z{i}" if last else f"h{i}", [batch, w.shape[1]], dynamic_batch=True)
        options = fb.FullyConnectedOptionsT()
        options.fusedActivationFunction = fb.ActivationFunctionType.NONE if last else fb.ActivationFunctionType.RELU
        op = fb.OperatorT()
        op.opcodeIndex, op.inputs, op.outputs = 0, [current, w_idx, b_idx], [out]
        op.builtinOptionsType, op.builtinOptions = fb.BuiltinOptions.FullyConnectedOptions, options
        operators.append(op)
        current = out
    probs = tensor(output_name, [batch, weights.n_outputs], dynamic_batch=True)
    softmax_options = fb.SoftmaxOptionsT()
    softmax_options.beta = 1.0
    op = fb.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = 1, [current], [probs]
    op.builtinOptionsType, op.builtinOptions = fb.BuiltinOptions.SoftmaxOptions, softmax_options
    operators.append(op)

    subgraph = fb.SubGraphT()
    subgraph.tensors, subgraph.inputs, subgraph.outputs = tensors, [first_input], [probs]
    subgraph.operators, subgraph.name = operators, b"main"
    model = fb.ModelT()
    model.version, model.description = 3, b"edgesdk.testing MLP"
    model.operatorCodes = [opcode(fb.BuiltinOperator.FULLY_CONNECTED), opcode(fb.BuiltinOperator.SOFTMAX)]
    model.subgraphs, model.buffers = [subgraph], buffers
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    path = Path(path)
    path.write_bytes(bytes(builder.Output()))
    return path


def digits_cnn(data: DigitsData, epochs: int = 30, seed: int = 0):  # type: ignore[no-untyped-def]
    """A small CNN (conv-BN-ReLU x2, pool, linear) trained on the 8x8 digits in a few seconds (needs torch).

    Input ``[N, 1, 8, 8]`` float32 in [0, 1]; returns the ``nn.Module`` in eval mode (~98% test accuracy).
    """
    import torch
    from torch import nn

    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10),
    )
    x = torch.from_numpy(data.x_train.reshape(-1, 1, 8, 8))
    y = torch.from_numpy(data.y_train.astype(np.int64))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        for batch in torch.randperm(len(x), generator=generator).split(64):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
            optimizer.step()
    return model.eval()


def write_sample(out: str | os.PathLike[str]) -> list[Path]:
    """Write a trained digits classifier and its data, the files the README's examples use.

    ``model.onnx`` and ``model.tflite`` (input ``input`` [batch, 64], output ``probabilities``
    [batch, 10]), ``calib.npy`` (256 training images), ``eval.npy`` and ``labels.npy``
    (the held-out images and their classes).
    """
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    data = load_digits_data()
    weights = train_digits_mlp(data)
    np.save(folder / "calib.npy", data.x_train[:256])
    np.save(folder / "eval.npy", data.x_test)
    np.save(folder / "labels.npy", data.y_test.astype(np.int64))
    return [write_mlp_onnx(weights, folder / "model.onnx"), write_mlp_tflite(weights, folder / "model.tflite"),
            folder / "calib.npy", folder / "eval.npy", folder / "labels.npy"]


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 3 or sys.argv[1] != "sample":
        sys.exit("usage: python -m edgesdk.testing sample DIR   (writes a small trained model and its data)")
    for written in write_sample(sys.argv[2]):
        print(written)
