"""Structured logs: ``edgesdk --log-format json`` (or EDGESDK_LOG_FORMAT=json) writes one JSON object per line."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from edgesdk.errors import EdgeSDKError
from edgesdk.logs import JsonFormatter, configure, log_format_from_env

EDGESDK = str(Path(sys.executable).with_name("edgesdk"))
ISO_UTC_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def record(message: str, *args: object, exc_info: object = None, **extra: object) -> logging.LogRecord:
    made = logging.getLogger("edgesdk.test").makeRecord("edgesdk.test", logging.WARNING, __file__, 1, message, args,
                                                         exc_info)
    made.__dict__.update(extra)
    return made


def test_a_record_becomes_one_json_line_with_the_documented_fields():
    line = JsonFormatter().format(record("rollout %s: stage %d sent\nnext line", "r1", 2))
    assert "\n" not in line
    data = json.loads(line)
    assert data == {"ts": data["ts"], "level": "WARNING", "logger": "edgesdk.test",
                    "message": "rollout r1: stage 2 sent\nnext line"}
    assert ISO_UTC_MS.match(data["ts"]), data["ts"]
    assert datetime.fromisoformat(data["ts"].replace("Z", "+00:00")).utcoffset().total_seconds() == 0


def test_a_traceback_goes_in_exc():
    try:
        raise ValueError("bad chunk 7")
    except ValueError:
        data = json.loads(JsonFormatter().format(record("transfer failed", exc_info=sys.exc_info())))
    assert data["message"] == "transfer failed"
    assert data["exc"].startswith("Traceback (most recent call last):")
    assert data["exc"].rstrip().endswith("ValueError: bad chunk 7")


def test_extra_fields_are_kept_when_they_are_json():
    made = record("device reported", device="cam-1", stage=0, took_s=0.25, tags=["a", "b"], handle=object(),
                  level="shadow", ratio=float("nan"))
    data = json.loads(JsonFormatter().format(made))
    assert {k: data[k] for k in ("device", "stage", "took_s", "tags")} == {
        "device": "cam-1", "stage": 0, "took_s": 0.25, "tags": ["a", "b"]}
    assert "handle" not in data and "ratio" not in data, "not JSON: left out, the line stays valid"
    assert data["level"] == "WARNING", "an extra cannot overwrite a documented field"


def test_the_cli_error_line_is_json_too(tmp_path):
    done = subprocess.run([EDGESDK, "--log-format", "json", "verify", str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 15  # BundleError
    lines = done.stderr.splitlines()
    assert lines and all(json.loads(line) for line in lines), done.stderr
    error = json.loads(lines[-1])
    assert error["level"] == "ERROR" and error["logger"] == "edgesdk.cli" and error["exit_code"] == 15
    assert "is not a bundle" in error["message"]


def test_the_environment_variable_turns_json_on_for_a_command_that_logs(tmp_path):
    from edgesdk.testing import random_mlp, write_mlp_onnx

    model = write_mlp_onnx(random_mlp([8, 4]), tmp_path / "tiny.onnx")
    env = {**os.environ, "EDGESDK_LOG_FORMAT": "json"}
    env.pop("EDGESDK_VERBOSE", None)
    done = subprocess.run([EDGESDK, "bench", str(model), "--profile", "raspberry-pi-5", "--accelerator", "npu",
                           "--runs", "2", "--warmup", "0", "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    # click's progress bar prints its label on stderr (it is not a log); every other line is a JSON log record.
    records = [json.loads(line) for line in done.stderr.splitlines() if line != "benchmarking"]
    fallback = [r for r in records if r["message"].startswith("accelerator fallback")]
    assert fallback and fallback[0]["level"] == "WARNING" and fallback[0]["logger"] == "edgesdk.runtime.runtime"


def test_a_service_configuring_again_keeps_json():
    # What `edgesdk server` does: the group configures from --log-format, the command again with its info loggers.
    script = """
import logging
from edgesdk.logs import configure
configure(False, log_format="json")
configure(info_loggers=("edgesdk.ota_server",))
logging.getLogger("edgesdk.ota_server.rollouts.engine").info("rollout %s started", "r1", extra={"rollout": "r1"})
try:
    1 / 0
except ZeroDivisionError:
    logging.getLogger("edgesdk.ota_server.server").exception("handling a state message failed")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "EDGESDK_LOG_FORMAT"})
    assert done.returncode == 0, done.stderr
    first, second = (json.loads(line) for line in done.stderr.splitlines())
    assert (first["level"], first["message"], first["rollout"]) == ("INFO", "rollout r1 started", "r1")
    assert second["level"] == "ERROR" and "ZeroDivisionError" in second["exc"]


def test_an_unknown_format_names_the_value_and_the_choices(monkeypatch):
    with pytest.raises(EdgeSDKError, match=r"log format 'xml' is not one of text, json"):
        configure(log_format="xml")
    monkeypatch.setenv("EDGESDK_LOG_FORMAT", "yaml")
    with pytest.raises(EdgeSDKError, match=r"EDGESDK_LOG_FORMAT='yaml' is not a log format; set it to text or json"):
        log_format_from_env()
