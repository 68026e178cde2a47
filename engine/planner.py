"""Planning one input-shape signature: what the first run learns, turned into a leaner program.

The first run with a new signature executes the bound program as is and records, for every
value, its shape, dtype and which buffer owns its memory; the second run builds the plan
from that record (so planning never delays the first result) and every run after executes
it.  The planner:

1. folds every node whose inputs are all known for this signature (constants, and values
   computed from shapes only: Shape -> Gather -> Concat chains, weight transposes...) into
   plan constants, unless the result would be larger than its inputs (Expand, or a
   dequantized matrix: those stay lazy so int8/int4 packages keep their memory savings),
   except a convolution's dequantized filter: dequantized on every run it cost an int8
   ResNet18 2.4x its fp32 time (and Winograd's filter transform each run); folded, the
   conv kernel packs it once, and int8/int4 stay smaller to ship and store;
2. fuses patterns the exporters spell out op by op (GELU as Div/Erf/Add/Mul/Mul) into one
   kernel;
3. picks each node's kernel (the op's selector, or the device-measured choice of
   ``engine.search`` for the heavy ones) and pre-packs the weights a kernel wants in its
   own layout (``kernel.pack``: Winograd's transformed filters) as plan constants;
4. recomputes liveness on what is left, and runs an elementwise node in place when an
   input dies there, has the output's shape and dtype, and owns its buffer alone (no
   constant, feed, graph output or still-live view shares it), so activations reuse
   buffers instead of allocating new ones.

Every planned kernel keeps the ordinary calling convention, so the executor is the same
loop for planned and unplanned runs.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from engine.fuse_qdq import fuse_qdq
from engine.ops import inplace, raster
from engine.ops.registry import REGISTRY, Kernel, kernel_name
from engine.program import Program, Step

# Outputs that depend on their input's shape only, so are known once the signature is.
SHAPE_ONLY = frozenset({"Shape", "Size"})
# Never folded: their point is to keep weights compressed until the moment they are used.
NO_FOLD = frozenset({"DequantizeLinear", "QMatMul", "QGather", "QGemm", "RandomNormal", "RandomUniform"})
# Folded results up to this size are kept even when larger than their inputs.
FOLD_SMALL_BYTES = 64 * 1024
# Consumers whose input 1 is a filter: a dequantized filter is folded (see 1. above), directly
# or through the Reshape the converter puts after an int4 filter's [out, in*kh*kw] blocks.
FILTER_CONSUMERS = frozenset({"Conv", "FusedConv", "ConvTranspose"})


def dequantized_filters(program: Program) -> frozenset[str]:
    """DequantizeLinear/Reshape outputs read only as convolution filters (input 1)."""
    readers: dict[str, list[tuple[Step, int]]] = {}
    for step in program.steps:
        for position, name in enumerate(step.inputs):
            if name:
                readers.setdefault(name, []).append((step, position))
    outputs = set(program.outputs)

    def only_filter(name: str) -> bool:
        uses = readers.get(name, [])
        if not uses or name in outputs:
            return False
        return all(
            (s.op in FILTER_CONSUMERS and position == 1)
            or (s.op == "Reshape" and position == 0 and only_filter(s.outputs[0]))
            for s, position in uses
        )

    return frozenset(
        name
        for step in program.steps
        if step.op == "DequantizeLinear"
        for name in step.outputs[:1]
        if name and only_filter(name)
    )


@dataclass
class ValueInfo:
    shape: tuple[int, ...]
    dtype: np.dtype
    owner: int  # token of the object owning the memory: equal tokens may share memory
    writeable: bool
    order: tuple[int, ...] | None = None  # axes from outermost in memory, when not C order


def memory_order(value: np.ndarray) -> tuple[int, ...] | None:
    """The axis order of the C-contiguous array ``value`` is a transposed view of (a conv's
    channels-last result seen as NCHW: (0, 2, 3, 1)), or None for C order and other layouts."""
    if value.flags.c_contiguous or value.ndim < 2:
        return None
    order = tuple(sorted(range(value.ndim), key=lambda axis: -value.strides[axis]))
    return order if value.transpose(order).flags.c_contiguous else None


def in_memory_order(array: np.ndarray, order: tuple[int, ...] | None) -> np.ndarray:
    """``array``'s values laid out in ``order`` (as recorded by ``memory_order``)."""
    if order is None:
        return array
    return np.ascontiguousarray(array.transpose(order)).transpose(np.argsort(order))


@dataclass
class Record:
    """What the first run of a signature saw."""

    info: dict[str, ValueInfo] = field(default_factory=dict)
    static: dict[str, np.ndarray] = field(default_factory=dict)  # values known for this signature
    kernels: list[Kernel] = field(default_factory=list)


@dataclass
class PlannedStep:
    """A node as the planned run executes it (same fields ``session._call`` reads from a Step)."""

    name: str
    op: str
    kernel: Kernel
    attrs: dict[str, Any]
    inputs: list[str]
    outputs: list[str]
    release: list[str] = field(default_factory=list)
    note: str = ""  # why the kernel differs from the op's default (profile shows it)


def owner_of(array: np.ndarray) -> object:
    """The object owning the array's memory (an ndarray, or the mmap/bytes under a view)."""
    base = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base


class Recorder:
    """Fed each node's inputs/outputs during the first run of a signature."""

    def __init__(self, program: Program, feeds: dict[str, np.ndarray]) -> None:
        self.record = Record()
        # id() of a freed buffer is soon reused by a new one, which would wrongly tie two
        # unrelated values together; a weak reference tells a live owner from a new one.
        self._owners: dict[int, tuple[Callable[[], object], int]] = {}
        for name, value in program.constants.items():
            self._note(name, value)
            self.record.static[name] = value
        for name, value in feeds.items():
            self._note(name, value)
        self._filters = dequantized_filters(program)

    def _note(self, name: str, value: np.ndarray) -> None:
        self.record.info[name] = ValueInfo(
            tuple(value.shape),
            value.dtype,
            self._token(owner_of(value)),
            bool(value.flags.writeable),
            memory_order(value),
        )

    def _token(self, owner: object) -> int:
        known = self._owners.get(id(owner))
        if known is not None and known[0]() is owner:
            return known[1]
        try:
            ref = weakref.ref(owner)
        except TypeError:  # not weakly referenceable (e.g. bytes): keep it; such owners live long
            ref = lambda owner=owner: owner  # noqa: E731
        token = self._next = getattr(self, "_next", 0) + 1
        self._owners[id(owner)] = (ref, token)
        return token

    def step(
        self, step: Step, kernel: Kernel, args: list[np.ndarray | None], results: list[np.ndarray]
    ) -> None:
        self.record.kernels.append(kernel)
        static = self.record.static
        known = all(not name or name in static for name in step.inputs)
        filter_ = known and bool(step.outputs) and step.outputs[0] in self._filters
        foldable = step.op not in NO_FOLD and (step.op in SHAPE_ONLY or known)
        in_bytes = sum(a.nbytes for a in args if a is not None)
        for name, value in zip(step.outputs, results, strict=False):
            if not name:
                continue
            self._note(name, value)
            if filter_ or (foldable and value.nbytes <= max(FOLD_SMALL_BYTES, in_bytes)):
                static[name] = value


@dataclass
class Built:
    steps: list[PlannedStep]
    constants: dict[str, np.ndarray]


def build(
    program: Program,
    record: Record,
    choose: Any,
    after_node: Callable[[], None] | None = None,
    use_jit: bool = False,
    shared: dict[str, np.ndarray] | None = None,
) -> Built:
    """The planned steps for one signature; ``choose(step, index, record)`` picks a node's kernel.

    ``after_node()`` is called after each node whose kernel was measured or whose weights
    were packed (the session drops weight pages from memory there, to keep the peak low);
    ``use_jit``: the session's JIT tier is on (fused nodes get JIT kernels); ``shared``: another
    plan's constants, whose packed weights this plan uses where it packs the same ones."""
    outputs = set(program.outputs)
    static = record.static
    steps: list[PlannedStep] = []
    packed: dict[str, np.ndarray] = dict(shared or {})
    for index, step in enumerate(program.steps):
        if all(not name or name in static for name in step.outputs):
            continue  # folded
        kernel, note = choose(step, index, record)
        inputs = _packed_inputs(step, kernel, record, packed)
        if after_node is not None and (note or inputs != step.inputs):
            after_node()
        steps.append(PlannedStep(step.name, step.op, kernel, step.attrs, inputs, step.outputs, note=note))
    steps = _fuse_gelu(steps, static, outputs)
    steps = fuse_qdq(steps, static, outputs, packed, use_jit, program)
    steps, shared = _write_parts_in_place(steps, record, outputs)
    used = {name for s in steps for name in s.inputs if name} | outputs
    constants = {name: _frozen(value) for name, value in {**static, **packed}.items() if name in used}
    _assign_releases(steps, outputs)
    _assign_inplace(steps, record, constants, outputs, set(program.inputs), shared)
    return Built(steps, constants)


def unoptimized(program: Program, record: Record) -> Built:
    """The program as the first run executed it (the fallback if planning itself fails)."""
    steps = [
        PlannedStep(s.name, s.op, kernel, s.attrs, s.inputs, s.outputs, list(s.release))
        for s, kernel in zip(program.steps, record.kernels, strict=True)
    ]
    return Built(steps, {})


def stand_in(info: ValueInfo) -> np.ndarray:
    """An array of the recorded shape and dtype that takes no memory (for shape-only uses)."""
    return np.broadcast_to(np.zeros((), dtype=info.dtype), info.shape)


def _packed_inputs(step: Step, kernel: Kernel, record: Record, packed: dict[str, np.ndarray]) -> list[str]:
    """The step's input names, with weights the kernel wants pre-packed (``kernel.pack``)
    replaced by plan constants holding the packed layout (computed once, shared by runs)."""
    pack = getattr(kernel, "pack", None)
    if pack is None:
        return list(step.inputs)
    values = [
        None if not name else record.static[name] if name in record.static else stand_in(record.info[name])
        for name in step.inputs
    ]
    inputs = list(step.inputs)
    for position, array in pack(values, step.attrs).items():
        if inputs[position] not in record.static:
            continue  # not fixed for this plan: the kernel takes the input as it comes
        name = f"{inputs[position]}@{kernel_name(kernel)}"
        packed.setdefault(name, array)
        inputs[position] = name
    return inputs


def _frozen(value: np.ndarray) -> np.ndarray:
    """Plan constants are shared by every run: make accidental writes fail loudly."""
    if value.flags.writeable:
        value = value.view()
        value.flags.writeable = False
    return value


def _assign_releases(steps: list[PlannedStep], keep: set[str]) -> None:
    last: dict[str, int] = {}
    for index, step in enumerate(steps):
        for name in (*step.outputs, *step.inputs):
            if name:
                last[name] = index
    for step in steps:
        step.release = []
    for name, index in last.items():
        if name not in keep:
            steps[index].release.append(name)


def _assign_inplace(
    steps: list[PlannedStep],
    record: Record,
    constants: dict[str, np.ndarray],
    outputs: set[str],
    feeds: set[str],
    shared: set[int],
) -> None:
    """Swap in an in-place kernel where an input can safely become the output buffer.

    ``shared``: owner tokens of values that now live inside another value's buffer (see
    ``_write_parts_in_place``); never overwritten."""
    info, root = record.info, _alias_roots(steps, record.info)
    # The last step reading any value of each owner group: a buffer may be overwritten only
    # after every alias of it is dead.  Constants, feeds and graph outputs never die.
    forever = math.inf
    group_end: dict[int, float] = {}
    for index, step in enumerate(steps):
        for name in (*step.inputs, *step.outputs):
            if name and name in info:
                owner = root(info[name].owner)
                group_end[owner] = max(group_end.get(owner, -1), index)
    for name, value in info.items():
        if name in constants or name in outputs or name in record.static or name in feeds:
            group_end[root(value.owner)] = forever
    for owner in shared:
        group_end[root(owner)] = forever
    for index, step in enumerate(steps):
        if not _plain(step) or len(step.outputs) != 1 or not step.outputs[0]:
            continue
        out = info.get(step.outputs[0])
        if out is None:
            continue
        for position in _inplace_candidates(step):
            name = step.inputs[position] if position < len(step.inputs) else ""
            value = info.get(name) if name else None
            if (
                value is None
                or not value.writeable
                or value.shape != out.shape
                or value.dtype != out.dtype
                or out.dtype.kind != "f"
                or group_end.get(root(value.owner), forever) > index
            ):
                continue
            kernel = _inplace_kernel(step, position)
            if kernel is not None:
                step.kernel = kernel
                step.note = f"{step.note}, in place on {name}" if step.note else f"in place on {name}"
                merged = max(group_end.get(root(out.owner), -1), group_end.get(root(value.owner), -1))
                group_end[root(out.owner)] = merged
                break


# numpy reshapes (and a Raster copying one contiguous block) give a view of a C-contiguous
# input and a copy of any other layout: whether their output shares the input's buffer can
# differ between the recorded run and later runs (kernels that leave results channels-last,
# planned kernels other than the first run's).
RESHAPES = frozenset({"Reshape", "Flatten"})


def _alias_roots(steps: list[PlannedStep], info: dict[str, ValueInfo]) -> Callable[[int], int]:
    """Owner tokens with the input and output of every reshape (and every Raster that may be a
    view) in one group, whatever was recorded."""
    parent: dict[int, int] = {}

    def root(token: int) -> int:
        while parent.get(token, token) != token:
            token = parent[token]
        return token

    for step in steps:
        source = step.inputs[0] if step.inputs else ""
        if step.op == "Raster" and raster.may_view(step.attrs):
            region = raster.compiled_regions(step.attrs)[0]
            source = step.inputs[region.input] if region.input < len(step.inputs) else ""
        elif step.op not in RESHAPES:
            continue
        if source in info and step.outputs and step.outputs[0] in info:
            a, b = root(info[source].owner), root(info[step.outputs[0]].owner)
            if a != b:
                parent[b] = a
    return root


def _plain(step: PlannedStep) -> bool:
    """Only nodes running the op's current default kernel (or the fused exact GELU) get an
    in-place form: a legacy or converter-specific kernel may mean something else."""
    if step.op == "Gelu":
        return step.kernel is inplace.gelu or (
            step.kernel is REGISTRY.get("Gelu") and step.attrs.get("approximate", "none") == "none"
        )
    return step.kernel is REGISTRY.get(step.op)


def _inplace_candidates(step: PlannedStep) -> list[int]:
    if step.op in inplace.UNARY_INPLACE:
        return [0]
    if (step.op, 0) in inplace.BINARY_INPLACE:
        return [0, 1]
    return []


def _inplace_kernel(step: PlannedStep, position: int) -> Kernel | None:
    if step.op in inplace.UNARY_INPLACE:
        return inplace.UNARY_INPLACE[step.op]
    return inplace.BINARY_INPLACE.get((step.op, position))


# -- concatenations written in place -------------------------------------------------------------


def _write_parts_in_place(
    steps: list[PlannedStep], record: Record, keep: set[str]
) -> tuple[list[PlannedStep], set[int]]:
    """A Raster copying whole values that other Rasters made (a concatenation of concatenations:
    a KV cache's per-layer concats stacked into the present state) gets its buffer made before
    the first of them; they write straight into their slices (``raster_into``) and it copies
    only the rest, saving one copy of every such part.

    Returns the new steps and the owner tokens of the values now living inside such a buffer.
    """
    producer = {o: i for i, s in enumerate(steps) for o in s.outputs if o}
    info, shared = record.info, set()
    allocations: dict[int, list[PlannedStep]] = {}
    for index, step in enumerate(steps):
        parts = _whole_parts(step, steps, producer, info, keep)
        if not parts:
            continue
        target, buffer = step.outputs[0], f"{step.outputs[0]}@buffer"
        for region, part_index in parts:
            part = steps[part_index]
            offset = raster.compiled_regions(step.attrs)[region].dst_offset
            steps[part_index] = replace(
                part,
                kernel=raster.raster_into,
                attrs={**part.attrs, "into_offset": offset},
                inputs=[*part.inputs, buffer],
                note=_noted(part.note, f"written into {target}"),
            )
            shared.add(info[part.outputs[0]].owner)
        # the target holds the parts: overwriting it in place would overwrite a part still read later
        shared.add(info[target].owner)
        done = {region for region, _ in parts}
        steps[index] = replace(
            step,
            kernel=raster.raster_into,
            attrs={**raster.without_regions(step.attrs, done), "into_offset": 0},
            inputs=[*step.inputs, buffer],
            note=_noted(step.note, f"{len(done)} of its parts written in place"),
        )
        out = info[target]
        allocate = PlannedStep(
            f"{step.name}/buffer",
            "Allocate",
            raster.allocate,
            {"shape": list(out.shape), "dtype": out.dtype.str},
            [],
            [buffer],
            note=f"buffer of {target}",
        )
        allocations.setdefault(min(p for _, p in parts), []).append(allocate)
    ordered = []
    for index, step in enumerate(steps):
        ordered += [*allocations.get(index, []), step]
    return ordered, shared


def _whole_parts(
    step: PlannedStep,
    steps: list[PlannedStep],
    producer: dict[str, int],
    info: dict[str, ValueInfo],
    keep: set[str],
) -> list[tuple[int, int]]:
    """(region index, producing step index) of each region of a plain Raster that copies the
    whole of a value another plain Raster made, read by this region alone, into one
    contiguous block of the same dtype."""
    plain = REGISTRY["Raster"]
    if step.op != "Raster" or step.kernel is not plain or "fill" in step.attrs or step.outputs[0] not in info:
        return []
    regions = raster.compiled_regions(step.attrs)
    readers = [region.input for region in regions]
    parts = []
    for position, region in enumerate(regions):
        name = step.inputs[region.input]
        index = producer.get(name, -1)
        value = info.get(name)
        if (
            not name
            or name in keep
            or value is None
            or not 0 <= index < len(steps)
            or steps[index].op != "Raster"
            or steps[index].kernel is not plain
            or step.inputs.count(name) != 1
            or readers.count(region.input) != 1
            or value.dtype != info[step.outputs[0]].dtype
        ):
            continue
        size = list(region.size)
        if (
            math.prod(size) == math.prod(value.shape)
            and region.src_offset == 0
            and raster.c_order(list(region.src_strides), size)
            and raster.c_order(list(region.dst_strides), size)
        ):
            parts.append((position, index))
    return parts


def _noted(note: str, more: str) -> str:
    return f"{note}, {more}" if note else more


# -- pattern fusion -------------------------------------------------------------------------------


def _scalar(static: dict[str, np.ndarray], name: str) -> float | None:
    value = static.get(name)
    if value is None or value.size != 1 or value.dtype.kind != "f":
        return None
    return float(value.reshape(()))


def _other(step: PlannedStep, name: str) -> str | None:
    """The other input of a binary step, if ``name`` is one of its two inputs."""
    if len(step.inputs) != 2 or name not in step.inputs:
        return None
    return step.inputs[1] if step.inputs[0] == name else step.inputs[0]


def _fuse_gelu(steps: list[PlannedStep], static: dict[str, np.ndarray], keep: set[str]) -> list[PlannedStep]:
    """x/sqrt2 (or x*(1/sqrt2)) -> Erf -> +1 -> *x -> *0.5 (torch's exact GELU) becomes one Gelu."""
    readers: dict[str, list[int]] = {}
    for index, step in enumerate(steps):
        for name in step.inputs:
            if name:
                readers.setdefault(name, []).append(index)
    producer = {o: i for i, s in enumerate(steps) for o in s.outputs if o}

    def only_reader(name: str) -> PlannedStep | None:
        found = readers.get(name, [])
        return steps[found[0]] if len(found) == 1 and name not in keep else None

    drop: set[int] = set()
    for erf in steps:
        if erf.op != "Erf" or not erf.inputs or erf.inputs[0] not in producer:
            continue
        scale_step = steps[producer[erf.inputs[0]]]
        x = _gelu_input(scale_step, static)
        add = only_reader(erf.outputs[0])
        if x is None or add is None or add.op != "Add":
            continue
        if _scalar(static, _other(add, erf.outputs[0]) or "") != 1.0:
            continue
        mul1 = only_reader(add.outputs[0])
        if mul1 is None or mul1.op != "Mul" or _other(mul1, add.outputs[0]) != x:
            continue
        mul2 = only_reader(mul1.outputs[0])
        if mul2 is None or mul2.op != "Mul" or _scalar(static, _other(mul2, mul1.outputs[0]) or "") != 0.5:
            continue
        if only_reader(scale_step.outputs[0]) is not erf:
            continue
        chain = [scale_step, erf, add, mul1]
        drop.update(steps.index(s) for s in chain)
        position = steps.index(mul2)
        steps[position] = PlannedStep(
            mul2.name, "Gelu", inplace.gelu, {}, [x], list(mul2.outputs), note="fused Div/Erf/Add/Mul/Mul"
        )
    return [s for i, s in enumerate(steps) if i not in drop]


def _gelu_input(step: PlannedStep, static: dict[str, np.ndarray]) -> str | None:
    if len(step.inputs) != 2:
        return None
    x, c = step.inputs
    value = _scalar(static, c)
    if value is None:
        return None
    if step.op == "Div" and abs(value - math.sqrt(2)) < 1e-6:
        return x
    if step.op == "Mul" and abs(value - 1 / math.sqrt(2)) < 1e-6:
        return x
    return None
