"""Session-wide fixtures: small real models trained or built once per test session."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from edgesdk.runtime.profiles import DeviceProfile, profile_from_dict
from tests.shared_cache import shared_dir

# Conversions cost their variants on the board's emulated cores when the emulator is set up (it is, in CI).
# Tests of other behaviour scale this host's timings instead, which keeps them fast; the emulated
# conversion is tested on its own (tests/integration/test_convert_emulated.py clears this).
os.environ.setdefault("EDGESDK_EMULATE", "0")

BOARDS = Path(__file__).parent / "data" / "boards"


@pytest.fixture(scope="session")
def digits():
    from edgesdk.testing import load_digits_data

    return load_digits_data()


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> Path:
    """The session's small models, trained and written once per run (a file-locked cache every worker reads):
    the digits MLP (ONNX, TFLite and its weights) and an untrained wide MLP."""
    from edgesdk.testing import load_digits_data, random_mlp, train_digits_mlp, write_mlp_onnx, write_mlp_tflite

    def build(folder: Path) -> None:
        for name, weights in (("digits", train_digits_mlp(load_digits_data())), ("wide", random_mlp([256, 1024, 1024, 10]))):
            write_mlp_onnx(weights, folder / f"{name}.onnx")
            write_mlp_tflite(weights, folder / f"{name}.tflite")
            np.savez(folder / f"{name}.npz", *(array for layer in weights.layers for array in layer))

    return shared_dir(tmp_path_factory, "models", build)


def _weights(path: Path):
    from edgesdk.testing import MLPWeights

    with np.load(path) as data:
        arrays = [data[f"arr_{i}"] for i in range(len(data.files))]
    return MLPWeights(tuple(zip(arrays[0::2], arrays[1::2])))


@pytest.fixture(scope="session")
def digits_mlp(models):
    return _weights(models / "digits.npz")


@pytest.fixture(scope="session")
def digits_onnx(models) -> Path:
    return models / "digits.onnx"


@pytest.fixture(scope="session")
def digits_tflite(models) -> Path:
    return models / "digits.tflite"


@pytest.fixture(scope="session")
def wide_mlp(models):
    """An untrained wide MLP: enough work per call for worker threads to matter."""
    return _weights(models / "wide.npz"), models / "wide.onnx", models / "wide.tflite"


def host_profile_dict(little: list[int], big: list[int]) -> dict:
    return {
        "name": "host-big-little",
        "description": "this test host seen as a big.LITTLE board",
        "arch": "x86_64",
        "cpu": {"clusters": [
            {"name": "little", "cores": little, "microarchitecture": "host", "max_mhz": 1000, "capacity": 512},
            {"name": "big", "cores": big, "microarchitecture": "host", "max_mhz": 2000, "capacity": 1024},
        ]},
        "memory": {"ram_mb": 4096, "model_budget_mb": 512},
        "power_modes": [
            {"name": "performance", "idle_watts": 1.0, "active_watts": {"big": 10},
                 "clusters": ["big"], "serves": ["latency", "balanced"]},
            {"name": "efficiency", "idle_watts": 1.0, "active_watts": {"little": 3},
                 "clusters": ["little"], "serves": ["power"]},
        ],
    }


@pytest.fixture(scope="session")
def host_big_little() -> DeviceProfile:
    """This host's first usable CPU as the little cluster and the second as the big one."""
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) < 2:
        pytest.skip(f"needs 2 usable CPUs to tell cores apart; this host allows {usable}")
    return profile_from_dict(host_profile_dict([usable[0]], [usable[1]]), origin="<host-big-little>")


#: Test tiers by place, kept here in one table. `scripts/test.sh` and CI run every tier; the developer
#: loop is `.venv/bin/python -m pytest -m "not slow and not ota and not tflite and not kserve"` (well under a minute;
#: kserve installs the third-party V2 server into its own cached virtualenv on first use).
_TIERS = {
    "ota": ("tests/ota/",
            "tests/fleet/",
            "tests/unit/test_fanout_procs.py"),
    "slow": ("tests/docs/test_readme.py", "tests/unit/test_typecheck.py", "tests/integration/test_packaging.py",
             "tests/unit/test_head_retrain.py",
             "tests/integration/test_convert.py", "tests/integration/test_convert_cli.py",
             "tests/integration/test_quantization_search.py", "tests/integration/test_cli_small.py", "tests/examples/"),
}


def pytest_collection_modifyitems(config, items):  # noqa: ARG001 (pytest's hook signature)
    root = Path(__file__).resolve().parent.parent
    for item in items:
        where = Path(str(item.fspath)).resolve().relative_to(root).as_posix()
        for marker, places in _TIERS.items():
            if where.startswith(places):
                item.add_marker(marker)


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory):
    """One real PostgreSQL for the session (fsync off), on a free 127.0.0.1 port; stopped at the end."""
    from edgesdk.ota_server.postgres import INSTALL_HINT, LocalPostgres, postgres_bindir

    if postgres_bindir() is None:
        if os.geteuid() != 0:
            pytest.skip(f"PostgreSQL is not installed and this user cannot install it: `sudo {INSTALL_HINT}` "
                        "(or run scripts/setup.sh as root)")
        pytest.fail(f"PostgreSQL is not installed: run scripts/setup.sh as root (it runs `{INSTALL_HINT}`)")
    server = LocalPostgres(tmp_path_factory.mktemp("postgres"), durable=False, settings={"max_connections": "200"})
    yield server
    server.stop()


_postgres_databases = iter(range(1, 10**9))


@pytest.fixture
def postgres_url(postgres_server, request):
    """The URL of a fresh, empty database on the session's PostgreSQL (named after the test); dropped afterwards."""
    import re

    import psycopg

    test = re.sub(r"[^a-z0-9_]+", "_", request.node.name.lower())[:40]
    name = f"t{next(_postgres_databases)}_{test}"
    url = postgres_server.create_database(name)
    yield url
    try:
        postgres_server.drop_database(name, force=False)
    except psycopg.errors.ObjectInUse:  # a connection the test left open; the session's end removes it
        pass
