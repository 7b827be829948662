"""`pipe train` (not built yet). Imports no torch at module level: `pipe --help` stays fast."""

import typer


def train() -> None:
    """Not built yet."""
    raise typer.Exit(2)
