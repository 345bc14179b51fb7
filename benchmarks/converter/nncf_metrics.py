"""The benchmark's task metrics for NNCF's accuracy control (loaded by ``nncf_worker.py`` as its ``metric_file``).

Runs in NNCF's virtualenv, which has numpy but not edgesdk: the metrics come from
``benchmarks/shared/models.py`` (numpy only at import; the text boxes use scipy,
which NNCF installs). ``EDGESDK_NNCF_METRIC`` names the metric; targets are
the FP32 outputs (the worker's ``targets: null``), so the score is agreement with FP32 in
points, as edgesdk's own drop is.
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository root
from benchmarks.shared.models import detection_agreement, text_agreement, text_box_agreement  # noqa: E402

_METRICS = {"detection_agreement": detection_agreement, "text_agreement": text_agreement,
            "text_box_agreement": text_box_agreement}


def validate(session_outputs_list, targets):  # type: ignore[no-untyped-def]
    """Agreement with FP32 (0-100) of the first output over every validation sample."""
    metric = _METRICS[os.environ["EDGESDK_NNCF_METRIC"]]
    outputs = np.concatenate([np.asarray(o[0]) for o in session_outputs_list])
    reference = np.concatenate([np.asarray(t[0]) for t in targets])
    return float(metric(reference, outputs))
