"""The command line, through click's CliRunner and, for start-up cost, a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml
from click.testing import CliRunner

from edgesdk.cli import cli
from tests.conftest import BOARDS, host_profile_dict


def _run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_version():
    result = _run("--version")
    assert result.exit_code == 0 and "edgesdk, version 0.1.0" in result.output


def test_help_does_not_import_numpy_or_backends():
    code = (
        "import sys\n"
        "from edgesdk.cli import cli\n"
        "try:\n    cli(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
        "heavy = [m for m in ('numpy', 'onnxruntime', 'ai_edge_litert', 'yaml') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "bench" in done.stdout and "profile" in done.stdout


def test_profile_list_shows_every_shipped_board():
    result = _run("profile", "list")
    assert result.exit_code == 0
    for name in ("raspberry-pi-4", "raspberry-pi-5", "jetson-nano", "jetson-orin-nano", "rk3588", "generic-x86_64"):
        assert name in result.output


def test_profile_show_json_round_trips():
    result = _run("profile", "show", "rk3588", "--json")
    data = json.loads(result.output)
    assert {c["name"] for c in data["cpu"]["clusters"]} == {"little", "big"}


def test_profile_detect_on_a_recorded_rk3588_tree():
    result = _run("profile", "detect", "--root", str(BOARDS / "rk3588"), "--json")
    assert result.exit_code == 0
    data = json.loads(result.output)
    assert data["profile"]["name"] == "rk3588"
    assert len(data["topology"]["cpus"]) == 8


def test_user_profile_dir_is_listed(tmp_path):
    (tmp_path / "my-board.yaml").write_text(yaml.safe_dump({**host_profile_dict([0], [1]), "name": "my-board"}))
    result = _run("profile", "list", "--profile-dir", str(tmp_path))
    assert "my-board" in result.output


def test_bench_json_reports_percentiles_backend_and_memory(digits_tflite):
    result = CliRunner().invoke(cli, ["bench", str(digits_tflite), "--profile", "generic-x86_64", "--runs", "30",
                                      "--warmup", "2", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["runs"] == 30
    assert 0 < data["p50_ms"] <= data["p95_ms"] <= data["p99_ms"] <= data["max_ms"]
    assert data["throughput_per_s"] > 0 and data["peak_rss_mb"] > 10
    assert data["info"]["backend"] == "litert" and data["info"]["accelerator"] == "xnnpack"


def test_bench_table(digits_onnx):
    result = _run("bench", str(digits_onnx), "--profile", "generic-x86_64", "--runs", "10", "--mode", "power")
    assert result.exit_code == 0
    assert "latency p50 / p95 / p99" in result.output and "onnxruntime" in result.output


def test_library_errors_print_a_message_and_exit_code_without_traceback(tmp_path):
    bad = tmp_path / "model.tflite"
    bad.write_bytes(b"not a model at all")
    result = CliRunner().invoke(cli, ["bench", str(bad), "--profile", "generic-x86_64"])
    assert result.exit_code == 4  # ModelFormatError.exit_code
    assert "error:" in result.output and "no TFLite identifier" in result.output
    assert "Traceback" not in result.output
    unknown = CliRunner().invoke(cli, ["profile", "show", "no-such-board"])
    assert unknown.exit_code == 3 and "known profiles" in unknown.output
