"""The run doctor: checks that say when a run is not learning, and why.

Pure functions over plain data (a run's resolved config, its metrics lines, evaluations
and saved completions) returning :class:`Finding` s. One implementation serves both
``danka doctor RUN_DIR`` (:func:`diagnose` over :func:`read_run_dir`) and the training
loop's live ``[WARNING]`` lines (:class:`LiveDiagnoser`, :func:`config_findings`). The
checks are registered in ``CHECKS`` (checks_config, checks_train, checks_eval); config keys
are read through ``settings.setting`` only. ``floors`` (the guess floor of a held-out set)
and ``probe`` (the general-prompt drift probe) compute what the evaluation records.
"""

from danka.diagnose import checks_config, checks_eval, checks_train  # noqa: F401 - register
from danka.diagnose.findings import (
    CHECKS,
    CheckMeta,
    Finding,
    LiveDiagnoser,
    config_findings,
    diagnose,
)
from danka.diagnose.record import RunRecord, read_run_dir

__all__ = [
    "CHECKS",
    "CheckMeta",
    "Finding",
    "LiveDiagnoser",
    "RunRecord",
    "config_findings",
    "diagnose",
    "read_run_dir",
]
