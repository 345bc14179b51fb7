"""The fuzz suite's CI profile: every network parser, accepted as a typed record or refused with an EdgeSDKError.

``EDGESDK_FUZZ_EXAMPLES`` sets the examples per parser (150 by default here; ``benchmarks/security/security.py
--part fuzz`` runs the long profile). Hypothesis's example database is off, so every run is fresh
and a failure prints the shrunk input that raised.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings

from tests.fuzz.targets import TARGETS, exercise

EXAMPLES = int(os.environ.get("EDGESDK_FUZZ_EXAMPLES", "150"))


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_a_network_parser_accepts_a_typed_record_or_refuses_with_an_edgesdk_error(name):
    target = TARGETS[name]
    outcomes: list[bool] = []

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
    @given(target.inputs())
    def check(value):
        outcomes.append(exercise(target, value))

    check()
    # The strategies start from valid messages: a parser that refused all of them would pass the property
    # by refusing everything, so some inputs must be accepted and some refused.
    assert any(outcomes) and not all(outcomes), f"{name}: accepted {sum(outcomes)} of {len(outcomes)}"
