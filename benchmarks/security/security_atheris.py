"""Coverage-guided fuzzing of the tar and protocol parsers with atheris (libFuzzer), beside Hypothesis.

    python benchmarks/security/security_atheris.py {command,archive} RUNS OUT.json

Runs in its own process (libFuzzer ends the process when it is done): seeds a corpus with a valid
command manifest or signed bundle archive, mutates from there for RUNS executions, and keeps a tally
in OUT.json: executions, and the first escape of each kind (anything raised but an EdgeSDKError).
A command's mutated manifest is signed with the fleet's commands key before it is parsed, as a
holder of that key would, so the fuzzer reaches the fields behind the signature. :func:`run`
starts it for each target and collects the tallies.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run(runs: int) -> dict[str, Any]:
    """Fuzz each target for ``runs`` executions in a child process; per target: executions and escapes, or why
    atheris is not installed (the dev extra installs it on x86_64 Linux only, where wheels exist)."""
    try:
        import atheris  # noqa: F401
    except ImportError as exc:
        return {"available": False, "why": str(exc)}
    results: dict[str, Any] = {"available": True}
    for target in ("command", "archive"):
        with tempfile.TemporaryDirectory() as scratch:
            out = Path(scratch) / "tally.json"
            child = subprocess.run([sys.executable, __file__, target, str(runs), str(out)], capture_output=True,
                                   text=True, cwd=ROOT, timeout=1800)
            results[target] = json.loads(out.read_text()) if out.exists() else {"error": child.stderr[-2000:]}
    return results


def _harness(target: str, runs: int, out: Path) -> None:
    import atheris

    with atheris.instrument_imports():
        from edgesdk.errors import EdgeSDKError
        from edgesdk.fleet import archive, protocol
    sys.path.insert(0, str(ROOT))
    from edgesdk.runtime.signing import key_id, sign
    from tests.fuzz.targets import ARCHIVES, KEYS, _command_manifest

    def _seal_bytes(body: bytes) -> bytes:
        import base64

        return json.dumps({"manifest": base64.b64encode(body).decode(),
                           "signature": base64.b64encode(sign(KEYS.commands, body)).decode(),
                           "key_id": key_id(KEYS.commands.public_key())}).encode()

    keys = KEYS.root.keyset("commands") if target == "command" else KEYS.root.keyset("bundles")
    seed = json.dumps(_command_manifest()).encode() if target == "command" else ARCHIVES.valid
    corpus = Path(tempfile.mkdtemp(prefix=f"edgesdk-atheris-{target}-"))
    (corpus / "seed").write_bytes(seed)
    work = Path(tempfile.mkdtemp(prefix="edgesdk-atheris-work-"))
    tally = {"target": target, "executions": 0, "accepted": 0, "escapes": {}}

    def one(data: bytes) -> None:
        tally["executions"] += 1
        try:
            if target == "command":
                protocol.parse_command(_seal_bytes(data), keys)
            else:
                case = Path(tempfile.mkdtemp(dir=work))
                (case / "in.tar").write_bytes(data)
                try:
                    archive.unpack_bundle(case / "in.tar", case / "slot", keys=keys)
                finally:
                    beside = {p.name for p in case.iterdir()}
                    subprocess.run(["rm", "-rf", str(case)], check=False)
                    if not beside <= {"in.tar", "slot"}:
                        tally["escapes"].setdefault("written outside the slot", sorted(beside))
            tally["accepted"] += 1
        except EdgeSDKError:
            pass
        except Exception as exc:  # noqa: BLE001 (an escape is what this counts)
            tally["escapes"].setdefault(type(exc).__name__, f"{exc!s:.200} <- {data[:200]!r}")

    def one_and_keep(data: bytes) -> None:
        one(data)
        if tally["executions"] % 200 == 0 or tally["executions"] >= runs or len(tally["escapes"]) != kept[0]:
            kept[0] = len(tally["escapes"])
            out.write_text(json.dumps(tally))  # libFuzzer exits the process without Python's atexit

    kept = [0]
    atheris.Setup([sys.argv[0], f"-runs={runs}", "-max_len=65536", str(corpus)], one_and_keep)
    atheris.Fuzz()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    _harness(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]))
