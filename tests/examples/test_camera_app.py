"""examples/camera_app.py runs headless on its own clip: every frame read, classified or dropped, labels right."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "camera_app.py"


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("camera")
    subprocess.run([sys.executable, str(EXAMPLE), "make-demo", str(out)], check=True, capture_output=True, timeout=300)
    return out


def test_the_clip_is_classified_headless_into_json_lines_and_an_annotated_video(demo, tmp_path):
    import cv2

    results, video = tmp_path / "results.jsonl", tmp_path / "annotated.mp4"
    run = subprocess.run([sys.executable, str(EXAMPLE), "run", "--source", str(demo / "clip.mp4"), "--model",
                          str(demo / "bundle"), "--headless", "--json", str(results), "--out", str(video),
                          "--profile", "generic-x86_64"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    summary = lines[-1]["summary"]
    frames = [line for line in lines[:-1]]
    labels = json.loads((demo / "clip-labels.json").read_text())
    assert summary["frames"] == len(labels) == 120
    assert summary["classified"] == len(frames) and summary["classified"] + summary["dropped"] == summary["frames"]
    assert len(frames) >= 10, f"only {len(frames)} of 120 frames were classified"
    right = sum(str(labels[f["frame"]]) == f["label"] for f in frames)
    assert right >= 0.9 * len(frames), f"{right} of {len(frames)} frames labelled right"
    assert {f["version"] for f in frames} == {"1.0.0"}
    assert summary["stats"]["count"] == len(frames)
    capture = cv2.VideoCapture(str(video))
    assert int(capture.get(cv2.CAP_PROP_FRAME_COUNT)) == 120
    capture.release()


def test_a_source_that_cannot_be_opened_says_what_to_give(demo):
    run = subprocess.run([sys.executable, str(EXAMPLE), "run", "--source", "/nonexistent.mp4", "--model",
                          str(demo / "bundle"), "--headless"], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "cannot open video source '/nonexistent.mp4'" in run.stderr
