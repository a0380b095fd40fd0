"""A user's client of the Jobs API, run by the sweep tests as a process of its own (the Ray
client configuration, token authentication included, is read once per process): submit a
sweep with `JobSubmissionClient`, kill the Ray worker of one of its trials once that trial has
written a checkpoint, wait for the job, and report.

``python jobs_client.py DASHBOARD WORKING_DIR SPEC TRACKING_URI EXPERIMENT REPORT``: REPORT
receives {"status", "log", "killed": the killed trial's run, "steps": its loss steps then}.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import psutil
from mlflow import MlflowClient
from ray.job_submission import JobStatus, JobSubmissionClient

TIMEOUT_S = 300
FINISHED = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED)
# A trial flushes its metrics before each checkpoint: this many loss points mean one was written.
POINTS_BEFORE_KILL = 4


def kill_a_training_trial(
    client: MlflowClient, experiment: str, sweep: str, jobs: JobSubmissionClient, job: str
) -> tuple[str, list[int]]:
    """SIGKILL the Ray worker process running a trial of ``sweep`` (the pid its run was created
    by) once it has logged enough; the run's id and the steps it had logged."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if jobs.get_job_status(job) in FINISHED:
            raise SystemExit(f"the job ended before a trial was killed:\n{jobs.get_job_logs(job)}")
        found = client.get_experiment_by_name(experiment)  # the job creates it
        query = f"tags.stage = 'sweep/{sweep}' and attributes.status = 'RUNNING'"
        running = client.search_runs([found.experiment_id], query) if found else []
        for run in running:
            history = client.get_metric_history(run.info.run_id, "loss")
            if "trial" in run.data.tags and len(history) >= POINTS_BEFORE_KILL:
                worker = psutil.Process(int(run.data.tags["driver.pid"]))
                if not worker.name().startswith("ray::"):
                    raise SystemExit(f"pid {worker.pid} is {worker.name()}, not a Ray worker")
                worker.send_signal(signal.SIGKILL)
                return run.info.run_id, sorted(m.step for m in history)
        time.sleep(0.3)
    raise SystemExit("no trial logged enough in time")


def main() -> None:
    dashboard, working_dir, spec, uri, experiment, report = sys.argv[1:]
    jobs = JobSubmissionClient(dashboard)
    job = jobs.submit_job(
        entrypoint=f"python -m pipelines.sweeps.run {spec}",
        runtime_env={"working_dir": working_dir, "env_vars": {"MLFLOW_TRACKING_URI": uri}},
    )
    killed, steps = kill_a_training_trial(MlflowClient(uri), experiment, Path(spec).stem, jobs, job)
    deadline = time.monotonic() + TIMEOUT_S
    while (status := jobs.get_job_status(job)) not in FINISHED:
        if time.monotonic() > deadline:
            jobs.stop_job(job)
            raise SystemExit("the job did not finish in time")
        time.sleep(1)
    outcome = {
        "status": str(status),
        "log": jobs.get_job_logs(job),
        "killed": killed,
        "steps": steps,
    }
    Path(report).write_text(json.dumps(outcome))


if __name__ == "__main__":
    main()
