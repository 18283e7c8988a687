"""The values a config derives from what the user wrote, filled in once before the checks
(``--print-config`` and the start-up line show them): the data source, the dtype's
canonical name, the algorithm's preset, samples per prompt, the mini-batch, the rollout
correction's cap and the prompt budget."""

from __future__ import annotations

from danka.algorithms.advantages import ADVANTAGE_ESTIMATORS
from danka.algorithms.presets import ALGORITHMS
from danka.schema.dtypes import canonical_dtype
from danka.schema.sections import DankaConfig

# default cap of each rollout correction mode (TRL's token cap, verl's sequence threshold)
CORRECTION_CAPS = {"none": 3.0, "token_tis": 3.0, "seq_mask": 2.0}


def resolve(cfg: DankaConfig, explicit: set[str], at) -> DankaConfig:
    """``cfg`` with its derived values filled in (in place; returned for reading).
    ``explicit``: the dotted keys the user set (a preset never overrides them); ``at``:
    where a key was written, and ``at.fail`` for a conflict found while deriving."""
    m, t, d = cfg.model, cfg.trainer, cfg.data
    resolve_data_source(cfg)  # a named file replaces a generated task (one warning)
    m.torch_dtype = canonical_dtype(m.torch_dtype)  # the loaders know the long names only
    if m.use_flash_attention_2 and m.attn_implementation not in (None, "flash_attention_2"):
        at.fail(
            "model.use_flash_attention_2",
            "conflicts with model.attn_implementation",
            "set only one of them",
        )
    if m.use_flash_attention_2:
        m.attn_implementation = "flash_attention_2"
    preset = ALGORITHMS.get(t.algorithm, where=at.where("trainer.algorithm"))
    if t.advantage_estimator is None:
        t.advantage_estimator = preset.advantage_estimator
    for key, value in preset.settings.items():  # the paper's settings, unless set by the user
        if key not in explicit:
            section, leaf = key.split(".")
            setattr(getattr(cfg, section), leaf, value)
    if t.samples_per_prompt is None:
        t.samples_per_prompt = 8 if ADVANTAGE_ESTIMATORS.meta(t.advantage_estimator).grouped else 1
    rc = t.rollout_correction
    if rc.cap is None:
        rc.cap = CORRECTION_CAPS.get(rc.mode, 3.0)
    if t.mini_batch_size is None:
        t.mini_batch_size = t.batch_size
    if d.max_prompt_length is None:
        agent = cfg.agent.tools or cfg.agent.environment  # the response spans all turns
        response = max(cfg.agent.max_total_tokens, t.max_new_tokens) if agent else 0
        d.max_prompt_length = t.max_length - max(response, t.max_new_tokens)
    return cfg


def resolve_data_source(cfg: DankaConfig) -> None:
    """``data.train_dataset`` and ``data.task`` both set: the file is what the user means
    (``danka train quickstart.yaml data.train_dataset=my.jsonl``), so it replaces the task,
    with one warning (logged at start-up, printed by ``--print-config``)."""
    from danka.config.compat import add_warning

    d = cfg.data
    if not (d.train_dataset and d.task):
        return
    if d.eval_dataset:
        held = f"held-out prompts from data.eval_dataset ({d.eval_dataset})"
    elif d.eval_size:
        held = f"the last {d.eval_size} rows of the file held out (data.eval_size)"
    else:
        held = "no held-out evaluation"
    add_warning(
        cfg,
        f"data.train_dataset ({d.train_dataset}) replaces data.task ({d.task}): training on "
        f"the file, not on generated problems; {held}",
    )
    d.task = None
