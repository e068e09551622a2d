"""The global layer's command. Not part of `fleetsight up`'s one-cluster stack: it runs above the
clusters' stacks (docs/fleet.md)."""

from __future__ import annotations

CLI = {"fleet": (".cli", "the global layer: one read API over every cluster's health service")}
