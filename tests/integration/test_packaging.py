"""The built wheel: namespace mapping, shipped data, and a light base install."""

from __future__ import annotations

import json
import re
import subprocess
import zipfile
from pathlib import Path

import pytest

from tests.wheelhouse import device_venv as wheelhouse_venv
from tests.wheelhouse import project_wheel

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel_path(tmp_path_factory) -> Path:
    return project_wheel(tmp_path_factory)


@pytest.fixture(scope="module")
def wheel(wheel_path) -> zipfile.ZipFile:
    return zipfile.ZipFile(wheel_path)


@pytest.fixture(scope="module")
def device_venv(tmp_path_factory) -> Path:
    """A fresh venv with the wheel's base install only, offline from the run's wheelhouse (tests/wheelhouse.py)."""
    return wheelhouse_venv(tmp_path_factory)


def test_folders_land_inside_the_edgesdk_namespace(wheel):
    names = wheel.namelist()
    for expected in ("edgesdk/converters/__init__.py", "edgesdk/ota_server/__init__.py", "edgesdk/py.typed",
                     "edgesdk/device_profiles/rk3588.yaml", "edgesdk/device_profiles/raspberry-pi-5.yaml",
                     "edgesdk/runtime/backends/litert.py", "edgesdk/cli/bench.py"):
        assert expected in names, expected
    top_level = {n.split("/")[0] for n in names if not n.startswith("edgesdk-")}
    assert top_level == {"edgesdk"}, top_level


def test_every_source_module_is_in_the_wheel(wheel):
    """pyproject lists packages one by one: a new package left out of it would be missing on devices."""
    names = set(wheel.namelist())
    mapping = {"edgesdk": "edgesdk", "converters": "edgesdk/converters", "ota_server": "edgesdk/ota_server"}
    missing = [str(path) for folder, installed in mapping.items() for path in (ROOT / folder).rglob("*.py")
               if f"{installed}/{path.relative_to(ROOT / folder).as_posix()}" not in names]
    assert not missing, f"not in the wheel (add their packages to pyproject's packages list): {missing}"


def test_base_requirements_are_light(wheel):
    metadata = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    requires = [line.split(":", 1)[1].strip() for line in wheel.read(metadata).decode().splitlines()
                if line.startswith("Requires-Dist:")]
    base = [r for r in requires if "extra ==" not in r]
    base_names = {re.split(r"[<>=;\[ ]", r, maxsplit=1)[0].lower() for r in base}
    # Exactly the light device-side set: no TensorFlow, onnx2tf, torch, OpenCV or web framework.
    assert base_names == {"numpy", "onnxruntime", "paho-mqtt", "click", "pyyaml", "cryptography", "ai-edge-litert",
                          "zstandard"}
    extras = {line.split(":", 1)[1].strip() for line in wheel.read(metadata).decode().splitlines()
              if line.startswith("Provides-Extra:")}
    assert extras == {"convert", "server", "vision", "docs", "dev", "all"}


def test_sources_import_the_mapped_folders_through_the_edgesdk_namespace():
    # `converters` and `ota_server` exist only as edgesdk.converters / edgesdk.ota_server once installed.
    offenders = []
    for path in ROOT.glob("**/*.py"):
        if ".venv" in path.parts or "build" in path.parts:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.match(r"\s*(from|import)\s+(converters|ota_server|device_profiles)\b", line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, offenders


def test_the_base_install_runs_a_model_and_carries_none_of_the_wings_dependencies(device_venv, tmp_path):
    from edgesdk.testing import write_sample

    write_sample(tmp_path)
    version = subprocess.run([str(device_venv / "bin" / "edgesdk"), "--version"], capture_output=True, text=True,
                             timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("edgesdk, version"), version.stderr
    probe = f"""
import importlib.util, json
import numpy as np
from edgesdk import Runtime
with Runtime({str(tmp_path / "model.onnx")!r}, profile="generic-x86_64") as rt:
    out = rt.predict(np.load({str(tmp_path / "eval.npy")!r})[:1])
heavy = ["onnx", "onnxslim", "tensorflow", "onnx2tf", "torch", "cv2", "starlette", "uvicorn", "psycopg", "amqtt"]
print(json.dumps({{"shape": list(out.shape), "backend": rt.info.backend,
                  "present": [m for m in heavy if importlib.util.find_spec(m) is not None]}}))
"""
    result = subprocess.run([str(device_venv / "bin" / "python"), "-c", probe], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["shape"] == [1, 10] and found["backend"] == "onnxruntime"
    # The converter and server modules ship in the one distribution but import their libraries lazily: on a
    # device none of those libraries is installed, so neither wing can run there.
    assert found["present"] == [], found
    convert = subprocess.run([str(device_venv / "bin" / "edgesdk"), "convert", str(tmp_path / "model.onnx"),
                              "--profile", "raspberry-pi-5", "--eval", str(tmp_path / "eval.npy"), "--out",
                              str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert convert.returncode == 12, convert.stderr  # ConversionError, saying which extra to install
    assert "converting needs the [convert] extra: pip install 'edgesdk[convert]'" in convert.stderr
