"""FleetSight core: settings, the CLI entry point, component declarations and the local stack runner."""

__version__ = "0.1.0"
