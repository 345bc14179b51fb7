"""The quantization benchmark's text-detector metric (benchmarks/shared/models.py): DB boxes, F1."""

import numpy as np

from benchmarks.shared.models import text_box_agreement, text_boxes


def _maps(n: int = 3, size: int = 64) -> np.ndarray:
    """N x 1 x size x size probability maps, two text-line-like bars each (0.9 in, 0.05 out)."""
    maps = np.full((n, 1, size, size), 0.05, np.float32)
    for i in range(n):
        maps[i, 0, 8 + i:16 + i, 4:40] = 0.9
        maps[i, 0, 30:38, 10 + i:50 + i] = 0.9
    return maps


def test_text_boxes_reads_regions_above_threshold_with_their_box_score_and_size():
    probability = np.zeros((40, 40), np.float32)
    probability[5:12, 3:30] = 0.8      # a line: kept
    probability[20:22, 5:25] = 0.8     # 2 px high: under the 3 px minimum side
    probability[30:36, 5:15] = 0.35    # above 0.3 but its box score is under 0.5
    assert text_boxes(probability) == [(3, 5, 30, 12)]


def test_identical_maps_agree_fully():
    maps = _maps()
    assert text_box_agreement(maps, maps.copy()) == 100.0


def test_a_shifted_map_agrees_less():
    maps = _maps()
    shifted = np.roll(maps, 6, axis=2)  # 6 px down: 8-px-high bars overlap by 2 px, IoU < 0.5
    assert text_box_agreement(maps, shifted) < 100.0
    assert text_box_agreement(maps, np.roll(maps, 1, axis=2)) == 100.0  # IoU 7/9: still a match


def test_missing_and_extra_boxes_count_in_the_f1():
    maps = _maps(n=1)
    missing = maps.copy()
    missing[0, 0, 30:38] = 0.05  # the second bar gone: 1 of 2 matched, 1 found: F1 = 2 * 1 / 3
    assert abs(text_box_agreement(maps, missing) - 200 / 3) < 1e-9
    blank = np.full_like(maps, 0.05)
    assert text_box_agreement(blank, blank) == 100.0
