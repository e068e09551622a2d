"""A component joins FleetSight by its folder alone: CLI, setup and `fleetsight up` find it."""

from __future__ import annotations

import textwrap
from pathlib import Path

import httpx
import pytest

from fleetsight import registry
from support import StackEnv

THROWAWAY_COMPONENT = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    from fleetsight.components import Component, http_ok
    from fleetsight.setup import InstallStep

    PORTS = {"throwaway": 997}
    CLI = {"throwaway": ("throwaway.cli", "a component that exists only in this test")}
    MARKER = "throwaway-installed"


    def marker(settings):
        return settings.cache_dir / MARKER


    def install(settings, log):
        marker(settings).parent.mkdir(parents=True, exist_ok=True)
        marker(settings).write_text("yes")


    INSTALL_STEPS = [
        InstallStep(
            name="throwaway-step",
            description="writes a marker file",
            needed_by="throwaway",
            check=lambda s: marker(s).exists(),
            install=install,
        )
    ]
    COMPONENTS = [
        Component(
            name="throwaway",
            description="a static file server",
            command=lambda s: [
                sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(s.port("throwaway"))
            ],
            ready=lambda s: http_ok(s.url("throwaway", "/")),
            urls=lambda s: {"files": s.url("throwaway", "/")},
            default=False,
        )
    ]
    """
)

THROWAWAY_CLI = textwrap.dedent(
    '''
    import click


    @click.group()
    def cli():
        """A throwaway.

        \\b
        Examples:
          fleetsight throwaway hello
        """


    @cli.command()
    def hello():
        """Say hello.

        \\b
        Examples:
          fleetsight throwaway hello
        """
        click.echo("hello from a folder")
    '''
)


@pytest.fixture
def throwaway(stack_env: StackEnv, tmp_path: Path) -> StackEnv:
    folder = tmp_path / "components" / "throwaway"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("")
    (folder / "component.py").write_text(THROWAWAY_COMPONENT)
    (folder / "cli.py").write_text(THROWAWAY_CLI)
    stack_env.env["FLEETSIGHT_COMPONENT_PATH"] = str(tmp_path / "components")
    stack_env.env["FLEETSIGHT_CACHE_DIR"] = str(tmp_path / "cache")
    return stack_env


def test_a_new_folder_appears_in_help_setup_and_up(throwaway: StackEnv) -> None:
    help_text = throwaway.cli("--help").stdout
    assert "throwaway" in help_text and "a component that exists only in this test" in help_text
    assert throwaway.cli("throwaway", "hello").stdout.strip() == "hello from a folder"

    setup = throwaway.cli("setup", "--only", "throwaway-step")
    assert "throwaway-step" in setup.stdout and "installed" in setup.stdout
    assert (Path(throwaway.env["FLEETSIGHT_CACHE_DIR"]) / "throwaway-installed").exists()

    up = throwaway.cli("up", "throwaway")
    url = f"http://127.0.0.1:{throwaway.port_base + 997}/"
    assert url in up.stdout
    assert httpx.get(url).status_code == 200


def test_a_port_offset_taken_twice_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "clashing"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "component.py").write_text("PORTS = {'clashing': 90}\n")
    monkeypatch.setenv("FLEETSIGHT_COMPONENT_PATH", str(tmp_path))
    registry.reset()
    try:
        with pytest.raises(registry.RegistryError, match="port offset 90") as refused:
            registry.port_offsets()
        assert "'prometheus'" in str(refused.value) and "'clashing'" in str(refused.value)
    finally:
        monkeypatch.delenv("FLEETSIGHT_COMPONENT_PATH")
        registry.reset()


def test_a_folder_whose_declaration_does_not_import_is_skipped_loudly(
    stack_env: StackEnv, tmp_path: Path
) -> None:
    """A broken component.py (a site's own, a missing dependency) is named on stderr and by `up`, and
    the CLI still works for the rest: `fleetsight down` must never depend on every component importing."""
    folder = tmp_path / "components" / "broken"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("")
    (folder / "component.py").write_text("import fleetsight_no_such_module\n")
    stack_env.env["FLEETSIGHT_COMPONENT_PATH"] = str(tmp_path / "components")

    help_run = stack_env.cli("--help")
    assert "\n  up " in help_run.stdout and "\n  exporter " in help_run.stdout
    assert "component 'broken' skipped" in help_run.stderr and "fleetsight_no_such_module" in help_run.stderr
    up = stack_env.cli("up", "broken", check=False)
    assert up.returncode != 0 and "skipped, broken: ModuleNotFoundError" in up.stdout + up.stderr
    assert stack_env.cli("down").returncode == 0


def test_every_component_of_the_repository_imports() -> None:
    """Skipping a broken declaration must never hide one of the project's own."""
    registry.reset()
    assert registry.broken() == {}
    assert {m.__package__ for m in registry.component_modules()} >= {"exporters", "metrics", "twin"}
