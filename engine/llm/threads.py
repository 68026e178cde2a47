"""How many threads an LLM's kernels run on, and which pool gets them.

With the JIT tier (numba's kernels or their ahead-of-time build), the LLM's heavy work (its
GEMMs, GEMVs and fused decode layers) runs on Ferry's threads (model.py's prefill parts,
spread.py's decode workers, numba's pool for a lone parallel kernel); numpy's OpenBLAS is left
one thread.  OpenBLAS's own worker threads spin after each call (attention's products, the
float tiles of prefill) and took the cores numba's workers needed:
SmolLM2-135M's shapes at 2 threads on a 2-core AMD EPYC (Zen 3, AVX2), OpenBLAS at 2 threads
-> 1: int8 prefill 156 -> 229 tok/s, int4 prefill 208 -> 273, int4 decode 66 -> 79.  Without
the JIT tier numpy's BLAS is the only pool and gets them all.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from engine import jit

# the LLM's JIT ops (engine/jit.py's MODULES), for compiling their parallel variants up front
OPS = ("LlmGemvInt4", "LlmGemvInt8", "LlmDecodeLayer", "LlmDecodeAttention", "LlmDecodeSpread")

_controller_lock = threading.Lock()
_controller = None  # threadpoolctl's controller, made once: finding the BLAS libraries is slow


def _threadpools():  # noqa: ANN202 - threadpoolctl is imported here only
    global _controller
    with _controller_lock:
        if _controller is None:
            from threadpoolctl import ThreadpoolController  # noqa: PLC0415

            _controller = ThreadpoolController()
        return _controller


def prepare(threads: int) -> None:
    """Compile (or load) the LLM's kernels for ``threads``, their parallel variants too, now (at
    activation) rather than in the first request that runs on several threads.  Nothing when the
    ahead-of-time extension is loaded (aot.py): the converter's packages then run on it at any
    thread count, and importing numba here would add its ~150 MB to the process for nothing."""
    from engine.llm import aot  # noqa: PLC0415

    if aot.kernels() is not None:
        return
    jit.load(ops=OPS, threads=threads)


@contextlib.contextmanager
def running_on(threads: int) -> Iterator[None]:
    """On this thread, the LLM's kernels run on up to ``threads`` threads (see the module's note)."""
    threads = max(1, int(threads))
    blas = 1 if jit.enabled() else threads
    with _threadpools().limit(limits=blas), jit.thread_limit(threads):
        yield
