"""Third-party output is held for a step: dropped on success, in the error on failure, let through when verbose."""

from __future__ import annotations

import logging
import os

import pytest

from edgesdk.converters.quiet import held_output, warnings_once
from edgesdk.errors import ConversionError


def _noisy_step() -> None:
    os.write(2, b"INFO: native noise on fd 2\n")  # what C++ libraries (LiteRT) do
    print("python noise on stdout")
    logging.getLogger("onnxruntime.quantization").warning("library advice")
    logging.getLogger("edgesdk.test").warning("edgesdk's own warning")


def test_a_step_that_succeeds_drops_the_noise_and_keeps_edgesdk_warnings(capfd, caplog, monkeypatch):
    monkeypatch.delenv("EDGESDK_VERBOSE", raising=False)
    with held_output("a step"):
        _noisy_step()
    out, err = capfd.readouterr()
    assert "noise" not in out + err
    assert [r.getMessage() for r in caplog.records] == ["edgesdk's own warning"]


def test_a_step_that_fails_carries_the_tail_in_its_error(capfd, monkeypatch):
    monkeypatch.delenv("EDGESDK_VERBOSE", raising=False)
    with pytest.raises(ConversionError) as info, held_output("the quantizer"):
        _noisy_step()
        raise ConversionError("quantization failed")
    message = str(info.value)
    assert message.startswith("quantization failed\n  the quantizer printed (last lines):")
    for line in ("INFO: native noise on fd 2", "python noise on stdout", "library advice"):
        assert line in message
    assert "noise" not in "".join(capfd.readouterr())


def test_verbose_lets_everything_through(capfd, monkeypatch):
    monkeypatch.setenv("EDGESDK_VERBOSE", "1")
    with held_output("a step"):
        _noisy_step()
    out, err = capfd.readouterr()
    assert "python noise on stdout" in out and "INFO: native noise on fd 2" in err


def test_repeated_warnings_show_once(caplog, monkeypatch):
    monkeypatch.delenv("EDGESDK_VERBOSE", raising=False)
    log = logging.getLogger("edgesdk.test")
    with warnings_once():
        for _ in range(3):
            log.warning("profile cores [2, 3] are not usable on this host")
        log.warning("another")
    assert [r.getMessage() for r in caplog.records] == ["profile cores [2, 3] are not usable on this host", "another"]


def test_a_conversion_keeps_this_hosts_core_and_gpu_provider_notes_off_its_terminal(caplog, monkeypatch):
    """Converting for a Jetson on a host without its GPU: the runtime's notes about this host are dropped, not
    another logger's warning with the same words."""
    monkeypatch.delenv("EDGESDK_VERBOSE", raising=False)
    with warnings_once():
        logging.getLogger("edgesdk.runtime.runtime").warning("scheduling: profile cores [2, 3] are not usable")
        logging.getLogger("edgesdk.runtime.backends.onnxruntime").warning(
            "onnxruntime fallback: TensorrtExecutionProvider for ampere-gpu is not in this onnxruntime build")
        logging.getLogger("edgesdk.runtime.backends.litert").warning("LiteRT fallback: no GPU delegate")
        logging.getLogger("edgesdk.test").warning("onnxruntime fallback: kept, another logger's")
    assert [r.getMessage() for r in caplog.records] == ["onnxruntime fallback: kept, another logger's"]
