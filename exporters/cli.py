"""`fleetsight exporters` sub-commands."""

import click


@click.group(name="exporter")
def cli() -> None:
    """Placeholder: filled in by its issue."""
