"""The held-out split of the evaluation samples: its rule, determinism and class balance (converters/planning/data.py)."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.converters.planning.data import split_evaluation


@pytest.mark.parametrize(("count", "fraction", "minimum", "held"), [
    (450, 0.3, 20, 135),   # round(0.3 * 450)
    (100, 0.3, 20, 30),
    (50, 0.3, 20, 20),     # 15 would be below the minimum
    (40, 0.3, 20, 20),     # exactly twice the minimum: 20 and 20
    (41, 0.5, 20, 21),     # half, rounded up, still leaves 20 to choose with
    (1000, 0.5, 20, 500),
    (12, 0.25, 4, 4),      # round(3) < 4
])
def test_sizes_follow_the_rule(count, fraction, minimum, held):
    split = split_evaluation(count, fraction, seed=0, minimum=minimum)
    assert (len(split.holdout), len(split.selection)) == (held, count - held)
    assert split.is_split and split.note == ""
    assert split.to_dict() == {"selection_samples": count - held, "holdout_samples": held, "holdout_fraction": fraction,
                               "holdout_seed": 0, "holdout_min": minimum, "holdout_note": None}


def test_the_split_is_disjoint_complete_sorted_and_the_same_for_the_same_seed():
    first, again = split_evaluation(450, 0.3, seed=7), split_evaluation(450, 0.3, seed=7)
    np.testing.assert_array_equal(first.holdout, again.holdout)
    np.testing.assert_array_equal(first.selection, again.selection)
    assert not set(first.holdout) & set(first.selection)
    assert sorted([*first.holdout, *first.selection]) == list(range(450))
    assert list(first.holdout) == sorted(first.holdout) and list(first.selection) == sorted(first.selection)
    other = split_evaluation(450, 0.3, seed=8)
    assert len(other.holdout) == 135 and set(other.holdout) != set(first.holdout)
    # Not simply the first or last samples.
    assert set(first.holdout) != set(range(135)) and set(first.holdout) != set(range(315, 450))


def test_with_labels_every_class_is_held_out_in_its_share():
    rng = np.random.default_rng(3)
    labels = rng.choice(10, size=450, p=[0.3, *[0.7 / 9] * 9])  # one class much larger than the others
    split = split_evaluation(450, 0.3, seed=1, labels=labels)
    assert len(split.holdout) == 135
    for cls in range(10):
        share = np.sum(labels == cls) * 135 / 450
        assert abs(np.sum(labels[split.holdout] == cls) - share) <= 1, cls


@pytest.mark.parametrize(("count", "fraction", "why"), [
    (39, 0.3, "39 evaluation samples, a split needs at least 40 (20 held out, 20 to choose with)"),
    (1, 0.3, "1 evaluation samples, a split needs at least 40"),
    (450, 0.0, "holdout is 0"),
])
def test_too_few_samples_or_a_zero_fraction_make_no_split_and_say_why(count, fraction, why):
    split = split_evaluation(count, fraction, seed=0, minimum=20)
    assert not split.is_split and len(split.holdout) == 0
    assert list(split.selection) == list(range(count))
    assert why in split.note and split.note.startswith("no held-out check")
    assert split.to_dict()["holdout_samples"] == 0 and why in split.to_dict()["holdout_note"]
