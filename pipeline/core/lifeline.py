"""Imported first by the fork server that `OrderedPool` forks its workers from: the kernel kills
the server when the caller that started it dies (PR_SET_PDEATHSIG), and with it, the same way,
every worker forked from it. Without this a SIGKILLed caller would leave the server and its
workers waiting for work forever (each worker holds the server's "caller alive" pipe open, so
the server never sees it close)."""

from pipeline.core.executor import _kill_me_with_parent

_kill_me_with_parent()
