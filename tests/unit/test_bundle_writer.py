"""The chosen variant's health check tolerates what the board was measured to differ by, and no more."""

from edgesdk.converters.bundle_writer import health_tolerance


def test_without_board_outputs_the_tolerance_is_the_precisions_own():
    assert health_tolerance("fp32") == 1e-2
    assert health_tolerance("int8_static") == 5e-2


def test_a_measured_host_board_difference_widens_the_tolerance_by_half_again():
    # The third detector: its INT8 output on the board differed from this host's by 0.136.
    assert health_tolerance("int8_static", 0.136) == 0.204
    assert health_tolerance("fp16", 0.02) == 0.03


def test_a_board_that_agrees_closely_keeps_the_precisions_tolerance():
    assert health_tolerance("int8_static", 0.0039) == 5e-2
    assert health_tolerance("fp32", 1.2e-7) == 1e-2
