"""Experiment trackers: TensorBoard (default), Weights & Biases and MLflow (optional extras).

A tracker never stops training: a service unreachable at start-up makes the tracker fall
back to offline / local storage with a warning, and :class:`SafeTrackers` disables any
tracker whose ``log`` raises. Only a tracker the config asks for whose package is missing
is an error (:class:`~danka.errors.UserError`, before anything starts).
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Protocol

from danka.errors import UserError
from danka.schema.sections import LoggingConfig


class Tracker(Protocol):
    """Receives the step's scalar metrics."""

    name: str

    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


def scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The numeric entries of ``metrics`` as floats (0-d tensors included); others dropped."""
    out = {}
    for key, value in metrics.items():
        if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
            value = value.item()
        if isinstance(value, (int, float)):
            out[key] = float(value)
    return out


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _import_extra(module: str, extra: str, key: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise UserError(
            f"{key} is set but the {module} package is not installed",
            where=f"logging.{key}",
            fix=f"pip install danka[{extra}]  (or set {key}: null to disable it)",
        ) from err


class TensorBoardTracker:
    """Scalars to ``OUTPUT/tensorboard/`` (one event file per process), flushed every step."""

    name = "tensorboard"

    def __init__(self, log_dir: Path, config: dict | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))
        if config:
            text = json.dumps(config, indent=2, sort_keys=True, default=str)
            self.writer.add_text("config", f"```\n{text}\n```", 0)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in scalars(metrics).items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """Weights & Biases run; falls back to ``mode="offline"`` if the service is unreachable
    (sync later with ``wandb sync OUTPUT/wandb/offline-run-*``)."""

    name = "wandb"

    def __init__(
        self,
        project: str,
        run_name: str | None,
        config: dict,
        output_dir: Path,
        log: logging.Logger,
    ):
        wandb = _import_extra("wandb", "wandb", "wandb_project")
        kwargs = dict(project=project, name=run_name, config=config, dir=str(output_dir))
        try:
            self.run = wandb.init(**kwargs)
        except Exception as err:  # why: any failure to reach the service
            log.warning("wandb.init failed (%s); logging to wandb offline mode instead", err)
            self.run = wandb.init(**kwargs, mode="offline")

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(scalars(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    """MLflow run via ``MlflowClient`` (no global active run). Tracking URI from
    ``MLFLOW_TRACKING_URI``, else ``OUTPUT/mlruns``; if the server is unreachable, warns
    and falls back to ``OUTPUT/mlruns``."""

    name = "mlflow"

    def __init__(
        self,
        experiment: str,
        run_name: str | None,
        config: dict,
        output_dir: Path,
        log: logging.Logger,
    ):
        _import_extra("mlflow", "mlflow", "mlflow_experiment")
        local_uri = (Path(output_dir).resolve() / "mlruns").as_uri()
        uri = os.environ.get("MLFLOW_TRACKING_URI") or local_uri
        try:
            self._start(uri, experiment, run_name, config)
        except Exception as err:  # why: any failure to reach the server
            if uri == local_uri:
                raise
            log.warning("MLflow at %s failed (%s); logging to %s instead", uri, err, local_uri)
            self._start(local_uri, experiment, run_name, config)

    def _start(self, uri: str, experiment: str, run_name: str | None, config: dict) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name(experiment)
        exp_id = exp.experiment_id if exp else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(exp_id, run_name=run_name).info.run_id
        params = [Param(k, str(v)[:500]) for k, v in sorted(_flatten(config).items())]
        for i in range(0, len(params), 100):  # MLflow accepts at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, v, now, step) for k, v in scalars(metrics).items() if math.isfinite(v)]
        for i in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[i : i + 1000])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def build_trackers(
    output_dir: Path,
    settings: LoggingConfig,
    *,
    run_name: str | None,
    config: dict,
    log: logging.Logger,
) -> list[Tracker]:
    """The trackers ``settings`` (the config's ``logging``: tensorboard, wandb_project,
    mlflow_experiment) asks for. Missing packages are checked first, so a
    UserError comes before any tracker starts; failing services only warn. Secrets in
    ``config`` (keys named like token/key/secret/password) are masked before any tracker
    sees it."""
    from danka.schema.secrets import mask_secrets

    config = mask_secrets(config)
    tensorboard = settings.tensorboard
    wandb_project, mlflow_experiment = settings.wandb_project, settings.mlflow_experiment
    if wandb_project:
        _import_extra("wandb", "wandb", "wandb_project")
    if mlflow_experiment:
        _import_extra("mlflow", "mlflow", "mlflow_experiment")
    output_dir = Path(output_dir)
    trackers: list[Tracker] = []
    factories = []
    if tensorboard:
        factories.append(
            ("tensorboard", lambda: TensorBoardTracker(output_dir / "tensorboard", config))
        )
    if wandb_project:
        factories.append(
            ("wandb", lambda: WandbTracker(wandb_project, run_name, config, output_dir, log))
        )
    if mlflow_experiment:
        factories.append(
            ("mlflow", lambda: MlflowTracker(mlflow_experiment, run_name, config, output_dir, log))
        )
    for name, make in factories:
        try:
            trackers.append(make())
        except UserError:
            raise
        except Exception as err:  # why: a tracker never stops training
            log.warning("Could not start the %s tracker (%s); continuing without it", name, err)
    return trackers


class SafeTrackers:
    """Fans ``log`` out to several trackers; a tracker that raises is warned about once and
    dropped, training goes on."""

    def __init__(self, trackers: list[Tracker], log: logging.Logger):
        self.trackers = list(trackers)
        self.log_ = log

    def _call(self, method: str, *args: Any) -> None:
        for tracker in list(self.trackers):
            try:
                getattr(tracker, method)(*args)
            except Exception as err:  # why: a tracker never stops training
                name = getattr(tracker, "name", type(tracker).__name__)
                self.log_.warning(
                    "Tracker %s failed in %s (%s: %s); disabled for the rest of the run",
                    name,
                    method,
                    type(err).__name__,
                    err,
                )
                self.trackers.remove(tracker)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._call("log", metrics, step)

    def close(self) -> None:
        self._call("close")
        self.trackers.clear()
