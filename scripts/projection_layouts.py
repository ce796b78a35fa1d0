"""Time one int4 projection on ONNX Runtime in the layouts an export could give it.

One 4096 x 4096 weight, group 32, one token, one thread: a float32 Gemm; the codes kept as the
checkpoint stores them, [out, in], dequantized before a Gemm; and the codes [in, out] before a
MatMul, as `export-lm` writes quantized projections (deamoe_trt.export.lm), which ONNX Runtime
fuses into MatMulNBits, at accuracy level 1 (float32 activations, deamoe-trt's sessions) and 4
(int8 activations, ONNX Runtime's default). The runs are interleaved; medians are printed with
their ratio to the float32 Gemm (docs/quantization.md, "ONNX export").

    python scripts/projection_layouts.py [--runs 30]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from onnx import ModelProto, TensorProto, helper

from deamoe_trt.runtimes.onnxruntime import MATMULNBITS_ACCURACY, make_session, session_options

SIZE, GROUP = 4096, 32


def initializer(name: str, array: np.ndarray, elem_type: int, dims: list[int]) -> TensorProto:
    tensor = TensorProto(name=name, data_type=elem_type, dims=dims)
    tensor.raw_data = array.tobytes()
    return tensor


def model(layout: str, rng: np.random.Generator) -> ModelProto:
    n = SIZE * SIZE
    codes = rng.integers(0, 16, size=n, dtype=np.uint8)
    packed = codes[0::2] | (codes[1::2] << 4)  # low nibble first, as ONNX packs uint4
    zero_points = np.full(n // GROUP // 2, 0x88, np.uint8)
    if layout == "float":
        weight = rng.standard_normal((SIZE, SIZE), dtype=np.float32)
        inits = [initializer("w", weight, TensorProto.FLOAT, [SIZE, SIZE])]
        nodes = [helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)]
    else:
        blocked = [SIZE, SIZE // GROUP] if layout == "out_in" else [SIZE // GROUP, SIZE]
        scales = (rng.random(blocked, dtype=np.float32) * 0.01).astype(np.float32)
        inits = [
            initializer("w", packed, TensorProto.UINT4, [SIZE, SIZE]),
            initializer("s", scales, TensorProto.FLOAT, blocked),
            initializer("z", zero_points, TensorProto.UINT4, blocked),
        ]
        axis = 1 if layout == "out_in" else 0
        dq = helper.make_node("DequantizeLinear", ["w", "s", "z"], ["wd"], axis=axis, block_size=GROUP)
        product = (
            helper.make_node("Gemm", ["x", "wd"], ["y"], transB=1)
            if layout == "out_in"
            else helper.make_node("MatMul", ["x", "wd"], ["y"])
        )
        nodes = [dq, product]
    graph = helper.make_graph(
        nodes,
        "projection",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", SIZE])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", SIZE])],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    contenders = {
        "float32 Gemm": ("float", None),
        "int4 [out, in] + DequantizeLinear + Gemm": ("out_in", None),
        "int4 [in, out] + DequantizeLinear + MatMul, level 1": ("in_out", None),
        "int4 [in, out] + DequantizeLinear + MatMul, level 4": ("in_out", "4"),
    }
    sessions = {}
    for name, (layout, level) in contenders.items():
        options = session_options(1)  # deamoe-trt's sessions: MatMulNBits at accuracy level 1
        if level:
            options.add_session_config_entry(MATMULNBITS_ACCURACY, level)
        sessions[name] = make_session(model(layout, rng), options=options)
    x = rng.random((1, SIZE), dtype=np.float32)
    times: dict[str, list[float]] = {name: [] for name in sessions}
    for session in sessions.values():
        session.run(None, {"x": x})
    for _ in range(args.runs):
        for name, session in sessions.items():
            start = time.perf_counter()
            session.run(None, {"x": x})
            times[name].append(time.perf_counter() - start)
    base = float(np.median(times["float32 Gemm"]))
    for name, runs in times.items():
        median = float(np.median(runs))
        print(f"{name:52s} {median * 1e3:8.2f} ms  {median / base:6.2f}x")


if __name__ == "__main__":
    main()
