"""`pipe check` (not built yet)."""

import typer


def check() -> None:
    """Not built yet."""
    raise typer.Exit(2)
