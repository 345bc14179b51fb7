"""y = Gather(x, [index]) over x of 4 rows: a tiny valid graph, a different file (and SHA-256) per index,
which every runtime refuses at run time for index >= 4. Shared by the emulation tests."""

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def gather(path: Path, index: int) -> Path:
    """Write the Gather model selecting row ``index`` to ``path``."""
    graph = helper.make_graph(
        [helper.make_node("Gather", ["x", "i"], ["y"], axis=0)], "gather",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
        [numpy_helper.from_array(np.array([index], dtype=np.int64), "i")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path
