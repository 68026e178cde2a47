"""Measure as a device with a current OpenBLAS runs (imported first by the bench scripts).

A device's image sets OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE for old OpenBLAS builds; they pin
OpenBLAS to a kernel set (and cache size) that may not be this CPU's best (Haswell's on an
AVX-512 CPU).  ``unset_overrides()`` re-executes the script without both, for that command
alone, before numpy loads OpenBLAS (which reads them once); FERRY_BENCH_UNSET then says what
was unset, for the script's header.  Tests keep them.
"""

from __future__ import annotations

import os
import sys

OPENBLAS_OVERRIDES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def unset_overrides(keep_when: str = "--child") -> None:
    """Re-execute this process without the overrides (not for argv holding ``keep_when``: a
    child the script starts inherits the parent's environment already)."""
    if not any(name in os.environ for name in OPENBLAS_OVERRIDES) or keep_when in sys.argv:
        return
    env = {k: v for k, v in os.environ.items() if k not in OPENBLAS_OVERRIDES}
    env["FERRY_BENCH_UNSET"] = ",".join(f"{k}={os.environ[k]}" for k in OPENBLAS_OVERRIDES if k in os.environ)
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def unset_note() -> str:
    """For a header: what was unset, or that nothing was set."""
    unset = os.environ.get("FERRY_BENCH_UNSET")
    return f"unset for this run: {unset}" if unset else "OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE not set"
