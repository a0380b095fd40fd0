"""Sweeps over the stages' settings on Ray Tune: ``python -m pipelines.sweeps.run SPEC.yaml``.

Where the project is, this starts a local Ray (or joins ``ray.address`` / ``$RAY_ADDRESS``). On a
cluster, submit it as a Ray job from the checkout with ``--submit ADDRESS`` (README, "Scale
out"): the job's working directory is an allow-list (:func:`job_package`: the files git tracks
or would track and the inputs the trials read, never a known secret file), not the checkout.
The spec (``pipelines.sweeps.spec``) is checked before anything runs: every key, every value,
every trial's grid, the input files and the resources. Each trial (``pipelines.sweeps.trials``)
runs one cell of each of the spec's stages with the stages' own code and is one MLflow child run
of the parent run ``sweep/<name>``; a line is logged per finished trial with the best metric so
far.
At the end, in ``reports/sweeps/<name>/`` and as artifacts of the parent run: ``summary.csv``
(every trial: its outcome, values and results), ``summary.md`` (best first) and
``<metric>.png``. The sweep finishes when some trial did, and says how many failed; it fails
when none finished.

``--submit ADDRESS`` does the submitting (then ``$MLFLOW_TRACKING_URI`` must name the tracking
server) and follows the job; once it ended, the reports the job wrote in its copy of the checkout
are fetched from its parent run into ``reports/sweeps/<name>/`` here. ``--fetch [JOB]`` fetches
them later: after Ctrl-C (which detaches, the job going on) or a ``ray job submit``.
"""

from __future__ import annotations

import argparse
import asyncio
import fnmatch
import functools
import logging
import os
import secrets
import subprocess
import tempfile
import urllib.parse
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from mlflow import MlflowClient
from ray import tune
from ray.job_submission import JobSubmissionClient
from ray.tune.schedulers import ASHAScheduler

from learnable_sparsity.errors import LearnableSparsityError, MissingInputError
from learnable_sparsity.reporting.sweeps import summary_csv, summary_markdown, sweep_figure
from pipelines.commands.ui import experiment_address
from pipelines.scaffold.inputs import declared_inputs
from pipelines.scaffold.params import PARAMS_FILE
from pipelines.scaffold.runner import LOG_FORMAT, RaySettings, Resources, check_feasible, connect
from pipelines.scaffold.stage import Stage, run_stage
from pipelines.scaffold.tracking.provenance import (
    GIT_COMMIT_ENV,
    GIT_COMMIT_TAG,
    GIT_DIRTY_ENV,
    GIT_DIRTY_TAG,
    source_tags,
)
from pipelines.scaffold.tracking.runs import RunLogger, StageRun, find_run
from pipelines.scaffold.tracking.store import MlflowSettings, prepare, tracking_uri
from pipelines.sweeps.spec import SweepSpec, load_spec
from pipelines.sweeps.trials import (
    RESULTS,
    STEP,
    SWEEP_TAG,
    StopOnWrongMetric,
    SweepProgress,
    SweepRun,
    run_trial,
)

PROFILES = Path("profiles")
REPORTS = Path("reports/sweeps")
STORAGE = Path("models/sweeps")
SEEDS = ".seeds"  # the search keys of seeds (nmt.seeds, lvm.<experiment>.seeds, ape.seeds)
UI_BASE = "http://127.0.0.1:5000"  # `make ui` on the project's store
# Files a job's package never holds, git-tracked or not: environment files, credentials, keys,
# MLflow's auth config and the Ray token (fnmatch patterns of the file name)...
SECRET_FILES = (
    ".env",
    ".env.*",
    "*.env",
    ".netrc",
    "*credentials*",
    "*.pem",
    "*.key",
    "*.p12",
    "id_rsa*",
    "id_ecdsa*",
    "id_ed25519*",
    "basic_auth.ini",
    "auth_token",
    "secret_key",
)
# ...nor any file under a folder of these names.
SECRET_FOLDERS = ("secrets", ".secrets", ".mlflow", ".ssh", ".aws", ".ray")
RAY_IGNORE_FILES = (".gitignore", ".rayignore")  # read by Ray at every level of a working_dir
# A submitted sweep's Ray job id, which its parent run carries as a tag: the submitter finds the
# run, and so its reports, by it.
JOB_ENV = "LEARNABLE_SPARSITY_RAY_JOB"
JOB_TAG = "ray.job"
NO_DATA = (
    "`dvc repro` (or `dvc pull`) makes the data where the project is; a Ray job carries the "
    "inputs its trials read when submitted with `python -m pipelines.sweeps.run SPEC --submit "
    "ADDRESS`, or runs in a checkout on a shared filesystem (README, Scale out)"
)
log = logging.getLogger(__name__)


def main(stage: Stage, spec: SweepSpec) -> None:
    check_inputs(stage, spec)
    ray = stage.settings("ray", RaySettings)
    connect(ray.address, ray.num_cpus)
    check_feasible(Resources(num_cpus=spec.resources.cpus, num_gpus=spec.resources.gpus))
    storage = Path(spec.settings.storage or STORAGE).resolve() / spec.name
    search = {axis.key: {axis.kind: list(axis.values)} for axis in spec.axes}
    stage.run.log_params(
        {"sweep": {"stages": spec.settings.stages, "params": spec.overrides, "search": search}}
    )
    if os.environ.get(JOB_ENV):
        stage.run.set_tags({JOB_TAG: os.environ[JOB_ENV]})
    progress = SweepProgress(spec, stage.run)
    try:
        tuner(spec, SweepRun(spec, stage.run, storage), storage, progress).fit()
    except BaseException:
        end_trial_runs(stage.run, "KILLED")
        raise
    if progress.wrong_metric:
        end_trial_runs(stage.run, "KILLED")
        raise LearnableSparsityError(progress.wrong_metric)
    report(stage, spec, progress)
    if not progress.finished:
        raise LearnableSparsityError(f"no trial of {len(progress.rows)} finished")


def check_inputs(stage: Stage, spec: SweepSpec) -> None:
    """Every trial's grid (``SweepSpec.check_trials``) and the files the trials read; a missing
    one says how to send the data along."""
    try:
        missing = [str(path) for path in spec.check_trials(stage.uri) if not path.exists()]
        if missing:
            raise MissingInputError(f"the trials read {missing}, which are not here")
    except MissingInputError as error:
        raise LearnableSparsityError(f"{error} ({Path.cwd()}). {NO_DATA}") from None


def report(stage: Stage, spec: SweepSpec, progress: SweepProgress) -> None:
    """``reports/sweeps/<name>/``: the summary (CSV, Markdown with the means over seeds) and the
    figure, also artifacts of the parent run; the counts as its tags; the UI address."""
    settings, rows, folder = spec.settings, progress.rows, REPORTS / spec.name
    axes = [axis.key for axis in spec.axes]
    stage.write_text(folder / "summary.csv", summary_csv(rows), artifact="")
    shown = ["name", "status", *axes, settings.metric]
    groups = [key for key in axes if not key.endswith(SEEDS)]  # means over the seeds
    text = summary_markdown(spec.name, rows, shown, settings.metric, settings.mode, groups)
    stage.write_text(folder / "summary.md", text, artifact="")
    numeric = [a.key for a in spec.axes if all(isinstance(v, int | float) for v in a.values)]
    # x: a numeric search key, else another; never the seeds while there is another
    x = settings.plot.x or ([key for key in numeric if key in groups] or groups or axes)[0]
    group = settings.plot.group or next((key for key in groups if key != x), None)
    log_x = any(axis.key == x and _decades(axis.values) for axis in spec.axes)
    figure = sweep_figure(rows, x, settings.metric, group, log_x=log_x)
    stage.write_png(folder / f"{settings.metric.replace('/', '_')}.png", figure, artifact="")
    counts = {"trials": len(rows), "finished": progress.finished, "failed": progress.failed}
    stage.run.set_tags({f"sweep.{key}": str(value) for key, value in counts.items()})
    log.info("%s: %s; summary in %s", stage.name, counts, folder)
    log.info("the trials in the MLflow UI, best first: %s", trials_address(stage, spec))


def _decades(values: tuple) -> bool:
    """Whether numbers span a decade or more (a log axis shows them best)."""
    numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    return len(numbers) == len(values) and min(numbers) > 0 and max(numbers) >= 10 * min(numbers)


def tuner(spec: SweepSpec, sweep: SweepRun, storage: Path, progress: SweepProgress) -> tune.Tuner:
    """The Ray Tune run of ``spec``: trials of ``run_trial`` with the spec's resources."""
    settings = spec.settings
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, sweep=sweep),
        {"cpu": spec.resources.cpus, "gpu": spec.resources.gpus},
    )
    asha = settings.asha
    scheduler = None
    if asha is not None:
        scheduler = ASHAScheduler(
            time_attr=STEP,
            metric=asha.metric,
            mode=asha.mode,
            max_t=asha.max_t,
            grace_period=asha.grace_period,
            reduction_factor=asha.reduction_factor,
        )
    return tune.Tuner(
        trainable,
        param_space=spec.search_space(),
        tune_config=tune.TuneConfig(
            num_samples=settings.num_samples,
            scheduler=scheduler,
            max_concurrent_trials=settings.max_concurrent,
        ),
        run_config=tune.RunConfig(
            name=spec.name,
            storage_path=str(storage.parent),
            failure_config=tune.FailureConfig(max_failures=settings.max_failures),
            callbacks=[progress],
            stop=StopOnWrongMetric(progress),
            verbose=0,
        ),
    )


def trials_address(stage: Stage, spec: SweepSpec) -> str:
    """The MLflow UI's runs table of the sweep's trials, sorted by the metric (sorting also
    lists them flat rather than folded under their parent run)."""
    query = {
        "searchFilter": f"tags.`{SWEEP_TAG}` = '{stage.run.run_id}'",
        "orderByKey": f"metrics.`{RESULTS}/{spec.settings.metric}`",
        "orderByAsc": str(spec.settings.mode == "min").lower(),
    }
    base = stage.uri if stage.uri.startswith("http") else UI_BASE
    address = experiment_address(base, stage.run.experiment_id)
    return f"{address}&{urllib.parse.urlencode(query)}"


def end_trial_runs(parent: StageRun, status: str) -> None:
    """End the sweep's trial runs still RUNNING (the driver is going down) with ``status``."""
    while True:
        found = find_run(parent.uri, parent.experiment_id, {SWEEP_TAG: parent.run_id}, ("RUNNING",))
        if found is None:
            return
        RunLogger(parent.uri, found).finish(status)


def fetch_reports(spec: SweepSpec, uri: str, job: str | None = None) -> Path:
    """Put the reports of sweep ``spec`` that ran elsewhere (a Ray job, whose working directory
    was a copy) in ``reports/sweeps/<name>/`` here: the artifacts of its parent run on the
    tracking server ``uri``, of Ray job ``job`` or else the latest that ended. Each file is
    renamed into place, so a reader sees the old file or the new one, never a part."""
    experiment = spec.params.settings("mlflow", MlflowSettings).experiment
    stage = f"sweep/{spec.name}"
    query = f"tags.stage = '{stage}' and attributes.run_name = '{stage}'"
    if job:
        query += f" and tags.`{JOB_TAG}` = '{job}'"
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    runs = [] if found is None else client.search_runs([found.experiment_id], query)
    ended = sorted(
        (run for run in runs if run.info.status != "RUNNING"), key=lambda run: run.info.start_time
    )
    of_job = f" of Ray job {job}" if job else ""
    if not ended:
        raise LearnableSparsityError(
            f"no ended run {stage}{of_job} in experiment {experiment!r} of {uri}: the job's log "
            "says why (`ray job logs`), or it is still running (`ray job status`)"
        )
    run = ended[-1].info
    folder = REPORTS / spec.name
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{spec.name}.") as temporary:
        client.download_artifacts(run.run_id, "", temporary)
        files = sorted(path for path in Path(temporary).iterdir() if path.is_file())
        if not files:
            raise LearnableSparsityError(
                f"run {run.run_id} ({stage}{of_job}, {run.status}) of {uri} has no reports"
            )
        folder.mkdir(exist_ok=True)
        for file in files:
            os.replace(file, folder / file.name)
    log.info(
        "%s: %s of run %s (%s%s) fetched",
        folder,
        ", ".join(file.name for file in files),
        run.run_id,
        run.status,
        of_job,
    )
    return folder


def job_inputs(spec: SweepSpec, uri: str, root: Path) -> list[Path]:
    """What a job's trials read that it must carry: the files of every trial's grid cells
    (``SweepSpec.check_trials``) and the inputs each stage of the chain declares in
    ``dvc.yaml`` (a stage's ``meta.json`` beside its data: :func:`declared_inputs`) that no
    stage of the chain writes in the trial itself."""
    chain = set(spec.settings.stages)
    declared = {
        root / dep
        for stage in chain
        for dep, writer in declared_inputs(stage, root / "dvc.yaml").items()
        if writer not in chain
    }
    return sorted(set(spec.check_trials(uri)) | declared)


def _is_secret(relative: PurePosixPath) -> bool:
    """Whether a file at ``relative`` is a known kind of secret (by its name or a folder's)."""
    return any(fnmatch.fnmatch(relative.name, pattern) for pattern in SECRET_FILES) or any(
        part in SECRET_FOLDERS for part in relative.parts[:-1]
    )


def job_package(root: Path, inputs: Iterable[Path], into: Path) -> list[str]:
    """Stage a Ray job's working directory in the empty folder ``into``: an allow-list, never
    the checkout with a deny-list. It holds the files git tracks or would track in ``root``
    (not git-ignored; as they are in the working tree: a new sweep spec too) and the ``inputs``
    the trials read (files, or folders taken whole: the DVC outputs the job needs), as links to
    them (Ray's packing reads through them), and no ``.gitignore``/``.rayignore`` (Ray would
    apply them to the inputs). A known secret file
    (:data:`SECRET_FILES`, :data:`SECRET_FOLDERS`) among them is refused, naming it; a missing
    input is left out with a warning (the job then stops saying how to send the data along).
    Returns the staged paths, relative to ``root``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        timeout=60,
    )
    if listed.returncode != 0:
        raise LearnableSparsityError(
            f"{root} is not a git checkout: --submit packs the files git tracks or would track "
            f"(`git init` there, or submit from a clone): {listed.stderr.decode().strip()}"
        )
    files = {PurePosixPath(name) for name in listed.stdout.decode().split("\0") if name}
    missing = []
    for source in inputs:
        source = source if source.is_absolute() else root / source
        if not source.is_relative_to(root):
            raise LearnableSparsityError(
                f"the trials read {source}, outside {root}: a job takes files of the checkout"
            )
        if not source.exists():
            missing.append(str(source))
            continue
        found = [source] if source.is_file() else [p for p in source.rglob("*") if p.is_file()]
        files |= {PurePosixPath(p.relative_to(root).as_posix()) for p in found}
    if missing:
        log.warning("the trials read %s, which are not here: the job goes without them", missing)
    files = {f for f in files if f.name not in RAY_IGNORE_FILES and (root / f).is_file()}
    secret = sorted(str(f) for f in files if _is_secret(f))
    if secret:
        raise LearnableSparsityError(
            f"the job's working directory would hold {secret}, which look like secrets: a job's "
            "files are stored in the cluster and unpacked on every node; move them out of the "
            "checkout (or out of git) and give each node its own (docs/tracking.md)"
        )
    for relative in files:
        (into / relative).parent.mkdir(parents=True, exist_ok=True)
        (into / relative).symlink_to(root / relative)
    return sorted(str(f) for f in files)


def submit(path: Path, address: str) -> str:
    """Submit the sweep ``path`` as a Ray job to the cluster whose dashboard is at ``address``
    (``http://<head>:8265``), with this checkout as its working directory (``data/`` included),
    ``$MLFLOW_TRACKING_URI`` and the checkout's commit (no credentials: a job's environment is
    shown by the dashboard and ``ray job list``; its tasks read each node's
    ``~/.mlflow/credentials``); follow its log; once it ended, fetch its
    reports (:func:`fetch_reports`); its final status. Ctrl-C detaches: the job goes on, and the
    command to fetch its reports later is logged."""
    spec = load_spec(path, PARAMS_FILE, PROFILES)  # a broken spec fails here, not on the cluster
    here = Path.cwd().resolve()
    if not path.resolve().is_relative_to(here):
        raise LearnableSparsityError(f"{path} is not inside {here}, the job's working directory")
    uri = tracking_uri(here)  # refuses a URI holding credentials: it goes into the job's env
    if not uri.startswith(("http://", "https://")):
        raise LearnableSparsityError(
            "set MLFLOW_TRACKING_URI to the tracking server the cluster logs to (http://host:5000)"
            ": the job's runs cannot reach this checkout's mlflow.db"
        )
    # The server takes this machine's credentials (the reports are fetched with them) before
    # the job starts; the job's own come from each node's ~/.mlflow/credentials, not from here.
    prepare(uri, spec.params.settings("mlflow", MlflowSettings).experiment)
    source = source_tags("sweep")
    env = {"MLFLOW_TRACKING_URI": uri}
    if GIT_COMMIT_TAG in source:
        env[GIT_COMMIT_ENV] = source[GIT_COMMIT_TAG]
        env[GIT_DIRTY_ENV] = source[GIT_DIRTY_TAG]
    relative = path.resolve().relative_to(here).as_posix()
    env[JOB_ENV] = f"sweep_{spec.name}_{secrets.token_hex(6)}"
    jobs = JobSubmissionClient(address)
    try:
        inputs = job_inputs(spec, uri, here)
        missing = [str(path) for path in inputs if not path.exists()]
        if missing:
            raise MissingInputError(f"the trials read {missing}, which are not here")
    except MissingInputError as error:
        raise LearnableSparsityError(f"{error}: `dvc repro` (or `dvc pull`) makes them") from None
    with tempfile.TemporaryDirectory(prefix="sweep-package-") as package:
        files = job_package(here, inputs, Path(package))
        log.info("the job's working directory: %d files (git's and inputs)", len(files))
        job = jobs.submit_job(  # Ray zips and uploads the package here, before it returns
            entrypoint=f"python -m pipelines.sweeps.run {relative}",
            runtime_env={"working_dir": package, "excludes": [], "env_vars": env},
            submission_id=env[JOB_ENV],
        )
    log.info("submitted %s to %s; `ray job logs %s` shows its log", job, address, job)

    async def follow() -> None:
        async for lines in jobs.tail_job_logs(job):
            print(lines, end="", flush=True)

    try:
        asyncio.run(follow())
    except KeyboardInterrupt:
        log.warning(
            "detached: job %s goes on; once it ended, "
            "`python -m pipelines.sweeps.run %s --fetch %s` puts its reports in %s",
            job,
            relative,
            job,
            REPORTS / spec.name,
        )
        raise
    status = str(jobs.get_job_status(job))
    try:
        fetch_reports(spec, uri, job)
    except LearnableSparsityError as error:
        if status == "SUCCEEDED":
            raise
        log.warning("%s", error)  # a job that failed early made none
    return status


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", type=Path, help="the sweep spec, e.g. sweeps/ssvae_lr.yaml")
    parser.add_argument("--submit", metavar="ADDRESS", help="as a Ray job to this dashboard")
    parser.add_argument(
        "--fetch",
        nargs="?",
        const="",
        metavar="JOB",
        help="only fetch the reports of the sweep that ran as Ray job JOB (default: the latest "
        "that ended) from $MLFLOW_TRACKING_URI into reports/sweeps/<name>/",
    )
    parser.add_argument("--verbose", action="store_true", help="tracebacks of errors")
    args = parser.parse_args()
    path = args.spec
    if args.submit or args.fetch is not None:
        logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
        try:
            if args.fetch is not None:
                spec = load_spec(path, PARAMS_FILE, PROFILES)
                fetch_reports(spec, tracking_uri(Path.cwd()), args.fetch or None)
                return
            status = submit(path, args.submit)
        except LearnableSparsityError as error:
            log.error("%s", error)
            raise SystemExit(1) from None
        except KeyboardInterrupt:
            raise SystemExit(130) from None
        log.info("job %s", status)
        raise SystemExit(0 if status == "SUCCEEDED" else 1)
    spec = functools.cache(lambda: load_spec(path, PARAMS_FILE, PROFILES))
    run_stage(
        f"sweep/{path.stem}",
        lambda stage: main(stage, spec()),
        params=lambda: spec().params,
    )


if __name__ == "__main__":
    cli()
