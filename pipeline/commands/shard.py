"""`pipe shard` (not built yet)."""

import typer


def shard() -> None:
    """Not built yet."""
    raise typer.Exit(2)
