"""Planning: QuantizeLinear -> DequantizeLinear -> QMatMul becomes one QdqMatMul on the uint8
values (engine/ops/qdq_matmul.py), so int8 activations are multiplied in integers.

A package converted with static int8 activations (converter/calibrate.py), like any ONNX model
in the QDQ form, quantizes a MatMul's input per tensor and dequantizes it again right away; an
int8-capable runtime is meant to fuse the pair into its integer kernel.  Here the QuantizeLinear
stays (several projections often read one quantized value: computed once), each QMatMul reading
the dequantized copy becomes a QdqMatMul reading the uint8 values, and the DequantizeLinear goes
when nothing else reads it.  With the JIT tier the QdqMatMul's kernel is the integer GEMM
(int8_gemm_jit.py, weights packed here once); without, the numpy kernel runs the unfused form.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from engine import jit
from engine.ops.qdq_matmul import qdq_matmul, qdq_operands
from engine.ops.registry import kernel_name

NOTE = "fused QuantizeLinear/DequantizeLinear/QMatMul: integer GEMM"


def fuse_qdq_matmul(
    steps: list,  # planner.PlannedStep
    static: dict[str, np.ndarray],
    keep: set[str],
    packed: dict[str, np.ndarray],
    use_jit: bool,
) -> list:
    """The planned steps with each fusable QMatMul replaced (see the module's note); packed
    weights are added to ``packed`` (the plan's constants)."""
    producer = {name: step for step in steps for name in step.outputs if name}
    fused: set[str] = set()
    for position, step in enumerate(steps):
        found = _fused_inputs(step, producer, static)
        if found is None:
            continue
        inputs, values = found
        # imported (compiled) only for a model that has something to fuse
        kernel = jit.module("engine.ops.int8_gemm_jit").qdq_matmul_jit if use_jit else qdq_matmul
        pack = getattr(kernel, "pack", None)
        if pack is not None:
            for slot, array in pack(values, step.attrs).items():
                name = f"{inputs[3]}@{kernel_name(kernel)}/{slot}"
                packed.setdefault(name, array)
                inputs[slot] = name
        fused.add(step.inputs[0])
        steps[position] = replace(step, op="QdqMatMul", kernel=kernel, inputs=inputs, note=NOTE)
    still_read = {name for step in steps for name in step.inputs if name} | keep
    return [s for s in steps if not (s.op == "DequantizeLinear" and s.outputs[0] in fused - still_read)]


def _fused_inputs(step, producer: dict, static: dict[str, np.ndarray]):  # noqa: ANN001, ANN202
    """QdqMatMul's input names and values (a stand-in for the activations) for a QMatMul reading
    a QuantizeLinear -> DequantizeLinear pair with fixed per-tensor parameters and fixed plain
    int8 weights, else None."""
    if step.op != "QMatMul" or not step.inputs or step.inputs[0] not in producer:
        return None
    dequantize = producer[step.inputs[0]]
    if dequantize.op != "DequantizeLinear" or len(dequantize.inputs) != 3 or dequantize.attrs:
        return None
    quantize = producer.get(dequantize.inputs[0])
    if quantize is None or quantize.op != "QuantizeLinear":
        return None
    q, scale, zero = dequantize.inputs
    if scale not in static or zero not in static or step.inputs[1] not in static:
        return None
    rest = (list(step.inputs[1:]) + [""] * 4)[:4]  # weights, scales, zero point, bias
    inputs = [q, scale, zero, *rest]
    weights = static[step.inputs[1]]
    values = [np.empty((1, weights.shape[0]) if weights.ndim else 0, np.uint8)]
    values += [static.get(name) if name else None for name in inputs[1:]]
    return (inputs, values) if qdq_operands(values, step.attrs) else None
