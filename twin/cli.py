"""`fleetsight twin` sub-commands."""

import click


@click.group(name="twin")
def cli() -> None:
    """Placeholder: filled in by its issue."""
