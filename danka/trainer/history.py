"""The run's history: its held-out evaluations so far and the held-out set's guess floors.
One owner, :class:`~danka.trainer.outputs.Outputs`, records into it; every checkpoint saves
it (``to_json``: the ``history`` of ``trainer_state``) and a resumed run starts from it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RunHistory:
    evals: list[dict] = field(default_factory=list)  # one record per evaluation, in order
    floors: dict | None = None  # the held-out set's guess floors (fixed at the first one)

    @classmethod
    def from_json(cls, raw: dict | None) -> RunHistory:
        """A checkpoint's ``history`` (``{"eval": [...], "floors": {...}}``)."""
        raw = raw or {}
        return cls(list(raw.get("eval") or []), raw.get("floors"))

    def to_json(self) -> dict:
        out: dict = {"eval": list(self.evals)}
        if self.floors is not None:
            out["floors"] = self.floors
        return out

    def add(self, record: dict, floors: dict) -> None:
        """An evaluation's record; its floors kept the first time."""
        if self.floors is None:
            self.floors = floors
        self.evals.append(record)
