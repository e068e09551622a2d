"""Console scripts of component programs: the wheel installs a component folder as fleetsight_<folder>
(pyproject.toml), a checkout (an editable install, the tests) has it as <folder>; a script names this
module, which finds the component either way."""

from __future__ import annotations

import importlib
from types import ModuleType


def component_module(folder: str, module: str) -> ModuleType:
    try:
        return importlib.import_module(f"fleetsight_{folder}.{module}")
    except ModuleNotFoundError as exc:
        if exc.name not in (f"fleetsight_{folder}", f"fleetsight_{folder}.{module}"):
            raise  # a missing dependency of the module itself
        return importlib.import_module(f"{folder}.{module}")


def gpu_probe() -> int:
    """fleetsight-gpu-probe: checks/gpu_probe.py."""
    return component_module("checks", "gpu_probe").main()
