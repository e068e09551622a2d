"""Prometheus rules: the `fleetsight rules` commands and the promtool 3.x that checks them.

The rule files themselves (rules/*.yml, generated from rules/source/ by `fleetsight rules generate`)
are loaded by Prometheus (metrics/component.py in the local stack, the mounted folder in
docker-compose.yml); nothing runs here as a service."""

from __future__ import annotations

from .install import INSTALL_STEPS as PROMTOOL3_INSTALL_STEPS

CLI = {"rules": (".cli", "Prometheus rules: generate, check and unit-test with promtool 2.x and 3.x")}
INSTALL_STEPS = [*PROMTOOL3_INSTALL_STEPS]
