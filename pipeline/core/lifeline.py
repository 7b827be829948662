"""Imported first by the fork server that `OrderedPool` forks its workers from: the kernel kills
the server when the caller that started it dies (PR_SET_PDEATHSIG), and with it, the same way,
every worker forked from it. Without this a SIGKILLed caller would leave the server and its
workers waiting for work forever (each worker holds the server's "caller alive" pipe open, so
the server never sees it close)."""

import atexit
import os

from pipeline.core.executor import _kill_me_with_parent

_kill_me_with_parent()

# The server exits once the caller closes its "alive" pipe (`executor.stop_server`, which waits
# for it): it holds no files or results by then, and tearing down its interpreter (numpy, Pillow,
# the decoders) only kept the caller waiting ~20-30 ms at the end of every run. Handlers registered
# after this one (the preloaded modules') still run first; the workers forked from the server end
# with os._exit anyway.
atexit.register(os._exit, 0)
