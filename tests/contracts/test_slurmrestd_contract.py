"""slurmrestd contract: FleetSight's slurmrestd readers (the anomaly service's job reader, the health
service's scheduler source; both on fleetsight.slurmrest) against the real producer, Debian 12's
Slurm 22.05 slurmrestd (../shared/PRODUCERS.md: "Slurm REST: ... the installed slurmrestd itself"),
with a real job running on real slurmds; and the twin's v0.0.40 answers against the real OpenAPI
document that slurmrestd serves (``GET /openapi/v3``).

22.05 serves openapi/v0.0.36, v0.0.37 and v0.0.38 (its plugins under /usr/lib/x86_64-linux-gnu/
slurm-wlm/); the twin and the anomaly service's examples speak v0.0.40 (Slurm 23.11). A reader given a
base URL must find v0.0.38 here and v0.0.40 on the twin; a pinned URL keeps working as before.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from health_helpers import scheduler_views

from anomaly.jobs import JobMap, merge
from anomaly.source import PrometheusSource
from fleetsight.procs import kill_group, terminate_group
from fleetsight.slurmrest import SlurmRest, job_comment, job_nodes, running_jobs, versions_offered
from health.slurm_local import LocalSlurm, missing
from support import free_port, wait_until

REPO = Path(__file__).resolve().parents[2]
NODES = ["n0001", "n0002", "n0003"]
SERVED = ["v0.0.38", "v0.0.37", "v0.0.36"]  # 22.05's openapi/slurmctld plugins, newest first
HOST = "http://slurmrestd"  # on a UNIX socket the host part is not used
UNUSED_PROMETHEUS = "http://127.0.0.1:9"  # the job reader alone is under test: no PromQL is sent
COMMENT = "model profile moe-8x22b expert-routing"
SBATCH_TWO_NODES = ["sbatch", "--parsable", "-N2", "-w", "n0001,n0002", "-o", "/dev/null"]
# What FleetSight reads of each object (fleetsight.slurmrest.job_states, job_nodes, job_comment;
# health.sources's node states), and of that what must be there.
JOB_FIELDS = ("job_id", "job_state", "nodes", "job_resources", "comment")
JOB_NEEDED = ("job_id", "job_state", "nodes")
NODE_FIELDS, NODE_NEEDED = ("name", "state", "state_flags", "reason", "partitions"), ("name", "state")
# Where the twin's v0.0.40 (23.11) shape differs from 22.05's v0.0.38 spec in those fields: both
# readers take either form (job_state / state: a word up to v0.0.39, a list of words from v0.0.40).
VERSION_DIFFERENCES = {("jobs", "job_state"): "type", ("nodes", "state"): "type"}


def slurmrestd_command(cluster: LocalSlurm, socket: Path, plugins: list[str]) -> list[str]:
    """As LocalSlurm runs its own (as nobody, rest_auth/local), but with every slurmctld plugin 22.05
    has; the openapi/dbv* ones need a slurmdbd, which the test cluster does not run."""
    return [
        *("runuser", "-u", "nobody", "--", "env", f"SLURM_CONF={cluster.conf}", "slurmrestd"),
        *("-a", "rest_auth/local", "-s", ",".join(f"openapi/{p}" for p in plugins), f"unix:{socket}"),
    ]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalSlurm]:
    """A real Slurm on loopback (munged, slurmctld, a slurmd per node, slurmrestd with v0.0.38 only)."""
    why = missing()
    if why:
        pytest.fail(why)  # setup installs Slurm: a missing producer fails, never skips
    slurm = LocalSlurm(Path(tempfile.mkdtemp(prefix="fleetsight-contract-slurm-")), NODES, free_port())
    slurm.start()
    try:
        yield slurm
    finally:
        slurm.stop()
        shutil.rmtree(slurm.folder, ignore_errors=True)


@pytest.fixture(scope="module")
def socket(cluster: LocalSlurm) -> Iterator[Path]:
    """A second slurmrestd on the same cluster serving v0.0.36-v0.0.38: what discovery chooses from."""
    path = cluster.folder / "rest" / "all-versions.sock"
    log = (cluster.folder / "log" / "slurmrestd-all.out").open("ab")
    process = subprocess.Popen(
        slurmrestd_command(cluster, path, SERVED),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_until(
            lambda: path.exists() or process.poll() is not None, timeout=30, what="slurmrestd's socket"
        )
        assert process.poll() is None, (cluster.folder / "log" / "slurmrestd-all.out").read_text()
        yield path
    finally:
        terminate_group(process.pid)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            kill_group(process.pid)
            process.wait(timeout=5)


def client(socket: Path) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(socket)), timeout=20)


def real_get(socket: Path, path: str) -> httpx.Response:
    with client(socket) as http:
        return http.get(f"{HOST}{path}")


@pytest.fixture(scope="module")
def job(cluster: LocalSlurm, socket: Path) -> Iterator[str]:
    """A real two-node batch job, RUNNING in slurmctld's eyes before the tests read it; its comment
    declares expert routing (anomaly/declared.py), as a MoE job's submitter writes it."""
    submitted = subprocess.run(
        [*SBATCH_TWO_NODES, "--comment", COMMENT, "--wrap", "sleep 600"],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    try:
        wait_until(
            lambda: running_jobs(real_get(socket, "/slurm/v0.0.38/jobs").json()).get(job_id),
            timeout=30,
            what=f"job {job_id} RUNNING in slurmrestd",
        )
        yield job_id
    finally:
        subprocess.run(["scancel", job_id], env=cluster.env, timeout=30, check=False)


@pytest.fixture(scope="module")
def spec(socket: Path) -> dict[str, Any]:
    response = real_get(socket, "/openapi/v3")
    assert response.status_code == 200, response.text
    return response.json()


# ---------------------------------------------------------------- what the server offers
def test_the_installed_slurmrestd_offers_v0_0_36_to_v0_0_38_and_not_v0_0_40(
    cluster: LocalSlurm, socket: Path, spec: dict[str, Any]
) -> None:
    assert versions_offered(spec) == SERVED
    assert real_get(socket, "/slurm/v0.0.38/ping").json()["meta"]["Slurm"]["release"].startswith("22.05.")
    # what the v0.0.40 URLs FleetSight used to hard-code get from it
    assert real_get(socket, "/slurm/v0.0.40/jobs").status_code == 404
    # LocalSlurm's own slurmrestd loads v0.0.38 alone: its document says so
    assert versions_offered(real_get(cluster.rest_socket, "/openapi/v3").json()) == ["v0.0.38"]


def test_discovery_chooses_the_newest_version_from_the_openapi_document(socket: Path) -> None:
    with client(socket) as http:
        assert SlurmRest(HOST, http).discover() == "v0.0.38"
        pinned = SlurmRest(f"{HOST}/slurm/v0.0.36", http)
        assert pinned.resource_url("jobs") == f"{HOST}/slurm/v0.0.36/jobs"
        assert pinned.json("jobs")["meta"]["plugin"]["type"] == "openapi/v0.0.36"


# ---------------------------------------------------------------- the anomaly service's job reader
@pytest.mark.parametrize(
    "url",
    [
        HOST,  # discovered: v0.0.38
        f"{HOST}/slurm/v0.0.38",
        f"{HOST}/slurm/v0.0.38/jobs",  # a full jobs URL, as configured before discovery
        f"{HOST}/slurm/v0.0.37/jobs",
        f"{HOST}/slurm/v0.0.36/jobs",
    ],
)
def test_the_anomaly_job_reader_finds_the_running_job_and_its_nodes(socket: Path, job: str, url: str) -> None:
    source = PrometheusSource(UNUSED_PROMETHEUS, slurm_url=url, slurm_socket=str(socket))
    try:
        jobs = source.slurm_jobs()
    finally:
        source.close()
    assert source.slurm_up is True, source.slurm_error
    assert jobs == {job: ["n0001", "n0002"]}


@pytest.mark.parametrize("version", SERVED)
def test_the_anomaly_job_reader_reads_the_jobs_declared_routing_from_its_comment(
    socket: Path, job: str, version: str
) -> None:
    """``sbatch --comment`` as slurmrestd serves it in each version: the job declares expert routing,
    and the window's job carries it (what the detector trusts from the job's first window)."""
    (real,) = [
        j for j in real_get(socket, f"/slurm/{version}/jobs").json()["jobs"] if str(j["job_id"]) == job
    ]
    assert job_comment(real) == COMMENT, real.get("comment")
    source = PrometheusSource(
        UNUSED_PROMETHEUS, slurm_url=f"{HOST}/slurm/{version}", slurm_socket=str(socket)
    )
    try:
        jobs = source.slurm_jobs()
        routing = source.slurm.routing if source.slurm is not None else None
    finally:
        source.close()
    assert jobs == {job: ["n0001", "n0002"]} and routing == {job}
    merged = merge(jobs, JobMap(), routing)
    assert merged.refs[job].declared_routing is True


def test_the_anomaly_job_reader_reports_a_version_the_server_does_not_serve(socket: Path, job: str) -> None:
    source = PrometheusSource(
        UNUSED_PROMETHEUS, slurm_url=f"{HOST}/slurm/v0.0.40/jobs", slurm_socket=str(socket)
    )
    try:
        assert source.slurm_jobs() is None  # the hpc_job labels are used instead
    finally:
        source.close()
    assert source.slurm_up is False and "404" in source.slurm_error


def test_the_job_resources_node_lists_give_the_same_nodes(socket: Path, job: str) -> None:
    """A job answer without the top-level host list: the nodes come from job_resources, its host list
    (every version here), else allocated_nodes[].nodename (v0.0.38; v0.0.36/37 key them by index and
    give no names)."""
    named = {"v0.0.38": ["n0001", "n0002"], "v0.0.37": [], "v0.0.36": []}
    for version in SERVED:
        jobs = real_get(socket, f"/slurm/{version}/jobs").json()["jobs"]
        real = next(j for j in jobs if str(j["job_id"]) == job)
        assert job_nodes({**real, "nodes": ""}) == ["n0001", "n0002"], version
        resources = {**real["job_resources"], "nodes": ""}
        assert job_nodes({**real, "nodes": "", "job_resources": resources}) == named[version], version


# ---------------------------------------------------------------- the health service's scheduler source
def test_the_health_scheduler_source_discovers_the_version_and_reads_the_job(socket: Path, job: str) -> None:
    discovered = scheduler_views(HOST, socket)
    assert discovered["n0001"].busy and discovered["n0002"].busy and not discovered["n0003"].busy
    assert discovered == scheduler_views(f"{HOST}/slurm/v0.0.38", socket)  # the pinned URL, as before


# ---------------------------------------------------------------- the twin against the real spec
@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The twin on the health tests' live_short.yaml (job 7301 on n0001-n0004), serving over HTTP."""
    port = free_port()
    scenario = REPO / "tests" / "health" / "scenarios" / "live_short.yaml"
    command = [sys.executable, "-m", "fleetsight.cli", "twin", "run", "--scenario", str(scenario), "--serve"]
    command += ["--out", str(tmp_path_factory.mktemp("twin")), "--speed", "realtime"]
    process = subprocess.Popen(
        [*command, "--listen", f"127.0.0.1:{port}"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: twin_jobs_ready(url, process), timeout=60, what="the twin's jobs endpoint")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=20)


def twin_jobs_ready(url: str, process: subprocess.Popen[bytes]) -> bool:
    if process.poll() is not None:
        pytest.fail(f"the twin exited: {process.stderr.read().decode() if process.stderr else ''}")
    try:
        return httpx.get(f"{url}/slurm/v0.0.40/jobs", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def read_schema(spec: dict[str, Any], name: str, fields: tuple[str, ...], needed: tuple[str, ...]) -> dict:
    """The real spec's schema of ``name`` cut to the fields FleetSight reads, with those it needs
    required (the spec itself requires none); its $refs resolve in the spec's own components."""
    properties = spec["components"]["schemas"][name]["properties"]
    return {
        "type": "object",
        "properties": {field: properties[field] for field in fields},
        "required": list(needed),
        "components": spec["components"],
    }


def violations(schema: dict, items: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """(top-level field, JSON-schema keyword) of every way the items break the schema."""
    validator = jsonschema.Draft7Validator(schema)
    found = set()
    for item in items:
        for error in validator.iter_errors(item):
            # a required field's error sits on the object: its name is only in the message
            field = str(error.path[0]) if error.path else error.message.split("'")[1]
            found.add((field, str(error.validator)))
    return found


def schemas(spec: dict[str, Any], version: str) -> dict[str, dict]:
    return {
        "jobs": read_schema(spec, f"{version}_job_response_properties", JOB_FIELDS, JOB_NEEDED),
        "nodes": read_schema(spec, f"{version}_node", NODE_FIELDS, NODE_NEEDED),
    }


def test_the_real_answers_fit_the_fields_fleetsight_reads(
    socket: Path, spec: dict[str, Any], job: str
) -> None:
    # what makes the next test able to fail: the cut schema holds the real producer's answers
    for resource, schema in schemas(spec, "v0.0.38").items():
        items = real_get(socket, f"/slurm/v0.0.38/{resource}").json()[resource]
        assert items and violations(schema, items) == set(), resource
    broken = {"job_id": "7301", "job_state": "RUNNING"}  # a string id, no nodes: both caught
    assert violations(schemas(spec, "v0.0.38")["jobs"], [broken]) == {
        ("job_id", "type"),
        ("nodes", "required"),
    }


def test_the_twin_differs_from_the_real_v0_0_38_spec_only_where_v0_0_40_does(
    spec: dict[str, Any], twin: str
) -> None:
    """The installed Slurm has no v0.0.40, so the twin's v0.0.40 answers are held to v0.0.38's spec for
    the fields FleetSight reads: the only differences allowed are the documented version differences."""
    found = {}
    for resource, schema in schemas(spec, "v0.0.38").items():
        items = httpx.get(f"{twin}/slurm/v0.0.40/{resource}", timeout=10).json()[resource]
        assert items, resource
        found |= {(resource, field): keyword for field, keyword in violations(schema, items)}
    assert found == VERSION_DIFFERENCES


def test_every_reader_finds_the_twins_job_through_discovery(twin: str) -> None:
    """The twin serves no OpenAPI document: the readers fall back to trying versions, newest first."""
    with httpx.Client(timeout=10) as http:
        assert SlurmRest(twin, http).discover() == "v0.0.40"
    source = PrometheusSource(UNUSED_PROMETHEUS, slurm_url=twin)
    try:
        assert source.slurm_jobs() == {"7301": ["n0001", "n0002", "n0003", "n0004"]}
    finally:
        source.close()
    views = scheduler_views(twin)
    assert {n for n, v in views.items() if v.busy} == {"n0001", "n0002", "n0003", "n0004"}
