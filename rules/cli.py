"""`fleetsight rules ...`: generate the rule files from their sources, check and unit-test them with both
promtool generations (the alerts are scored on the digital twin by `fleetsight evaluate`)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import click

from fleetsight.settings import Settings

from . import generate as generator
from .install import PROMTOOL3_BUILD
from .ruleset import RULES_DIR, rule_files


def promtools() -> dict[str, str | None]:
    """promtool 2.x (Debian) and 3.x (built by `fleetsight setup`), None where missing."""
    built = PROMTOOL3_BUILD.binary(Settings())
    return {"promtool": shutil.which("promtool"), "promtool3": str(built) if built.exists() else None}


def run_promtool(binary: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([binary, *args], capture_output=True, text=True, check=False, cwd=RULES_DIR.parent)


@click.group(name="rules", context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Prometheus recording and alerting rules (rules/*.yml, generated from rules/source/*.yml):
    generate, check, unit-test (scored on the twin by `fleetsight evaluate`).

    \b
    Examples:
      fleetsight rules generate
      fleetsight rules check
      fleetsight rules test
    """


def promtool_all(args: list[str], files: list[str]) -> None:
    failed = False
    for name, binary in promtools().items():
        if binary is None:
            how = "apt-get install prometheus" if name == "promtool" else "run `fleetsight setup`"
            click.echo(f"{name}: not installed ({how})", err=True)
            failed = True
            continue
        result = run_promtool(binary, [*args, *files])
        status = "ok" if result.returncode == 0 else "FAILED"
        click.echo(f"{name}: {status}")
        if result.returncode != 0:
            click.echo((result.stdout + result.stderr).strip(), err=True)
            failed = True
    if failed:
        raise SystemExit(1)


@cli.command()
@click.option("--check", "only_check", is_flag=True, help="Write nothing; exit 1 if a file differs.")
def generate(only_check: bool) -> None:
    """Write rules/*.yml from their sources in rules/source/ (runbook_url, `jobs`, generated rules).

    \b
    Examples:
      fleetsight rules generate
      fleetsight rules generate --check
    """
    if generator.regenerate(only_check) != 0:
        raise SystemExit(1)


@cli.command()
def check() -> None:
    """`promtool check rules` on every rule file, with promtool 2.x and 3.x.

    \b
    Examples:
      fleetsight rules check
    """
    promtool_all(["check", "rules"], [str(p) for p in rule_files()])


@cli.command()
def test() -> None:
    """`promtool test rules` on the unit tests in rules/tests/, with promtool 2.x and 3.x.

    \b
    Examples:
      fleetsight rules test
    """
    promtool_all(["test", "rules"], [str(p) for p in sorted((RULES_DIR / "tests").glob("*.yml"))])


if __name__ == "__main__":
    sys.exit(cli())
