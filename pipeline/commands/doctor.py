"""`pipe doctor` (not built yet)."""

import typer


def doctor() -> None:
    """Not built yet."""
    raise typer.Exit(2)
