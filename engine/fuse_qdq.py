"""Planning: QuantizeLinear -> DequantizeLinear -> QMatMul becomes one QdqMatMul on the uint8
values (engine/ops/qdq_matmul.py), and -> Conv/FusedConv with an int8 filter a QdqConv
(qdq_conv.py, with the JIT tier only), so int8 activations are multiplied in integers.

A package converted with static int8 activations (converter/calibrate.py), like any ONNX model
in the QDQ form, quantizes a MatMul's input per tensor and dequantizes it again right away; an
int8-capable runtime is meant to fuse the pair into its integer kernel.  Here the QuantizeLinear
stays (several projections often read one quantized value: computed once), each QMatMul reading
the dequantized copy becomes a QdqMatMul reading the uint8 values, and the DequantizeLinear goes
when nothing else reads it.  With the JIT tier the QdqMatMul's kernel is the integer GEMM
(int8_gemm_jit.py, weights packed here once); without, the numpy kernel runs the unfused form.

The integer GEMM is only as fast as the CPU's byte dot product: one instruction per 64 products
with AVX-512 VNNI (4.5-7.5x float32 BLAS), ~8 with AVX2 (~1.5x), and LLVM's generic lowering
elsewhere (~10x slower than BLAS: int8a models 6-9x slower than onnxruntime fp32 on an AVX2
machine, before the AVX2 path).  So without VNNI nothing is fused unless ``integer_products_pay``
measured the integer GEMM clearly faster than the float form it replaces on this machine
(PAY_MARGIN: the probe leaves out what fusing adds per node, e.g. a 1-row product padded to the
GEMM's 4-row tile; on an AMD EPYC Zen 3 with AVX2 the probe found 0.8-0.9x and the fused plans
ran 0.5x (GPT decode step), 0.9x (ViT-Tiny), 1.02-1.07x (ResNet18, BERT) the unfused ones).  A
device check, not a candidate in the kernel search: the fusion replaces two planned steps (the
DequantizeLinear and the QMatMul or Conv whose kernel the search already chose), which a
per-node search among one op's kernels cannot weigh.  ``FERRY_INT8_FUSION`` = 1 / 0 fuses
always / never (tests, benchmarks).
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import replace

import numpy as np

from engine import jit
from engine.ops.qdq_conv import qdq_conv_operands
from engine.ops.qdq_matmul import qdq_matmul, qdq_operands
from engine.ops.registry import kernel_name
from engine.program import Program, Step

NOTE = "fused QuantizeLinear/DequantizeLinear/{}: integer GEMM"
CONVS = ("Conv", "FusedConv")
QUANTIZERS = ("QuantizeLinear", "DynamicQuantizeLinear")


def fuse_qdq(
    steps: list,  # planner.PlannedStep
    static: dict[str, np.ndarray],
    keep: set[str],
    packed: dict[str, np.ndarray],
    use_jit: bool,
    program: Program,
) -> list:
    """The planned steps with each fusable QMatMul and Conv replaced (see the module's note);
    packed weights are added to ``packed`` (the plan's constants)."""
    if not any(step.op in QUANTIZERS for step in steps):
        # nothing reads a quantizer's output, so nothing fuses; the probe below would load numba
        # (~120 MB of peak RSS) into a float model's session that has no other use for it
        return steps
    if use_jit and not integer_products_pay():
        return steps  # the unfused float form is faster here
    producer = {name: step for step in steps for name in step.outputs if name}
    original = {step.name: step for step in program.steps}  # inputs before any packing
    filters = {s.outputs[0]: s for s in program.steps if s.op == "DequantizeLinear" and s.outputs}
    fused: set[str] = set()
    known = {**static, **_dynamic_parameters(steps)}  # stand-ins for run-time scales: checks only
    for position, step in enumerate(steps):
        if step.op in CONVS and use_jit and step.name in original:
            found = _fused_conv_inputs(original[step.name], producer, filters, known)
            op, module, name = "QdqConv", "engine.ops.int8_conv_jit", "qdq_conv_jit"
        else:
            found = _fused_inputs(step, producer, known)
            op, module, name = "QdqMatMul", "engine.ops.int8_gemm_jit", "qdq_matmul_jit"
        if found is None:
            continue
        inputs, values, attrs = found
        # imported (compiled) only for a model that has something to fuse
        kernel = getattr(jit.module(module), name) if use_jit else qdq_matmul
        pack = getattr(kernel, "pack", None)
        if pack is not None:
            for slot, array in pack(values, attrs).items():
                inputs += [""] * (slot + 1 - len(inputs))
                inputs[slot] = f"{inputs[3]}@{kernel_name(kernel)}/{slot}"
                packed.setdefault(inputs[slot], array)
        fused.add(step.inputs[0])
        note = NOTE.format(step.op)
        steps[position] = replace(step, op=op, kernel=kernel, attrs=attrs, inputs=inputs, note=note)
    still_read = {name for step in steps for name in step.inputs if name} | keep
    steps = [s for s in steps if not (s.op == "DequantizeLinear" and s.outputs[0] in fused - still_read)]
    return _dynamic_kernels(steps) if use_jit else steps


def _dynamic_parameters(steps: list) -> dict[str, np.ndarray]:
    """A float32 scale and a uint8 zero point standing in for each DynamicQuantizeLinear's
    run-time ones: the fusion checks only their types (per tensor), never their values."""
    found: dict[str, np.ndarray] = {}
    for step in steps:
        if step.op == "DynamicQuantizeLinear" and len(step.outputs) == 3 and all(step.outputs):
            found[step.outputs[1]] = np.array(1.0, np.float32)
            found[step.outputs[2]] = np.array(0, np.uint8)
    return found


def _dynamic_kernels(steps: list) -> list:
    """Each DynamicQuantizeLinear on the JIT kernel: range and quantize in two passes, in x's
    memory order (a conv's channels-last result stays so for the integer conv reading it); also
    where the pair stays unfused (a conv too narrow for the integer GEMM), numpy's takes seven."""
    if not any(step.op == "DynamicQuantizeLinear" for step in steps):
        return steps  # the module is not imported for nothing
    kernel = jit.module("engine.ops.int8_gemm_jit").dynamic_quantize_linear_jit
    return [replace(step, kernel=kernel) if step.op == "DynamicQuantizeLinear" else step for step in steps]


def _fused_inputs(step, producer: dict, static: dict[str, np.ndarray]):  # noqa: ANN001, ANN202
    """QdqMatMul's input names, values (a stand-in for the activations) and attrs for a QMatMul
    reading a QuantizeLinear -> DequantizeLinear pair with fixed per-tensor parameters and fixed
    plain int8 weights, else None."""
    if step.op != "QMatMul" or len(step.inputs) < 2 or step.inputs[1] not in static:
        return None
    activations = _quantized_source(step.inputs[0], producer, static)
    if activations is None:
        return None
    rest = (list(step.inputs[1:]) + [""] * 4)[:4]  # weights, scales, zero point, bias
    inputs = [*activations, *rest]
    weights = static[step.inputs[1]]
    values = [np.empty((1, weights.shape[0]) if weights.ndim else 0, np.uint8)]
    values += [static.get(name) if name else None for name in inputs[1:]]
    return (inputs, values, step.attrs) if qdq_operands(values, step.attrs) else None


def _fused_conv_inputs(step: Step, producer: dict, filters: dict, static: dict[str, np.ndarray]):  # noqa: ANN202
    """QdqConv's input names, values and attrs for a Conv reading a QuantizeLinear ->
    DequantizeLinear pair (per tensor, fixed) whose filter is an int8 DequantizeLinear's
    (per output channel, fixed), else None."""
    activations = _quantized_source(step.inputs[0] if step.inputs else "", producer, static)
    source = filters.get(step.inputs[1]) if len(step.inputs) > 1 else None
    if activations is None or source is None or len(source.inputs) < 2 or source.attrs.get("axis", 1) != 0:
        return None
    if len(source.inputs) > 2 and source.inputs[2]:
        return None  # a filter zero point: not the converter's symmetric int8
    weights, scales = source.inputs[:2]
    if weights not in static or scales not in static:
        return None
    rest = (list(step.inputs[2:]) + [""] * 2)[:2]  # bias, residual
    inputs = [*activations, weights, scales, *rest]
    filter_ = static[weights]
    shape = (1, filter_.shape[1], 1, 1) if filter_.ndim == 4 else (1,)
    values = [np.empty(shape, np.uint8)] + [static.get(name) if name else None for name in inputs[1:]]
    attrs = {**step.attrs, "kernel_shape": list(filter_.shape[2:])}
    return (inputs, values, attrs) if qdq_conv_operands(values, attrs) else None


def _quantized_source(name: str, producer: dict, static: dict[str, np.ndarray]) -> list[str] | None:
    """[q, scale, zero] when ``name`` is a DequantizeLinear (per tensor, fixed parameters or a
    DynamicQuantizeLinear's: ``static`` holds stand-ins for those) of a QuantizeLinear's or
    DynamicQuantizeLinear's output, else None."""
    dequantize = producer.get(name)
    if dequantize is None or dequantize.op != "DequantizeLinear" or len(dequantize.inputs) != 3:
        return None
    quantize = producer.get(dequantize.inputs[0])
    if dequantize.attrs or quantize is None or quantize.op not in QUANTIZERS:
        return None
    q, scale, zero = dequantize.inputs
    return [q, scale, zero] if scale in static and zero in static else None


# the measured product: a transformer projection's shape (ViT-Tiny, BERT-base rows), per thread
PROBE_SHAPE = (128, 384, 384)  # rows, K, N
PROBE_ROUNDS = 7
PAY_MARGIN = 0.7  # fuse without VNNI when the integer probe takes <= 70% of the float one


def integer_products_pay() -> bool:
    """Whether the JIT integer GEMM beats the unfused float form here: always with AVX-512 VNNI;
    else measured once per process (~10 ms) and by PAY_MARGIN: uint8 x int8 through the integer
    kernel against dequantizing the same uint8 values and a float32 BLAS product with weights
    cast already (the unfused form's best case), each the best of PROBE_ROUNDS interleaved
    rounds of CPU time at one thread.  ``FERRY_INT8_FUSION`` (1 / 0) overrides."""
    forced = os.environ.get("FERRY_INT8_FUSION")
    if forced in ("0", "1"):
        return forced == "1"
    return jit.has_vnni() or _measured_to_pay()


@functools.cache
def _measured_to_pay() -> bool:
    integer, floating = _probe_seconds()
    return integer <= PAY_MARGIN * floating


def _probe_seconds() -> tuple[float, float]:
    """(integer kernel, float form) seconds for one PROBE_SHAPE product at one thread."""
    from threadpoolctl import threadpool_limits  # noqa: PLC0415 - only without VNNI

    module = jit.module("engine.ops.int8_gemm_jit")
    rows, k, n = PROBE_SHAPE
    rng = np.random.default_rng(0)
    q = rng.integers(0, 256, (rows, k), dtype=np.uint8)
    w = rng.integers(-127, 128, (k, n), dtype=np.int8)
    scale, zero, w_scale = np.array(0.02, np.float32), np.array(128, np.uint8), np.full(n, 0.01, np.float32)
    inputs = [q, scale, zero, w, w_scale, None, None]
    packed = dict(enumerate(inputs)) | module.pack(inputs, {})
    integer_inputs = [packed[i] for i in range(len(inputs))]
    w_float = w.astype(np.float32) * w_scale

    def integer() -> None:
        module.qdq_matmul_jit(integer_inputs, {})

    def floating() -> None:
        ((q.astype(np.float32) - np.float32(128)) * scale) @ w_float

    best = [float("inf"), float("inf")]
    with threadpool_limits(1), jit.thread_limit(1):
        integer()  # compiled (or loaded) and warm
        for _ in range(PROBE_ROUNDS):
            for slot, run in enumerate((integer, floating)):
                start = time.thread_time()
                run()
                best[slot] = min(best[slot], time.thread_time() - start)
    return best[0], best[1]
