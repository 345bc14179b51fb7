"""Which LiteRT package is used, and what is said when the only one present is broken."""

import sys

import pytest

from edgesdk.errors import BackendError
from edgesdk.runtime.backends.litert import LITERT_CANDIDATES, import_litert


def test_ai_edge_litert_is_found_first():
    found = import_litert()
    assert found.distribution == "ai-edge-litert"
    assert found.version != "unknown"


@pytest.fixture
def broken_tflite_runtime(tmp_path, monkeypatch):
    """A tflite_runtime that fails to import the way the 2.14 wheel does under numpy 2."""
    package = tmp_path / "tflite_runtime"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "interpreter.py").write_text(
        "raise ImportError('numpy.core.multiarray failed to import "
        "(module compiled against ABI version 0x1000009 but this version of numpy is 0x2000000)')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in [m for m in sys.modules if m.startswith("tflite_runtime")]:
        del sys.modules[name]


def test_unusable_tflite_runtime_is_named_with_the_fix(broken_tflite_runtime):
    with pytest.raises(BackendError) as info:
        import_litert([("tflite_runtime.interpreter", "tflite-runtime")])
    message = str(info.value)
    assert "tflite-runtime is installed but cannot be imported under numpy" in message
    assert "ABI version" in message
    assert "pip install ai-edge-litert" in message


def test_nothing_installed_says_what_to_install():
    with pytest.raises(BackendError, match="none of ai-edge-litert.*pip install ai-edge-litert"):
        import_litert([("edgesdk_no_such_litert.interpreter", "no-such-litert")])


def test_fallback_order_is_litert_then_tflite_runtime_then_tensorflow():
    assert [d for _, d in LITERT_CANDIDATES] == ["ai-edge-litert", "tflite-runtime", "tensorflow"]
