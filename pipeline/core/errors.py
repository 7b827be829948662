"""The two kinds of failure a command can end with, and their exit codes.

Expected problems in the *data* never raise: they become a status and a reason. These
exceptions are for the operator's mistakes (exit 2) and for work that could not finish (exit 1).
"""


class UsageError(Exception):
    """Bad usage or bad input the user must fix: one clear sentence, exit code 2."""

    exit_code = 2


class StageFailed(Exception):
    """The stage could not finish (disk full, a broken invariant): exit code 1."""

    exit_code = 1


class Terminated(KeyboardInterrupt):
    """Not a failure: a SIGTERM (a scheduler preempting the job) that the command honoured by stopping
    where it can continue. Ended like Ctrl-C ("interrupted: ..."), with the exit code a shell reports
    for SIGTERM, 143 (128 + 15), so a job script tells a preemption from Ctrl-C (130) and failures."""

    exit_code = 143
