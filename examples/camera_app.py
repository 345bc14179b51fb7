"""Camera example: classify frames from a camera, a file or an RTSP stream, with a model that updates itself.

Frames are submitted asynchronously (``predict_async``); when the model falls behind, new
frames are dropped, not queued, so results stay fresh. With an offload endpoint configured,
frames the device cannot serve in time go to the cloud instead of being dropped. The
bundle's manifest says how a frame becomes model input (``edgesdk.runtime.preprocess``). The model is
a bundle directory, or the store of an agent running beside the app (``--follow``): then the
app switches to each version the agent commits.

    python examples/camera_app.py make-demo demo         # demo/bundle (a digits classifier) + demo/clip.mp4
    python examples/camera_app.py run --source demo/clip.mp4 --model demo/bundle --headless \\
        --json demo/results.jsonl --out demo/annotated.mp4
    python examples/camera_app.py run --source 0 --follow /var/lib/edgesdk/store     # camera 0, with a window

Needs the ``[vision]`` extra (OpenCV); ``make-demo`` also needs ``[dev]`` (scikit-learn, onnx).
JSON lines: one object per classified frame (``frame``, ``time``, ``label``, ``score``,
``latency_ms``, ``version``), then ``{"summary": {...}}`` with frames read, classified and
dropped, and the fps.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections import deque
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

DIGIT_PIXELS = 240  # side of the demo clip's frames


# --- the demo model and clip --------------------------------------------------------------------
def make_demo(out: Path, frames_per_digit: int = 6, fps: float = 15.0) -> tuple[Path, Path]:
    """A digits classifier taking 8x8 gray images as a bundle, and a clip of handwritten digits it can read."""
    import cv2
    import onnx
    from onnx import TensorProto, helper

    from edgesdk.runtime.bundle import BundleSpec
    from edgesdk.runtime.bundling import bundle_from_model
    from edgesdk.testing import load_digits_data, train_digits_mlp, write_mlp_onnx

    out.mkdir(parents=True, exist_ok=True)
    data = load_digits_data()
    flat = write_mlp_onnx(train_digits_mlp(data), out / "digits-flat.onnx")
    # The same MLP behind an image input [N, 1, 8, 8], so a camera frame can feed it.
    model = onnx.load(str(flat))
    graph = model.graph
    graph.input[0].CopyFrom(helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 1, 8, 8]))
    graph.initializer.append(helper.make_tensor("flat_shape", TensorProto.INT64, [2], [-1, 64]))
    graph.node.insert(0, helper.make_node("Reshape", ["image", "flat_shape"], ["input"]))
    onnx.save(model, str(out / "digits-image.onnx"))
    spec = BundleSpec("digits-camera", "1.0.0", "onnx-fp32", "generic-x86_64", "latency",
                      preprocessing={"color": "GRAY", "scale": 1 / 255, "mean": [0.0], "std": [1.0],
                                     "labels": [str(d) for d in range(10)]})
    sample = data.x_test[:1].reshape(1, 1, 8, 8)
    bundle_from_model(out / "bundle", out / "digits-image.onnx", spec, {"image": sample})
    clip = out / "clip.mp4"
    writer = cv2.VideoWriter(str(clip), cv2.VideoWriter_fourcc(*"mp4v"), fps, (DIGIT_PIXELS, DIGIT_PIXELS))
    rng = np.random.default_rng(0)
    labels = []
    for index in range(20):
        digit = (data.x_test[index].reshape(8, 8) * 255).astype(np.uint8)
        big = cv2.resize(digit, (DIGIT_PIXELS, DIGIT_PIXELS), interpolation=cv2.INTER_NEAREST)
        for _ in range(frames_per_digit):
            noisy = np.clip(big.astype(np.int16) + rng.integers(-8, 9, big.shape), 0, 255).astype(np.uint8)
            writer.write(cv2.cvtColor(noisy, cv2.COLOR_GRAY2BGR))
            labels.append(int(data.y_test[index]))
    writer.release()
    (out / "clip-labels.json").write_text(json.dumps(labels))
    return out / "bundle", clip


# --- the app ------------------------------------------------------------------------------------
class FrameClassifier:
    """Submits frames without waiting; drops a frame when ``max_inflight`` are still being classified."""

    def __init__(self, runtime: Any, max_inflight: int) -> None:
        from edgesdk.runtime.preprocess import ImagePreprocessing

        self.runtime, self.max_inflight = runtime, max_inflight
        self._prep_for: Any = None
        self._prep = ImagePreprocessing()
        self._lock = threading.Lock()
        self.inflight = 0
        self.dropped = 0
        self.latest: dict[str, Any] | None = None
        self.results: deque[dict[str, Any]] = deque()

    def _preprocessing(self) -> tuple[Any, Any, list[str]]:
        from edgesdk.runtime.preprocess import ImagePreprocessing

        bundle = self.runtime.bundle
        manifest = bundle.manifest if bundle is not None else None
        if manifest is not self._prep_for:  # the model was swapped: its manifest may say otherwise
            self._prep_for = manifest
            self._prep = ImagePreprocessing.from_manifest(manifest.preprocessing if manifest else {})
        labels = list(manifest.preprocessing.get("labels", [])) if manifest else []
        return manifest, self._prep, labels

    def submit(self, index: int, frame: np.ndarray) -> bool:
        """Start classifying ``frame``; False (and counted as dropped) when the model is behind."""
        from edgesdk.errors import OverloadedError
        from edgesdk.runtime.preprocess import image_to_tensor

        with self._lock:
            if self.inflight >= self.max_inflight:
                self.dropped += 1
                return False
            self.inflight += 1
        manifest, prep, labels = self._preprocessing()
        spec = self.runtime.inputs[0]
        started = time.perf_counter()
        try:
            future: Future[Any] = self.runtime.predict_async(image_to_tensor(frame, spec, prep))
        except OverloadedError:  # local queue and cloud both full: drop, as when we are behind
            with self._lock:
                self.inflight -= 1
                self.dropped += 1
            return False
        future.add_done_callback(lambda f: self._done(f, index, started, manifest, labels))
        return True

    def _done(self, future: Future[Any], index: int, started: float, manifest: Any, labels: list[str]) -> None:
        with self._lock:
            self.inflight -= 1
        if future.exception() is not None:
            print(f"frame {index}: {future.exception()}", file=sys.stderr)
            return
        scores = np.asarray(future.result()).reshape(-1)
        best = int(scores.argmax())
        result = {"frame": index, "time": time.time(), "label": labels[best] if best < len(labels) else best,
                  "score": round(float(scores[best]), 4), "latency_ms": round((time.perf_counter() - started) * 1e3, 2),
                  "version": manifest.version if manifest else None}
        with self._lock:
            self.latest = result
            self.results.append(result)

    def drain(self, timeout: float = 30.0) -> None:
        """Wait for the frames still being classified."""
        deadline = time.monotonic() + timeout
        while self.inflight and time.monotonic() < deadline:
            time.sleep(0.01)


def _open_source(source: str) -> Any:
    import cv2

    capture = cv2.VideoCapture(int(source) if source.isdigit() else source)
    if not capture.isOpened():
        raise SystemExit(f"cannot open video source {source!r}: give a camera index (0), a video file or an "
                         "rtsp:// URL that OpenCV can read")
    return capture


def _overlay(frame: np.ndarray, latest: dict[str, Any] | None, fps: float, dropped: int) -> np.ndarray:
    import cv2

    text = f"{latest['label']} ({latest['score']:.2f})" if latest else "..."
    cv2.putText(frame, text, (8, 28), cv2.FONT_HERSHEY_SIMPLEX, 0.8, (0, 255, 0), 2)
    cv2.putText(frame, f"{fps:.1f} fps, {dropped} dropped", (8, frame.shape[0] - 10), cv2.FONT_HERSHEY_SIMPLEX, 0.5,
                (0, 255, 255), 1)
    return frame


def _open_runtime(args: argparse.Namespace) -> Any:
    from edgesdk import ManagedRuntime, OffloadPolicy

    options: dict[str, Any] = {"profile": args.profile}
    if args.offload_url:
        options["offload"] = OffloadPolicy(url=args.offload_url, model=args.offload_model or "",
                                           latency_slo_ms=args.slo_ms)
    if args.follow:
        return ManagedRuntime.follow(args.follow, **options)
    return ManagedRuntime(args.model, **options)


def run(args: argparse.Namespace) -> int:
    """Read frames, classify them asynchronously, overlay the latest result and fps; write or show them."""
    import cv2

    capture = _open_source(args.source)
    headless = args.headless or not os.environ.get("DISPLAY")
    results = open(args.json, "w") if args.json else None  # noqa: SIM115 (closed below, after the loop)
    writer = None
    runtime = _open_runtime(args)
    classifier = FrameClassifier(runtime, args.max_inflight)
    started, index, written = time.perf_counter(), 0, 0
    try:
        while args.max_frames is None or index < args.max_frames:
            ok, frame = capture.read()
            if not ok:
                break
            classifier.submit(index, frame)
            index += 1
            fps = index / max(time.perf_counter() - started, 1e-9)
            annotated = _overlay(frame, classifier.latest, fps, classifier.dropped)
            if args.out:
                if writer is None:
                    height, width = annotated.shape[:2]
                    writer = cv2.VideoWriter(args.out, cv2.VideoWriter_fourcc(*"mp4v"), args.out_fps, (width, height))
                writer.write(annotated)
                written += 1
            if not headless:
                cv2.imshow("edgesdk camera", annotated)
                if cv2.waitKey(1) & 0xFF == ord("q"):
                    break
            while results is not None and classifier.results:
                results.write(json.dumps(classifier.results.popleft()) + "\n")
        classifier.drain()
        elapsed = time.perf_counter() - started
        summary = {"frames": index, "classified": index - classifier.dropped, "dropped": classifier.dropped,
                   "fps": round(index / max(elapsed, 1e-9), 2), "written": written,
                   "stats": runtime.stats().as_dict() if hasattr(runtime, "stats") else None}
        if results is not None:
            while classifier.results:
                results.write(json.dumps(classifier.results.popleft()) + "\n")
            results.write(json.dumps({"summary": summary}) + "\n")
        print(json.dumps(summary), file=sys.stderr)
    finally:
        capture.release()
        if writer is not None:
            writer.release()
        if results is not None:
            results.close()
        runtime.close()
    return 0


def main() -> int:
    """``make-demo`` or ``run`` (see the module doc)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("make-demo", help="write a demo bundle and clip")
    demo.add_argument("out", type=Path)
    run_cmd = commands.add_parser("run", help="classify frames from a camera, file or stream")
    run_cmd.add_argument("--source", default="0", help="camera index, video file or rtsp:// URL")
    model = run_cmd.add_mutually_exclusive_group(required=True)
    model.add_argument("--model", help="a bundle directory")
    model.add_argument("--follow", help="an agent's store: run what it committed, switch when it commits another")
    run_cmd.add_argument("--profile", default=None, help="device profile (default: detect this board)")
    run_cmd.add_argument("--headless", action="store_true", help="no window (also when $DISPLAY is unset)")
    run_cmd.add_argument("--out", help="write the annotated video here (.mp4)")
    run_cmd.add_argument("--out-fps", type=float, default=15.0)
    run_cmd.add_argument("--json", help="write one JSON line per classified frame here")
    run_cmd.add_argument("--max-frames", type=int, default=None)
    run_cmd.add_argument("--max-inflight", type=int, default=2, help="frames classified at once before dropping")
    run_cmd.add_argument("--offload-url", help="a KServe V2 endpoint for frames the device cannot serve in time")
    run_cmd.add_argument("--offload-model", help="the model's name on that endpoint")
    run_cmd.add_argument("--slo-ms", type=float, default=100.0, help="latency objective that triggers offload")
    args = parser.parse_args()
    if args.command == "make-demo":
        bundle, clip = make_demo(args.out)
        print(f"wrote {bundle} and {clip}", file=sys.stderr)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
