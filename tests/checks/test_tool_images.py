"""Intrusive checks whose tool lives in another image (issue 41): on Kubernetes `dcgmi diag` runs in
NVIDIA's DCGM image, which has no FleetSight. The Job runs the tool in an init container that leaves its
output and exit status in a shared folder, and FleetSight's container judges them
(`checks run --tool-output`). Here the init container's own shell script runs for real (with `sh`), and
the judging runs through the real CLI on a real DCGM document."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from checks.catalog import load_catalog
from checks.kube import TOOL_OUTPUT, KubeChecks, load_jobs_file

FLEETSIGHT = [sys.executable, "-m", "fleetsight.cli"]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dcgmi"
DCGM_IMAGE = "nvcr.io/nvidia/cloud-native/dcgm:4.5.2-1-ubuntu22.04"


def kube(tmp_path: Path) -> KubeChecks:
    jobs = tmp_path / "jobs.yml"
    jobs.write_text(
        "images:\n"
        f"  dcgmi: {{image: {DCGM_IMAGE}, fleetsight: false}}\n"
        "  gpu_probe: {image: ghcr.io/fleetsight/fleetsight:0.1.0, fleetsight: true}\n"
        "tools:\n"
        "  dcgmi: [sh, -c, 'nv-hostengine -n --service-account nvidia-dcgm && exec dcgmi \"$@\"', dcgmi]\n"
        "  gpu_probe: [fleetsight-gpu-probe]\n"
    )
    images, commands = load_jobs_file(jobs)
    return KubeChecks(
        None,  # type: ignore[arg-type]  # job() builds the manifest only: no API call
        load_catalog(),
        "http://checks:9443",
        ["fleetsight"],
        images=images,
        tool_commands=commands,
        jobs_config_map="fs-fleetsight-checks-config",
    )


def run(folder: Path, check: str = "dcgm_diag_r3") -> tuple[int, dict]:
    command = [*FLEETSIGHT, "checks", "run", "--node", "n1", "--check", check, "--tool-output", str(folder)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSIGHT_CHECKS")}
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    return done.returncode, json.loads(done.stdout)


def test_dcgmi_runs_in_nvidias_image_and_fleetsight_judges_its_output(tmp_path: Path) -> None:
    from checks.plan import Unit

    job = kube(tmp_path).job(Unit("dcgm_diag_r3", ("n1",)))
    spec = job["spec"]["template"]["spec"]
    [init], [check] = spec["initContainers"], spec["containers"]
    assert init["image"] == DCGM_IMAGE and init["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert "resources" not in check  # the GPUs are the tool's; the judge needs none
    assert check["command"][-2:] == ["--tool-output", TOOL_OUTPUT]
    assert spec["volumes"] == [{"name": "tool-output", "emptyDir": {}}]
    # the init container's script, run for real with a stand-in for dcgmi that prints a failing document
    # and exits non-zero as dcgmi does: the script still exits 0 and keeps the output and the status
    folder = tmp_path / "tool"
    folder.mkdir()
    script = init["command"][2].replace(TOOL_OUTPUT, str(folder))
    fixture = FIXTURES / "dgx-spark-gb10-r1.json"
    stand_in = ["sh", "-c", f'cat "{fixture}"; exit 226']
    done = subprocess.run(["sh", "-c", script, "tool", *stand_in], capture_output=True, timeout=30)
    assert done.returncode == 0 and (folder / "rc").read_text().strip() == "226"
    code, result = run(folder, "dcgm_diag_r1")
    assert code == 1 and result["outcome"] == "failed" and "software" in result["summary"]


def test_a_tool_that_did_not_run_or_timed_out_is_an_unknown(tmp_path: Path) -> None:
    code, result = run(tmp_path / "never-written")
    assert code == 4 and (result["outcome"], result["reason"]) == ("unknown", "tool_missing")
    (tmp_path / "stdout").write_text("")
    (tmp_path / "rc").write_text("124\n")
    code, result = run(tmp_path)
    assert code == 4 and (result["outcome"], result["reason"]) == ("unknown", "timeout")


def test_a_tool_in_fleetsight_s_image_uses_the_jobs_file_s_command(tmp_path: Path) -> None:
    from checks.plan import Unit

    job = kube(tmp_path).job(Unit("gemm_throughput", ("n1",)))
    spec = job["spec"]["template"]["spec"]
    [check] = spec["containers"]
    assert check["image"] == "ghcr.io/fleetsight/fleetsight:0.1.0" and "initContainers" not in spec
    assert check["command"][-2:] == ["--tools", "/etc/fleetsight/checks/jobs.yml"]
    assert spec["volumes"] == [{"name": "jobs", "configMap": {"name": "fs-fleetsight-checks-config"}}]
    assert check["resources"]["limits"]["nvidia.com/gpu"] == "8"
