"""Small ONNX graphs built in code for the optimize tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def deep_mlp(path: Path, layers: int = 6, width: int = 16) -> Path:
    """x -> (MatMul, Relu) x ``layers``, x: [batch, width]; its nodes unnamed (as many exporters leave them)."""
    import onnx
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        w = (rng.standard_normal((width, width)) / 4).astype(np.float32)
        inits.append(onnx.numpy_helper.from_array(w, f"W{i}"))
        nodes += [helper.make_node("MatMul", [x, f"W{i}"], [f"h{i}"]), helper.make_node("Relu", [f"h{i}"], [f"r{i}"])]
        x = f"r{i}"
    graph = helper.make_graph(
        nodes, "deep", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["batch", width])], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path
