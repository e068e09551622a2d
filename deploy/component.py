"""Deployment outside docker-compose: Debian packages and hardened systemd units (deploy/debian,
deploy/systemd) and the Slurm hooks (deploy/slurm). No process of the local stack; only what
`fleetsight setup` installs to build and check the packages."""

from __future__ import annotations

from .debian.install import DEBIAN_STEPS

INSTALL_STEPS = [*DEBIAN_STEPS]
