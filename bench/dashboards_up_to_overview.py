"""From `make up` to a drawn fleet overview: how long a newcomer waits before seeing the fleet.

Runs `make up` in this checkout (setup checks, then the whole stack on the twin), then loads the dashboard
viewer's /overview in Debian's headless Chromium (tests/browser.py) until every node tile has a health
state, and prints both times. Leaves the stack running (`make down` stops it); start from a stopped stack.

    .venv/bin/python bench/dashboards_up_to_overview.py                # ~2 minutes with setup done
    .venv/bin/python bench/dashboards_up_to_overview.py --nodes 17     # wait for 17 tiles (16 + this host)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from selenium.webdriver.common.by import By  # noqa: E402

from browser import headless_chromium  # noqa: E402
from fleetsight.settings import Settings  # noqa: E402


def states_drawn(browser: object) -> int:
    tiles = browser.find_elements(By.CSS_SELECTOR, "#nodes [data-node]")  # type: ignore[attr-defined]
    return sum(1 for tile in tiles if tile.get_attribute("data-state") not in (None, "", "unknown"))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=16, help="Tiles with a health state to wait for.")
    parser.add_argument("--timeout", type=float, default=900.0, help="Give up after this many seconds.")
    args = parser.parse_args()
    started = time.monotonic()
    up = subprocess.run(["make", "up"], cwd=REPO, capture_output=True, text=True)
    up_s = time.monotonic() - started
    print(f"make up: rc {up.returncode} in {up_s:.0f} s", flush=True)
    if up.returncode != 0:
        sys.exit(up.stdout[-2000:] + up.stderr[-2000:])
    overview = Settings().url("dashboards", "/overview")
    with headless_chromium() as browser:
        drawn = 0
        while drawn < args.nodes:
            if time.monotonic() - started > args.timeout:
                sys.exit(f"gave up after {args.timeout:.0f} s: {drawn} of {args.nodes} tiles drawn")
            browser.get(overview)
            poll_until = time.monotonic() + 20
            while time.monotonic() < poll_until and (drawn := states_drawn(browser)) < args.nodes:
                time.sleep(0.5)  # polling the page, bounded by poll_until
    total = time.monotonic() - started
    print(f"overview drawn: {drawn} node tiles with a health state, {total:.0f} s after `make up` began")


if __name__ == "__main__":
    main()
