"""What `fleetsight setup` installs for the bare-metal packaging: Debian's own build and check tools
(dpkg-buildpackage with debhelper, lintian, fakeroot) and systemd-analyze (package systemd) to verify
and score the units. All from apt: no build of ours."""

from __future__ import annotations

from fleetsight.setup import apt_step

DEBIAN_STEPS = [
    apt_step(
        "debian-packaging",
        "dpkg-dev, debhelper, lintian, fakeroot and systemd (systemd-analyze) from apt",
        "make deb, tests/deploy_debian",
        {
            "dpkg-dev": "dpkg-buildpackage",
            "debhelper": "dh",
            "lintian": "lintian",
            "fakeroot": "fakeroot",
            "systemd": "systemd-analyze",
        },
        eta="~60 s",
    )
]
