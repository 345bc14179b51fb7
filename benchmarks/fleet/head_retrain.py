"""A real "retrained head" model pair for the OTA delta benchmark (issue 13, figure 1).

``head_retrain_pair(workdir)`` takes the pretrained PP-OCRv4 text recognizer of
``models.MODELS["ocr_rec"]``, drops its 6625-way CTC head (``MatMul`` with ``linear_85.w_0``,
``Add`` with ``linear_85.b_0``, ``Softmax``) and trains a new ``Linear(120 -> K)`` head for a
small Latin charset with CTC loss on text lines rendered by ``models._render_line``, whose
true strings are known. The backbone stays frozen: its features are computed once with
onnxruntime, and only the two head ``Constant`` nodes (and the output's last dimension) are
rewritten, so every backbone tensor keeps its bytes and its place in the file.

Version A is the head trained on the first 60% of the training lines; version B is A's head
trained further on all of them, as a user retrains and ships again. Both are checked with
onnxruntime and scored by character accuracy on held-out lines.

Lines are rendered 400 px wide rather than models.ocr_lines' 320: the longest three-word
line is 387 px, and a line cut at the edge would carry a label the image does not show.
"""

from __future__ import annotations

import hashlib
import string
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import benchmarks.shared.models as models
from edgesdk.errors import DataError, ModelFormatError

#: The new head's classes: index 0 is the CTC blank, then these characters in order.
CHARSET = string.digits + string.ascii_letters + " .,:;-/#%()"
FEATURES = "transpose_51.tmp_0"
HEAD_WEIGHT, HEAD_BIAS = "linear_85.w_0", "linear_85.b_0"
LINE_HEIGHT, LINE_WIDTH = 48, 400
#: Held-out lines each finished model runs on end to end (its output must equal the head on the features).
CHECKED_LINES = 16


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def render_lines(n: int, seed: int) -> tuple[np.ndarray, list[str]]:
    """``n`` text lines as NCHW float32 (PP-OCR normalisation) and their true strings."""
    rng = np.random.default_rng(seed)
    photos = models.photographs()
    images, texts = [], []
    for _ in range(n):
        image, text = models._render_line(rng, photos, LINE_HEIGHT, LINE_WIDTH)
        images.append(((image.astype(np.float32) / 255 - 0.5) / 0.5).transpose(2, 0, 1))
        texts.append(text)
    return np.stack(images).astype(np.float32), texts


def _features_and_reference(pretrained: Path, lines: np.ndarray, batch: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """The frozen backbone's (N, T, 120) features and the pretrained head's greedy class ids (N, T)."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(pretrained))
    model.graph.output.append(onnx.helper.make_tensor_value_info(FEATURES, onnx.TensorProto.FLOAT, None))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    features, best = [], []
    for start in range(0, len(lines), batch):
        probabilities, feature = session.run(None, {"x": lines[start:start + batch]})
        features.append(feature)
        best.append(probabilities.argmax(axis=-1))
    return np.concatenate(features), np.concatenate(best)


def _targets(texts: list[str]) -> tuple[list[int], list[int]]:
    index = {c: i + 1 for i, c in enumerate(CHARSET)}
    missing = sorted({c for t in texts for c in t} - set(index))
    if missing:
        raise DataError(f"training strings contain {missing}, which the new head's charset {CHARSET!r} lacks: "
                        "add them to CHARSET or drop those lines")
    flat = [index[c] for t in texts for c in t]
    return flat, [len(t) for t in texts]


def train_head(features: np.ndarray, texts: list[str], epochs: int, seed: int,
               start: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A CTC-trained head for ``CHARSET`` on frozen features: MatMul weight (120, K) and bias (K,).

    ``start`` continues from an earlier head (weight, bias); otherwise the head starts fresh.
    Mini-batches of 32 lines, Adam, fixed seed: the same inputs give the same bytes.
    """
    import torch

    threads = torch.get_num_threads()
    # One thread: these steps are too small to share, and idle OpenMP workers spinning on this
    # 2-core host slow training 4x and the onnxruntime sessions that follow.
    torch.set_num_threads(1)
    try:
        return _train(torch, features, texts, epochs, seed, start)
    finally:
        torch.set_num_threads(threads)


def _train(torch: Any, features: np.ndarray, texts: list[str], epochs: int, seed: int,
           start: tuple[np.ndarray, np.ndarray] | None) -> tuple[np.ndarray, np.ndarray]:
    torch.manual_seed(seed)
    classes = len(CHARSET) + 1
    head = torch.nn.Linear(features.shape[-1], classes)
    if start is not None:
        with torch.no_grad():
            head.weight.copy_(torch.from_numpy(start[0].T.copy()))
            head.bias.copy_(torch.from_numpy(start[1].copy()))
    optimizer = torch.optim.Adam(head.parameters(), lr=3e-3)
    ctc = torch.nn.CTCLoss(blank=0, zero_infinity=True)
    x = torch.from_numpy(features)
    order = np.random.default_rng(seed)
    for _ in range(epochs):
        for batch in np.array_split(order.permutation(len(texts)), max(1, len(texts) // 32)):
            flat, lengths = _targets([texts[i] for i in batch])
            log_probs = torch.log_softmax(head(x[batch]), dim=-1).transpose(0, 1)  # (T, N, K) as CTCLoss wants
            loss = ctc(log_probs, torch.tensor(flat), torch.full((len(batch),), log_probs.shape[0], dtype=torch.long),
                       torch.tensor(lengths))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        return head.weight.numpy().T.astype(np.float32).copy(), head.bias.numpy().astype(np.float32).copy()


def write_with_head(pretrained: Path, weight: np.ndarray, bias: np.ndarray, target: Path) -> Path:
    """The pretrained model with only its head constants (and output's last dimension) replaced, saved to ``target``."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(pretrained))
    replaced = {HEAD_WEIGHT: weight, HEAD_BIAS: bias}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output[0] in replaced:
            node.attribute[0].t.CopyFrom(numpy_helper.from_array(replaced.pop(node.output[0]), node.output[0]))
    if replaced:
        raise ModelFormatError(f"{pretrained} has no Constant node for {sorted(replaced)}: pass the PP-OCRv4 recognizer "
                               "of models.fetch('ocr_rec'), whose head these names are")
    model.graph.output[0].type.tensor_type.shape.dim[-1].Clear()
    model.graph.output[0].type.tensor_type.shape.dim[-1].dim_value = weight.shape[1]
    onnx.checker.check_model(model)
    target.write_bytes(model.SerializeToString())
    return target


def backbone_unchanged(pretrained: Path, edited: Path) -> bool:
    """Whether ``edited`` has the pretrained model's nodes, in order, byte for byte, except the two head constants."""
    import onnx

    before, after = onnx.load(str(pretrained)).graph.node, onnx.load(str(edited)).graph.node
    return len(before) == len(after) and all(
        a.SerializeToString() == b.SerializeToString()
        for a, b in zip(before, after) if a.output[0] not in (HEAD_WEIGHT, HEAD_BIAS))


def _decode(best: np.ndarray, alphabet: list[str]) -> list[str]:
    """Greedy CTC decoding of per-frame class ids (N, T): merge repeats, drop blanks (index 0)."""
    decoded = []
    for row in best:
        keep = np.concatenate([[True], row[1:] != row[:-1]]) & (row != 0)
        decoded.append("".join(alphabet[i] for i in row[keep]))
    return decoded


def char_accuracy(predicted: list[str], truth: list[str]) -> float:
    """1 - total character edit distance / total true length, over all lines."""
    distance = sum(models._edit_distance([ord(c) for c in p], [ord(c) for c in t]) for p, t in zip(predicted, truth))
    return 1 - distance / sum(len(t) for t in truth)


def run_head(model: Path, lines: np.ndarray, batch: int = 16) -> np.ndarray:
    """The model's (N, T, K) output on ``lines`` with onnxruntime."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, {"x": lines[i:i + batch]})[0] for i in range(0, len(lines), batch)])


def _softmax(logits: np.ndarray) -> np.ndarray:
    exp = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return exp / exp.sum(axis=-1, keepdims=True)


def _pretrained_alphabet(pretrained: Path) -> list[str]:
    import onnx

    meta = {p.key: p.value for p in onnx.load(str(pretrained), load_external_data=False).metadata_props}
    return ["", *meta["character"].split("\n"), " "]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def head_retrain_pair(workdir: Path, quick: bool = False) -> tuple[Path, Path, dict[str, Any]]:
    """Two shippable versions of PP-OCRv4 with a retrained Latin head: (model A, model B, figures).

    Figures: charset, line counts, epochs, held-out character accuracy of A, B and the pretrained
    6625-class head (on the same lines), sizes, bytes differing between A and B, SHA-256s, wall
    seconds and CPU seconds per stage (the host's load does not change those much).
    """
    started = time.perf_counter()
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    train, held_out = (240, 60) if quick else (1500, 300)
    epochs_a, epochs_b = (30, 15) if quick else (10, 20)
    stages: dict[str, float] = {}
    clock = time.process_time()

    def stage(name: str) -> None:
        nonlocal clock
        stages[name], clock = round(time.process_time() - clock, 1), time.process_time()

    pretrained = models.fetch("ocr_rec")
    lines, texts = render_lines(train + held_out, seed=13)
    stage("render")
    features, reference_best = _features_and_reference(pretrained, lines)
    stage("backbone")
    first = int(train * 0.6)
    head_a = train_head(features[:first], texts[:first], epochs_a, seed=1)
    head_b = train_head(features[:train], texts[:train], epochs_b, seed=2, start=head_a)
    stage("train")
    model_a = write_with_head(pretrained, *head_a, workdir / "ocr_rec_latin_a.onnx")
    model_b = write_with_head(pretrained, *head_b, workdir / "ocr_rec_latin_b.onnx")

    alphabet = ["", *CHARSET]
    held_features, truth = features[train:], texts[train:]
    accuracy = {}
    for name, model, (weight, bias) in (("a", model_a, head_a), ("b", model_b, head_b)):
        if not backbone_unchanged(pretrained, model):
            raise RuntimeError(f"{model}: a backbone node changed; only {HEAD_WEIGHT} and {HEAD_BIAS} may differ")
        # The whole model runs on a sample of held-out lines and must match the head applied to the
        # backbone's features; accuracy then uses the features of every held-out line (no second pass).
        output = run_head(model, lines[train:train + CHECKED_LINES])
        expected = _softmax(held_features[:CHECKED_LINES] @ weight + bias)
        if output.shape != expected.shape or not np.allclose(output, expected, atol=1e-4):
            raise RuntimeError(f"{model}: output {output.shape} is not the new head's (N, T, {len(alphabet)}) probabilities")
        accuracy[name] = char_accuracy(_decode((held_features @ weight + bias).argmax(-1), alphabet), truth)
    stage("check")
    pretrained_accuracy = char_accuracy(_decode(reference_best[train:], _pretrained_alphabet(pretrained)), truth)

    a_bytes, b_bytes = model_a.read_bytes(), model_b.read_bytes()
    common = min(len(a_bytes), len(b_bytes))
    differing = int(np.count_nonzero(np.frombuffer(a_bytes[:common], np.uint8) != np.frombuffer(b_bytes[:common], np.uint8)))
    differing += abs(len(a_bytes) - len(b_bytes))
    figures = {
        "charset": CHARSET, "classes": len(alphabet), "train_lines": train, "train_lines_a": first,
        "held_out_lines": held_out, "line_shape": [3, LINE_HEIGHT, LINE_WIDTH], "epochs_a": epochs_a, "epochs_b": epochs_b,
        "training": "CTC loss on true strings, frozen backbone features, Adam; B continues from A's head",
        "accuracy_a": round(accuracy["a"], 4), "accuracy_b": round(accuracy["b"], 4),
        "accuracy_pretrained_head": round(pretrained_accuracy, 4),
        "size_a": len(a_bytes), "size_b": len(b_bytes), "pretrained_size": pretrained.stat().st_size,
        "bytes_differing": differing, "sha256_a": _sha256(model_a), "sha256_b": _sha256(model_b),
        "seconds": round(time.perf_counter() - started, 1), "cpu_seconds_by_stage": stages,
    }
    _log(f"head retrain: A {len(a_bytes)} bytes (accuracy {accuracy['a']:.3f}), B {len(b_bytes)} bytes "
         f"(accuracy {accuracy['b']:.3f}), pretrained head {pretrained_accuracy:.3f}; {differing} bytes differ; "
         f"{figures['seconds']} s")
    return model_a, model_b, figures
