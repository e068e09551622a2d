# The two commands of the README, and a few conveniences.
# `make up`   installs what is missing, then runs the whole stack on the digital twin.
# `make test` installs what is missing, then runs the test suite.
.PHONY: up test down status lint bootstrap setup screenshots

bootstrap:
	@scripts/bootstrap

setup: bootstrap
	@.venv/bin/fleetsight setup

up: bootstrap
	@.venv/bin/fleetsight setup || echo "setup: some steps failed (see above); starting what can run"
	@.venv/bin/fleetsight up

# Two pytest workers: most tests wait on real-time windows (scrapes, `for:`, alert groups), so one worker
# keeps a 2-core machine about a third busy. Tests sharing a server stay on one worker (tests/conftest.py).
TEST_WORKERS ?= 2

test: bootstrap
	@.venv/bin/fleetsight setup || echo "setup: some steps failed (see above); tests that need them will fail"
	@.venv/bin/ruff check .
	@.venv/bin/python -m pytest -n $(TEST_WORKERS) --dist loadgroup

down:
	@.venv/bin/fleetsight down

status:
	@.venv/bin/fleetsight status

lint:
	@.venv/bin/ruff check . && .venv/bin/ruff format --check .

# The dashboard viewer's pictures in README and docs/dashboards.md: its browser test on a live twin with
# a thermal fault, keeping a screenshot of every page it draws (about 4 minutes).
screenshots: bootstrap
	@.venv/bin/fleetsight setup --only echarts --only chromium
	@FLEETSIGHT_SCREENSHOTS=docs/images/dashboards .venv/bin/python -m pytest tests/dashboards/test_viewer.py -q

# Debian packages (fleetsight-python, fleetsight-python-node, fleetsight-node, fleetsight-central) into
# build/deb/, built with dpkg-buildpackage/debhelper; see deploy/debian/build.py and docs/deployment.md,
# "Bare metal".
.PHONY: deb
deb: bootstrap
	@.venv/bin/fleetsight setup
	@nice -n 10 .venv/bin/python -m deploy.debian.build
