"""Run logging: ``train.log`` + console (runlog), per-step lines, ``metrics.jsonl`` and
completion dumps (metrics), TensorBoard / W&B / MLflow (trackers), live progress (progress)."""

from danka.logging.metrics import (
    CompletionsWriter,
    MetricsWriter,
    format_step_line,
    remove_completions_after,
    truncate_metrics_after,
)
from danka.logging.progress import TrainProgress
from danka.logging.runlog import close_run_logger, setup_run_logger
from danka.logging.trackers import (
    MlflowTracker,
    SafeTrackers,
    TensorBoardTracker,
    Tracker,
    WandbTracker,
    build_trackers,
)

__all__ = [
    "CompletionsWriter",
    "MetricsWriter",
    "MlflowTracker",
    "SafeTrackers",
    "TensorBoardTracker",
    "TrainProgress",
    "Tracker",
    "WandbTracker",
    "build_trackers",
    "close_run_logger",
    "format_step_line",
    "remove_completions_after",
    "setup_run_logger",
    "truncate_metrics_after",
]
