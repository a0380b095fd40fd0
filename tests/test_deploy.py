"""The deployment examples of docs/scale-out.md (not launched here: no cloud, no
Kubernetes): the cluster YAML satisfies Ray's own schema, and the RayJob, the image and the
cluster run this project's Ray version, sweep specs and paths."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import jsonschema
import ray
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"


def test_the_cluster_yaml_satisfies_rays_schema() -> None:
    config = yaml.safe_load((DEPLOY / "ray-cluster.yaml").read_text())
    schema = json.loads((Path(ray.__file__).parent / "autoscaler/ray-schema.json").read_text())
    jsonschema.validate(config, schema)
    nodes = config["available_node_types"]
    assert nodes[config["head_node_type"]]["resources"] == {"CPU": 0}  # trials go to workers
    assert any(t["node_config"]["InstanceType"].startswith("g") for t in nodes.values())
    starts = config["head_start_ray_commands"] + config["worker_start_ray_commands"]
    assert all("RAY_AUTH_MODE=token" in c for c in starts if " start " in c)


def test_the_rayjob_runs_a_committed_sweep_on_gpu_workers_of_this_ray_version() -> None:
    job = yaml.safe_load((DEPLOY / "rayjob.yaml").read_text())
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    entrypoint = shlex.split(job["spec"]["entrypoint"])
    assert entrypoint[:3] == ["python", "-m", "pipelines.sweeps.run"]
    assert (ROOT / entrypoint[3]).is_file()
    cluster = job["spec"]["rayClusterSpec"]
    assert cluster["rayVersion"] == ray.__version__
    (worker,) = cluster["workerGroupSpecs"]
    (container,) = worker["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    base = re.search(r"^FROM rayproject/ray:(\S+)-py311", dockerfile, re.MULTILINE)
    assert base and base.group(1) == ray.__version__
    workdir = re.search(r"^WORKDIR (\S+)", dockerfile, re.MULTILINE).group(1)
    assert container["workingDir"] == workdir
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {f"{workdir}/data", f"{workdir}/models/sweeps"}  # data in, checkpoints out
