"""benchmarks/converter/quantization.py's goals: what counts as fast and accurate; ours vs NNCF."""

from types import SimpleNamespace

from benchmarks.converter.quantization import _ours, model_goals


def _result(ratio: float, held: float, basis: str, nncf: dict | None = None) -> dict:
    peers = {} if nncf is None else {"nncf_accuracy_control": nncf}
    return {"proxy": [], "metric_unit": "points", "chosen_holdout_drop": held,
            "chosen_accuracy_basis": basis, "chosen_a76_ratio": ratio, "convert_wall_s": 100.0,
            "peers": peers}


def _goals(results: dict) -> dict[str, bool]:
    return {g["name"]: g["met"] for g in model_goals(list(results), results, quick=False)}


def _met(goals: dict[str, bool], *words: str) -> bool:
    (met,) = [m for name, m in goals.items() if all(w in name for w in words)]
    return met


def test_a_model_counts_as_fast_and_accurate_only_when_its_accuracy_came_from_the_board():
    results = {"a": _result(0.6, 0.5, "board"), "b": _result(0.6, 0.5, "this host"),
               "c": _result(0.8, 0.2, "board"), "d": _result(0.5, 1.5, "board")}
    goals = _goals(results)
    assert results["fast_and_accurate_models"] == ["a"]
    assert _met(goals, "a:", "accuracy computed")
    assert not _met(goals, "b:", "accuracy computed")
    assert not _met(goals, "models whose chosen variant")  # 1 of 4, 3 needed
    assert _met(goals, "d:", "chosen variant's emulated A76")
    assert not _met(goals, "d:", "held-out drop")


def test_three_of_four_on_the_board_meet_the_count():
    results = {n: _result(0.7, 0.4, "board (emulated cortex-a76, 64 samples)") for n in "abc"}
    results["d"] = _result(1.0, 0.0, "board")
    assert _met(_goals(results), "models whose chosen variant")


def test_ours_against_nncf_within_the_bound():
    nncf = {"a76_ratio_vs_fp32": 0.6, "holdout_drop": 0.5, "accuracy_basis": "board",
            "wall_s": 80.0}
    slower = _goals({"m": _result(0.7, 0.5, "board", nncf)})
    assert not _met(slower, "ours / NNCF")
    faster = _goals({"m": _result(0.55, 0.5, "board", nncf)})
    assert _met(faster, "ours / NNCF")
    nncf_missed = _goals({"m": _result(0.9, 0.5, "board", {**nncf, "holdout_drop": 2.0})})
    # NNCF outside the bound: ours need only be within it.
    assert _met(nncf_missed, "ours / NNCF", "missed")
    both_missed = _goals({"m": _result(0.9, 1.5, "board", {**nncf, "holdout_drop": 2.0})})
    assert not _met(both_missed, "ours / NNCF")
    failed = _goals({"m": _result(0.5, 0.5, "board", {"error": "timed out"})})
    assert not _met(failed, "NNCF accuracy control ran")


def test_ours_reads_the_board_fields_when_the_candidate_has_them():
    before = SimpleNamespace(accuracy_drop=0.3, holdout_drop=0.4)
    assert _ours(before)["accuracy_basis"] == "this host" and _ours(before)["holdout_drop"] == 0.4
    after = SimpleNamespace(accuracy_drop=0.3, holdout_drop=0.4, board_holdout_drop=0.9,
                            accuracy_basis="board", board_drop=0.2, host_board_difference=0.05)
    row = _ours(after)
    assert (row["holdout_drop"], row["host_holdout_drop"]) == (0.9, 0.4)
    assert row["accuracy_basis"] == "board"
