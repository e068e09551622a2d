# FleetSight's own services (node agent, fabric exporter, digital twin) as one image.
#   docker build -t fleetsight:0.1.0 .
#   docker run --rm fleetsight:0.1.0 exporter node --help
# The dependencies come from uv.lock exactly (--frozen: a lock out of date with pyproject.toml fails
# the build instead of resolving anew); dev tools (pytest, ruff) stay out.
FROM python:3.11.13-slim-bookworm

# uv from PyPI, pinned: the same registry the project uses, no other download source needed.
RUN pip install --no-cache-dir uv==0.13.9

ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/opt/fleetsight/venv \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/fleetsight/venv/bin:$PATH

WORKDIR /opt/fleetsight/src

# Dependencies first, in their own layer: it is rebuilt only when the lock changes.
COPY pyproject.toml uv.lock README.md ./
RUN uv sync --frozen --no-dev --all-extras --no-install-project

# Then the project itself (.dockerignore keeps tests, caches, run data and secrets out).
COPY . .
RUN uv sync --frozen --no-dev --all-extras

# An unprivileged user; /var/lib/fleetsight is where a service may write (the twin's output).
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/fleetsight --shell /usr/sbin/nologin fleetsight \
    && mkdir -p /var/lib/fleetsight/twin \
    && chown -R fleetsight:fleetsight /var/lib/fleetsight
USER fleetsight

ENTRYPOINT ["fleetsight"]
CMD ["--help"]
