"""Processes that die with the process that started them, however it dies.

Linux's `prctl(PR_SET_PDEATHSIG, sig)` asks the kernel to send `sig` to a process when its parent
thread ends, SIGKILL of the parent included, and the setting survives `execve` (prctl(2): "This
value is preserved across execve(2)", except for set-user-ID programs). It is cleared in a fork's
child, so every level sets it for itself: `make run`'s steps (launch.kfp_local) and each step's
replicas (local.jobs). It is set by a small exec shim, not a `preexec_fn`: running Python between
fork and exec crashes when gRPC is loaded (the launcher and the tuner load aiplatform's types) and
forces a plain fork. Elsewhere than Linux the command runs unchanged.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

# argv[1] is the signal number, argv[2] the parent's pid, argv[3:] the command to exec. A parent
# that died before prctl took effect left the shim to another (init): it signals itself, as the
# kernel would have (prctl(2) advises this check of getppid()).
_SHIM = (
    "import ctypes, os, sys\n"
    "try:\n"
    "    ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, int(sys.argv[1]))\n"  # 1 = PR_SET_PDEATHSIG
    "except (OSError, AttributeError):\n"
    "    pass\n"
    "if os.getppid() != int(sys.argv[2]):\n"
    "    os.kill(os.getpid(), int(sys.argv[1]))\n"
    "os.execvp(sys.argv[3], sys.argv[3:])\n"
)


def with_parent_death_signal(command: Sequence[str], signum: int = signal.SIGKILL) -> list[str]:
    """`command`, started so that the kernel sends it `signum` when its parent dies (this process
    must be the one that starts it)."""
    if not sys.platform.startswith("linux"):
        return list(command)
    return [sys.executable, "-c", _SHIM, str(int(signum)), str(os.getpid()), *command]
