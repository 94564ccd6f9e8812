"""Child processes that do not outlive agentrft.

A `finally` stops a child on a normal exit, an exception or Ctrl-C, but not when agentrft is
killed (SIGKILL, or SIGTERM, whose default action runs no Python code). `die_with_parent` runs
in the child before it execs (`Popen(preexec_fn=...)`) and asks the kernel to signal the child
when its parent dies (Linux: prctl PR_SET_PDEATHSIG); elsewhere it does nothing and the
`finally` is what stops the child. Used for the environment server, the vLLM engine and the
service's workers.
"""

from __future__ import annotations

import contextlib
import signal
import sys

PR_SET_PDEATHSIG = 1  # prctl(2)


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Have the kernel send `sig` to this process when its parent exits, however it exits."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
