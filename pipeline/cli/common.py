"""Shared by the command modules: how a stage's failure becomes an exit code and one line."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import typer

from pipeline.core.errors import StageFailed, Terminated, UsageError
from pipeline.core.ui import shown

# What an interrupted command says about running it again: the one place that knows which
# commands pick up where they stopped. A command not listed here starts over, and says so.
START_OVER = "run the same command again to start over"
AFTER_INTERRUPT = {
    "clean": "run the same command again to resume",  # its journal keeps every finished file
    "shard": "run the same command again to resume",  # finished shards are kept (.pipe/shards.jsonl)
    "train": "run the same command with --resume to continue from RUN_DIR/last.pt, the last checkpoint written",
}


def folder_arg(value: str | Path):
    """A folder argument as the stages take it (`pipeline.storage.location`: a URL stays the text
    it is, anything else is a local Path)."""
    from pipeline.storage import location

    return location(value)


def exits_cleanly(fn):
    """Run a command body; UsageError -> exit 2, StageFailed -> exit 1, Ctrl-C -> 130, a SIGTERM the
    command stopped for (`Terminated`) -> 143, one line each, scrubbed (`pipeline.storage.secrets`:
    an error may quote an endpoint's credentials), as is whatever a library warns or logs on its own
    while the command runs."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from pipeline.storage.secrets import install, scrub

        install()
        try:
            return fn(*args, **kwargs)
        except UsageError as e:
            sys.stderr.write(f"pipe: error: {shown(scrub(str(e)))}\n")
            raise typer.Exit(2) from None
        except StageFailed as e:
            sys.stderr.write(f"pipe: failed: {shown(scrub(str(e)))}\n")
            raise typer.Exit(1) from None
        except KeyboardInterrupt as e:  # Ctrl-C (130), or a SIGTERM the command honoured (`Terminated`, 143)
            why = "SIGTERM: " if isinstance(e, Terminated) else ""
            sys.stderr.write(f"interrupted: {why}{AFTER_INTERRUPT.get(fn.__name__, START_OVER)}\n")
            raise typer.Exit(getattr(e, "exit_code", 130)) from None
        except (typer.Exit, typer.Abort, SystemExit):
            raise
        except Exception as e:  # a bug of ours: say so in one line; PIPE_DEBUG=1 shows the traceback
            if os.environ.get("PIPE_DEBUG"):
                raise
            sys.stderr.write(f"pipe: internal error: {type(e).__name__}: {shown(scrub(str(e)))} (PIPE_DEBUG=1 shows the traceback)\n")
            raise typer.Exit(1) from None

    return wrapper
