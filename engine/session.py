"""Session: load a Ferry package once, then run it on numpy feeds."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import ThreadpoolController

from engine import batch_split, debug, planner, selftest, team
from engine import jit as jit_tier
from engine.allocator import tune_malloc
from engine.errors import EngineError, NodeExecutionError, PackageError
from engine.format import read_package, release_pages
from engine.jit_needs import jit_ops, jit_unused
from engine.ops.registry import kernel_name
from engine.plan import Plan, PlanCache, Signature
from engine.plan_threads import ThreadChoice
from engine.planner import PlannedStep, Record, Recorder
from engine.program import Program, Step, compile_program
from engine.search import KernelSearch, weights_evictor, weights_stay_cached
from engine.tensor_specs import check_feeds, read_specs

_controller: ThreadpoolController | None = None


def _threadpools() -> ThreadpoolController:
    """One controller for the process: discovering the BLAS libraries is the slow part."""
    global _controller
    if _controller is None:
        _controller = ThreadpoolController()
    return _controller


@dataclass(frozen=True)
class NodeTiming:
    node: str
    op: str
    kernel: str
    seconds: float
    note: str = ""  # why the planner picked this kernel: in place, fused, measured choice


@dataclass(frozen=True)
class SelfTestResult:
    """The package's stored self-test vectors re-run here; ``passed`` if every output is within tolerance."""

    passed: bool
    max_abs_error: float
    failures: list[str]


class Session:
    """A loaded model.  Not thread-safe: use one Session per thread.

    ``threads`` caps the BLAS thread pool during runs (default: every core), and the JIT
    kernels' threads; planned runs use one thread instead where their recent runs found that
    faster (a busy machine: ``engine.plan_threads``).  A batch (every input's leading dim
    symbolic and equal) runs as one-thread parts on as many threads where the first run showed
    the parts give the same outputs (``engine.batch_split``).  ``jit`` (default: whether numba is
    installed and ``FERRY_JIT`` is not 0) lets the kernel search consider JIT kernels;
    ``jit=False`` runs numpy kernels only.
    Creating a Session with the JIT tier compiles its kernels (or loads them from numba's
    on-disk cache, see ``engine.jit``), so no run pays for that.  ``verify`` as in
    ``engine.format.read_package`` (False for a graph inside a package already verified whole).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        threads: int | None = None,
        jit: bool | None = None,
        verify: bool | None = None,
    ) -> None:
        if threads is None:
            threads = os.cpu_count() or 1
        if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
            raise ValueError(f"threads must be a positive int, got {threads!r}")
        tune_malloc()  # once per process: keep run-sized blocks in the heap between runs
        self.path = Path(path)
        self.threads = threads
        try:
            package = read_package(self.path, verify=verify)
            self.inputs = read_specs(package.manifest.get("inputs"), "inputs", self.path)
            self.outputs = read_specs(package.manifest.get("outputs"), "outputs", self.path)
            self._program = compile_program(package.graph, package.tensors, str(self.path))
        except EngineError:
            raise
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise PackageError(f"{self.path}: unreadable package ({exc})") from exc
        self.metadata: dict[str, Any] = package.manifest.get("metadata", {})
        self._tensors = package.tensors
        self._weights = package.weights
        self._check_specs_match_graph()
        self._plans = PlanCache()
        # per plan (input shapes): each one's runs on ``threads`` and on 1, for the faster
        self._thread_choices: dict[Signature, ThreadChoice] = {}
        self._records: dict[Signature, Record] = {}  # first runs awaiting their plan
        # a multi-thread session's plans for its runs on one thread, and the records they need
        self._plans_one = PlanCache()
        self.jit = jit_tier.enabled() if jit is None else bool(jit) and jit_tier.enabled()
        self._digest = _digest(package.manifest, package.graph)
        self._search = KernelSearch(self._digest, threads, self.jit)
        # batched signatures run in parts, one per thread (engine.batch_split): per signature
        # the part count once checked (0: runs whole), the first run's feeds and outputs before
        self._splits: dict[Signature, int] = {}
        self._split_refs: dict[Signature, tuple[dict, dict]] = {}
        self._part_search: KernelSearch | None = None  # the parts' kernels, measured on one thread
        if self.jit:
            jit_tier.load(ops=jit_ops(self._program), threads=threads, skip=jit_unused(self._program))
        self._flush = _cache_flush() if self.jit else None  # for the kernel search
        self._resident: bool | None = None  # whether the weights stay cached: _weights_cached
        self._team_possible = self.jit and team.possible(threads, self._program.steps)
        if self._team_possible:
            team.prepare()  # its kernels compiled now, with the rest, for plans that use it

    def __repr__(self) -> str:
        return f"Session({str(self.path)!r}, inputs={[s.name for s in self.inputs]}, threads={self.threads})"

    # -- public API -----------------------------------------------------------------------------

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the model; feeds must match ``inputs`` exactly (names, dtypes, fixed dims)."""
        return self._run(feeds, on_node=None)

    def profile(self, feeds: Mapping[str, np.ndarray]) -> list[NodeTiming]:
        """Run once and return each node's kernel and wall time, in execution order.

        This is a planned run: nodes folded for these input shapes do not appear, fused
        nodes appear once (under the last node's name), and ``kernel`` says which kernel
        ran and ``note`` the planner's reason (in place, fused, measured choice and timings).
        A batch a multi-thread Session runs in parts (``engine.batch_split``) lists each part's
        nodes in turn.
        """
        timings: list[NodeTiming] = []

        def record(node: str, op: str, kernel: str, seconds: float, note: str = "") -> None:
            timings.append(NodeTiming(node, op, kernel, seconds, note))

        signature = self._check_feeds(feeds)
        for _ in range(2):  # plan first (record, then build): the profile shows what later runs do
            if debug.enabled() or self._plans.get(signature) is not None or self._splits.get(signature):
                break
            self._run(feeds, on_node=None)
        self._run(feeds, on_node=record)
        return timings

    def self_test(self) -> SelfTestResult:
        """Run the input vectors the converter stored and compare with its expected outputs."""
        spec = self.metadata.get("selftest")
        if not spec:
            raise PackageError(f"{self.path}: the package has no self-test vectors")
        dtypes = {s.name: s.dtype for s in self.inputs}
        got = self.run(selftest.feeds(spec, self._tensors, dtypes))
        failures, worst = [], 0.0
        for name, tensor in spec["outputs"].items():
            expected, value = self._tensors[tensor], selftest.observed(spec, name, got[name])
            error = float(np.max(np.abs(value.astype(np.float64) - expected), initial=0.0))
            worst = max(worst, error)
            if value.shape != expected.shape or not np.allclose(
                value, expected, atol=spec.get("atol", 1e-4), rtol=spec.get("rtol", 1e-3), equal_nan=True
            ):
                failures.append(f"output {name!r}: max abs error {error:.3g}")
        return SelfTestResult(passed=not failures, max_abs_error=worst, failures=failures)

    # -- running --------------------------------------------------------------------------------

    def _run(self, feeds: Mapping[str, np.ndarray], on_node: Callable | None) -> dict[str, np.ndarray]:
        signature = self._check_feeds(feeds)
        # numpy scalars -> 0-d; other layouts -> C order, so what the plan recorded about
        # buffers shared between values holds for every later run of the signature
        arrays = {name: _c_order(np.asarray(value)) for name, value in feeds.items()}
        parts = self._parts(signature, arrays)
        if parts:
            joined = self._run_split(signature, arrays, parts, on_node)
            if joined is not None:
                return joined
        if parts and signature not in self._splits:
            # The reference run is on one thread: it is the only run of the signature with pool
            # threads at all, and a busy machine made it the slowest by far (UNet: 5.6-12.5 s at 2
            # threads against 0.3 s a planned step); an idle one loses half of one run.
            outputs = self._run_whole(signature, arrays, feeds, on_node, 1, self._search)
            self._keep_reference(signature, arrays, outputs)
            return outputs
        return self._run_whole(signature, arrays, feeds, on_node, self.threads, self._search)

    def _run_whole(
        self,
        signature: Signature,
        arrays: dict[str, np.ndarray],
        feeds: Mapping[str, np.ndarray],
        on_node: Callable | None,
        threads: int,
        search: KernelSearch,
    ) -> dict[str, np.ndarray]:
        """One run of the whole graph on ``threads``: recorded (a signature's first run), or
        planning then planned (its second), or planned."""
        plan = self._plans.get(signature)
        if plan is not None and on_node is None and not debug.enabled():
            return self._run_plan(plan, arrays, feeds, threads)
        record = self._records.get(signature) if plan is None and not debug.enabled() else None
        # whether a plan's runs share their GEMMs with the team (team.py) is decided at planning
        steps = self._program.steps
        with_team = plan.team if plan is not None else self.jit and team.wanted(threads, steps, record)
        if plan is None and record is None and self._team_possible and not debug.enabled():
            # A signature's first run, where later ones may go to the team, is on one thread:
            # OpenBLAS's threads spin for ~0.1 s after a call, and took the team worker's core
            # through MobileNetV2's first ten planned runs (8.5 against 5.3 ms at 2 threads), so
            # the thread choice, sampling those first, kept it on one thread.
            threads = 1
        with self._threads(threads, with_team):
            if record is not None:
                # Second run of a signature: plan now (search, packing), so the first result
                # comes as fast as a plain run and the planning cost lands on the next one.
                del self._records[signature]
                plan = self._plan(signature, record, search, with_team=with_team)
                self._plans.put(plan)
            if plan is None or debug.enabled():
                # The first run of a signature (or a FERRY_DEBUG run) goes node by node and
                # records what the plan needs; every later run executes the plan.
                recorder = Recorder(self._program, arrays) if plan is None else None
                env = self._execute_program(arrays, on_node, recorder, search)
                if recorder is not None:
                    self._records[signature] = recorder.record
                    while len(self._records) > self._plans.capacity:
                        self._records.pop(next(iter(self._records)))
            else:
                env = _execute_plan(plan, self._program.constants, arrays, on_node)
        if record is not None and threads > 1:
            # its one-thread plan too, in this planning run: the thread choice samples one thread
            # within a few runs, and building it there put ResNet18's 5th run at 200-280 ms
            self._plan_one_thread(plan, record)
        return {name: _owned(env[name], feeds) for name in self._program.outputs}

    @contextlib.contextmanager
    def _threads(self, threads: int, with_team: bool = False) -> Iterator[None]:
        """A run (or its planning) on ``threads``: the thread pools capped, and with several and
        ``with_team`` the team's worker spinning (team.py), which takes OpenBLAS's second thread."""
        with (
            team.session_run(with_team, threads) as blas_threads,
            _threadpools().limit(limits=blas_threads),
            jit_tier.thread_limit(threads),
        ):
            yield

    def _plan(
        self,
        signature: Signature,
        record: Record,
        search: KernelSearch,
        shared: dict | None = None,
        with_team: bool = False,
    ) -> Plan:
        """A signature's plan from its recorded run, kernels chosen by ``search``."""
        try:
            built = planner.build(
                self._program,
                record,
                lambda step, index, rec: self._choose_kernel(step, index, rec, search),
                after_node=lambda: release_pages(self._weights),
                use_jit=self.jit,
                shared=shared,
            )
        except Exception:  # noqa: BLE001 - planning is an optimisation: never fail a run over it
            built = planner.unoptimized(self._program, record)
        search.save()
        release_pages(self._weights)  # weights now pre-packed are never read again
        return Plan(signature, tuple(built.steps), built.constants, with_team)

    def _plan_one_thread(self, plan: Plan, record: Record) -> None:
        """The plan for a multi-thread session's runs on one thread (``ThreadChoice``), from
        ``plan``'s record: kernels measured on one thread, since those chosen for several can be
        slower alone (MobileNetV2: 1.16x), packed weights shared with ``plan`` where both pack
        them alike.  Runs on one thread take ``plan`` itself once this one is evicted."""
        if self._part_search is None:
            self._part_search = KernelSearch(self._digest, 1, self.jit)
        with _threadpools().limit(limits=1), jit_tier.thread_limit(1):
            found = self._plan(plan.signature, record, self._part_search, shared=plan.constants)
        self._plans_one.put(found)

    def _run_plan(
        self, plan: Plan, arrays: dict[str, np.ndarray], feeds: Mapping[str, np.ndarray], threads: int
    ) -> dict[str, np.ndarray]:
        """A planned run on the thread count its ``ThreadChoice`` picks, timed for it."""
        choice = self._thread_choice(plan.signature, threads)
        threads = choice.pick()
        if threads == 1 and self.threads > 1:
            plan = self._plans_one.get(plan.signature) or plan
        start = time.perf_counter()
        with self._threads(threads, plan.team):
            env = _execute_plan(plan, self._program.constants, arrays, None)
        choice.record(threads, time.perf_counter() - start)
        return {name: _owned(env[name], feeds) for name in self._program.outputs}

    def _thread_choice(self, signature: Signature, threads: int) -> ThreadChoice:
        choice = self._thread_choices.get(signature)
        if choice is None:
            choice = self._thread_choices[signature] = ThreadChoice(threads)
            while len(self._thread_choices) > self._plans.capacity:  # as the plans: bounded
                self._thread_choices.pop(next(iter(self._thread_choices)))
        return choice

    # -- data-parallel runs (engine.batch_split) -------------------------------------------------

    def _parts(self, signature: Signature, arrays: dict[str, np.ndarray]) -> int:
        """How many parts a run of this signature goes in (0: whole), see ``engine.batch_split``."""
        if self.threads < 2 or self._splits.get(signature) == 0 or debug.enabled():
            return 0
        return batch_split.part_count(self.inputs, arrays, self.threads)

    def _run_split(
        self, signature: Signature, arrays: dict[str, np.ndarray], parts: int, on_node: Callable | None
    ) -> dict[str, np.ndarray] | None:
        """The batch run as ``parts`` one-thread runs on as many threads, once the first run's
        outputs showed the parts give the same; None where the whole batch must run."""
        if signature not in self._splits:
            reference = self._split_refs.pop(signature, None)
            if reference is None:
                return None  # the first run: the whole batch, kept as the reference
            self._splits[signature] = parts if self._split_agrees(reference, parts) else 0
            if not self._splits[signature]:
                return None
            self._records.pop(signature, None)  # the whole batch is never planned
        pieces = batch_split.split(arrays, parts)
        plan = self._plans.get(self._check_feeds(pieces[0]))
        if plan is None or on_node is not None:
            # a profile (each node timed), or the part's plan evicted: one part after another
            return batch_split.join([self._run_part(piece, on_node) for piece in pieces])
        choice = self._thread_choice(signature, parts)  # in parts on threads, or one after another
        threads = choice.pick()
        start = time.perf_counter()
        with _threadpools().limit(limits=1), jit_tier.thread_limit(1):
            if threads > 1:
                results = batch_split.run_parts(lambda piece: self._run_planned_part(plan, piece), pieces)
            else:
                results = [self._run_planned_part(plan, piece) for piece in pieces]
        choice.record(threads, time.perf_counter() - start)
        return batch_split.join(results)

    def _run_part(self, piece: dict[str, np.ndarray], on_node: Callable | None) -> dict[str, np.ndarray]:
        """One part on this thread alone (recorded, planned and searched as a 1-thread session)."""
        if self._part_search is None:
            self._part_search = KernelSearch(self._digest, 1, self.jit)
        return self._run_whole(self._check_feeds(piece), piece, piece, on_node, 1, self._part_search)

    def _run_planned_part(self, plan: Plan, piece: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A planned part, on whichever thread takes it (reads the session, changes nothing)."""
        env = _execute_plan(plan, self._program.constants, piece, None)
        return {name: env[name] for name in self._program.outputs}

    def _split_agrees(self, reference: tuple[dict, dict], parts: int) -> bool:
        """Whether the reference run's feeds, in parts, give its outputs (the parts' signature
        is recorded and planned on the way)."""
        feeds, want = reference
        try:
            got = batch_split.join([self._run_part(p, None) for p in batch_split.split(feeds, parts)])
        except Exception:  # noqa: BLE001 - a graph that cannot run in parts (a batch baked into a Reshape) runs whole
            return False
        return batch_split.agree(got, want)

    def _keep_reference(
        self, signature: Signature, arrays: dict[str, np.ndarray], outputs: dict[str, np.ndarray]
    ) -> None:
        """A first run's feeds and outputs (copies: the caller may reuse its arrays)."""
        self._split_refs[signature] = (
            {name: value.copy() for name, value in arrays.items()},
            {name: np.array(value, copy=True) for name, value in outputs.items()},
        )
        while len(self._split_refs) > self._plans.capacity:
            self._split_refs.pop(next(iter(self._split_refs)))

    def _execute_program(
        self,
        feeds: dict[str, np.ndarray],
        on_node: Callable | None,
        recorder: Recorder | None,
        search: KernelSearch,
    ) -> dict[str, np.ndarray]:
        program: Program = self._program
        env: dict[str, np.ndarray] = {**program.constants, **feeds}
        show = debug.enabled()
        for step in program.steps:
            args = [env[name] if name else None for name in step.inputs]
            kernel = self._unplanned_kernel(step, args, search)
            if show:
                for name, value in zip(step.inputs, args, strict=True):
                    if value is not None:
                        debug.report_input(step.name, step.op, name, value)
            start = time.perf_counter()
            results = _call(step, kernel, args)
            if on_node is not None:
                on_node(step.name, step.op, kernel_name(kernel), time.perf_counter() - start)
            if recorder is not None:
                recorder.step(step, kernel, args, results)
            for name, value in zip(step.outputs, results, strict=False):
                if name:
                    env[name] = value
                    if show:
                        debug.report(step.name, step.op, name, value)
            for name in step.release:
                env.pop(name, None)
        return env

    def _unplanned_kernel(self, step: Step, args: list[np.ndarray | None], search: KernelSearch) -> Callable:
        """A first run's kernel: this device's cached search choice where it needs no packing,
        else the selector's pick from the input shapes."""
        if search.handles(step.op):
            shapes = [None if a is None else a.shape for a in args]
            cached = search.cached(step.op, step.name, step.attrs, shapes, _choose(step, args))
            if cached is not None:
                return cached
        return _choose(step, args)

    def _choose_kernel(
        self, step: Step, index: int, record: Record, search: KernelSearch
    ) -> tuple[Callable, str]:
        """The kernel a planned node runs: the measured fastest for heavy ops (engine.search),
        otherwise the one its selector picked in the first run."""
        if not search.handles(step.op):
            return record.kernels[index], ""
        static = [bool(name) and name in record.static for name in step.inputs]
        shapes = [record.info[name].shape if name else None for name in step.inputs]

        def make_inputs() -> list[np.ndarray | None]:
            rng = np.random.default_rng(0)
            inputs: list[np.ndarray | None] = []
            for name, fixed in zip(step.inputs, static, strict=True):
                if not name or fixed:
                    inputs.append(record.static[name] if name else None)
                    continue
                info = record.info[name]
                kind = info.dtype.kind
                value = rng.standard_normal(info.shape) if kind == "f" else np.zeros(info.shape)
                # laid out as the run had it: a kernel's cost depends on its input's layout
                inputs.append(planner.in_memory_order(value.astype(info.dtype), info.order))
            return inputs

        default = record.kernels[index]
        fixed = [name for name, known in zip(step.inputs, static, strict=True) if known]
        one_row = bool(shapes) and shapes[0] is not None and math.prod(shapes[0][:-1]) == 1
        positions = [i for i, known in enumerate(static) if known]
        evict = weights_evictor(
            record.static, fixed, one_row, self._flush, positions, lambda: self._weights_cached(record.static)
        )
        chosen = search.choose(step.op, step.name, step.attrs, shapes, static, make_inputs, default, evict)
        _note_output_order(record, step, search.output_orders)
        return chosen

    def _weights_cached(self, static: dict[str, np.ndarray]) -> bool:
        """Whether this model's weights stay cached between runs (``weights_stay_cached``),
        measured once per session: the weights are the same for every plan."""
        if self._resident is None:
            self._resident = self._flush is None or weights_stay_cached(static, self._flush)
        return self._resident

    # -- validation -----------------------------------------------------------------------------

    def _check_feeds(self, feeds: Mapping[str, np.ndarray]) -> Signature:
        return check_feeds(self.inputs, feeds)

    def _check_specs_match_graph(self) -> None:
        names = [spec.name for spec in self.inputs]
        if sorted(names) != sorted(self._program.inputs):
            raise PackageError(
                f"{self.path}: manifest inputs {names} do not match graph inputs {self._program.inputs}"
            )


def _note_output_order(record: Record, step: Step, orders: dict[str, tuple[int, ...] | None]) -> None:
    """The memory order the measured choice leaves its output in, for the nodes measured after
    it (the first run's kernels may have left another: a channels-last chain of convs would
    otherwise be timed on NCHW inputs it never sees in the plan)."""
    if step.name in orders and step.outputs and step.outputs[0] in record.info:
        info = record.info[step.outputs[0]]
        record.info[step.outputs[0]] = replace(info, order=orders[step.name])


def _digest(manifest: dict[str, Any], graph: dict[str, Any]) -> str:
    """The model's identity for the kernel-choice cache: graph.json's sha256 from the manifest."""
    for entry in manifest.get("files", []):
        if entry.get("path") == manifest.get("graph", "graph.json") and entry.get("sha256"):
            return str(entry["sha256"])
    return hashlib.sha256(json.dumps(graph, sort_keys=True, default=str).encode()).hexdigest()


def _execute_plan(
    plan: Plan, constants: dict[str, np.ndarray], feeds: dict[str, np.ndarray], on_node: Callable | None
) -> dict[str, np.ndarray]:
    """The planned run: the tightest loop we can write, since per-node overhead is what a
    small model (a decode step) spends most of its time on.  The first run of the signature
    already checked each kernel's outputs, so only failures are wrapped here."""
    env: dict[str, np.ndarray] = {**constants, **plan.constants, **feeds}
    ndarray = np.ndarray
    for step in plan.steps:
        args = [env[name] if name else None for name in step.inputs]
        start = time.perf_counter() if on_node is not None else 0.0
        try:
            results = step.kernel(args, step.attrs)
        except Exception as exc:  # noqa: BLE001 - every kernel failure is reported the same way
            raise _failure(step, args, exc) from exc
        if on_node is not None:
            on_node(step.name, step.op, kernel_name(step.kernel), time.perf_counter() - start, step.note)
        for name, value in zip(step.outputs, results, strict=False):
            if name:
                env[name] = value if type(value) is ndarray else np.asarray(value)
        for name in step.release:
            del env[name]
    return env


def _cache_flush() -> Callable[[np.ndarray], None] | None:
    """flush_jit's clflush, with which the kernel search times a one-row product's weights out of
    cache (``weights_evictor``); loaded with the session's JIT kernels, none where it loaded
    none (a numpy-only session stays without numba) or the CPU has no clflush."""
    if not jit_tier.loaded():
        return None
    module = jit_tier.module("engine.ops.flush_jit")
    return module.flush if module.AVAILABLE else None


def _choose(step: Step, args: list[np.ndarray | None]) -> Callable:
    if step.select is None:
        return step.kernel
    return step.select(step.attrs, [None if a is None else a.shape for a in args])


def _call(step: Step | PlannedStep, kernel: Callable, args: list[np.ndarray | None]) -> list[np.ndarray]:
    """Run one kernel; any failure becomes a NodeExecutionError naming the node and its inputs."""
    try:
        results = [np.asarray(r) for r in kernel(args, step.attrs)]
    except Exception as exc:  # noqa: BLE001 - every kernel failure is reported the same way
        raise _failure(step, args, exc) from exc
    missing = [name for name in step.outputs[len(results) :] if name]
    if missing:
        raise NodeExecutionError(
            f"node {step.name!r} ({step.op}) produced {len(results)} outputs; nothing computed {missing}"
        )
    return results


def _failure(step: Step | PlannedStep, args: list[np.ndarray | None], exc: Exception) -> NodeExecutionError:
    shapes = ", ".join(
        f"{name or '<none>'}: " + ("-" if a is None else f"{a.dtype.name}{list(a.shape)}")
        for name, a in zip(step.inputs, args, strict=True)
    )
    return NodeExecutionError(
        f"node {step.name!r} ({step.op}) failed on inputs [{shapes}]: {type(exc).__name__}: {exc}"
    )


def _c_order(value: np.ndarray) -> np.ndarray:
    return value if value.flags.c_contiguous else np.ascontiguousarray(value)


def _owned(value: np.ndarray, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
    """Outputs the caller may keep and modify, in C order: never read-only weights, views of
    its own feeds, or a kernel's channels-last result seen through a transposed view."""
    if not value.flags.writeable or any(np.may_share_memory(value, f) for f in feeds.values()):
        return value.copy()
    return value if value.flags.c_contiguous else np.ascontiguousarray(value)
