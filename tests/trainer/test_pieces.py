"""Trainer pieces without a model: prompt order, LR schedule, trimming, loss counts of
valid samples, the "correct" rule, checkpoint compatibility."""

from __future__ import annotations

import json

import pytest
import torch

from danka.errors import UserError
from danka.step.forward import trim
from danka.step.prompt_order import PromptSampler
from danka.step.records import ON_POLICY, TrainBatch
from danka.step.update import loss_norm
from danka.trainer.optim import build_scheduler
from danka.trainer.saving import check_compatible
from danka.types import RolloutBatch


def test_sampler_visits_each_prompt_once_per_epoch_and_resumes_exactly():
    s = PromptSampler(5, 2, seed=0)
    epoch0 = s.next_batch() + s.next_batch()  # 5 // 2 = 2 batches, the 5th prompt dropped
    assert len(set(epoch0)) == 4 and s.steps_per_epoch == 2
    state = s.state_dict()
    nxt = s.next_batch()  # first batch of epoch 1: another permutation (seed + 1)
    t = PromptSampler(5, 2, seed=0)
    t.load_state_dict(state)
    assert t.next_batch() == nxt and t.epoch == 1
    assert PromptSampler(4, 2, seed=0, shuffle=False).next_batch() == [0, 1]
    with pytest.raises(UserError, match="trained on 5 prompts"):
        PromptSampler(6, 2, seed=0).load_state_dict(state)


def test_lr_schedule_warmup_then_decay():
    def lrs(kind):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        sched = build_scheduler(opt, kind=kind, warmup_steps=2, total_steps=6)
        out = []
        for _ in range(6):
            out.append(round(sched.get_last_lr()[0], 4))
            opt.step()
            sched.step()
        return out

    # warm-up (step + 1) / 2: 0.5, 1; then progress (step - 2) / 4 over steps 2..5
    assert lrs("constant") == [0.5, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert lrs("linear") == [0.5, 1.0, 1.0, 0.75, 0.5, 0.25]
    # cosine 0.5 (1 + cos(pi p)), p = 0, 1/4, 1/2, 3/4 -> 1, 0.8536, 0.5, 0.1464
    assert lrs("cosine") == [0.5, 1.0, 1.0, 0.8536, 0.5, 0.1464]


def _batch() -> RolloutBatch:
    return RolloutBatch(
        prompt_ids=torch.tensor([[0, 0, 5], [0, 6, 7]]),
        prompt_mask=torch.tensor([[0, 0, 1], [0, 1, 1]]),
        response_ids=torch.tensor([[8, 9, 0, 0], [8, 0, 0, 0]]),
        response_mask=torch.tensor([[1.0, 1.0, 0, 0], [1.0, 0, 0, 0]]),
        group_index=torch.tensor([0, 0]),
        truncated=torch.tensor([False, False]),
    )


def _train(valid: list[bool]) -> TrainBatch:
    r = _batch()
    return TrainBatch.of(
        r, valid=torch.tensor(valid), advantages=torch.ones(2, 4), old_logprobs=ON_POLICY
    )


def test_trim_drops_all_padding_columns_only():
    for b in (trim(_batch()), trim(_train([True, True]))):
        # prompt: longest real prompt is 2 tokens -> keep the last 2 columns; response: 2
        assert b.prompt_ids.tolist() == [[0, 5], [6, 7]]
        assert b.response_ids.tolist() == [[8, 9], [8, 0]]
        assert b.loss_mask.shape == (2, 2)
    assert trim(_train([True, True])).old_logprobs is ON_POLICY  # a marker stays a marker


def test_invalid_samples_are_out_of_the_loss_counts():
    b = _train([True, False])
    # train_mask zeroes the invalid row: 2 tokens of 1 sequence (was 3 tokens of 2)
    assert b.train_mask.tolist() == [[1, 1, 0, 0], [0, 0, 0, 0]]
    norm = loss_norm(b, max_response_length=4)
    assert (norm.num_tokens, norm.num_seqs) == (2.0, 1.0)
    sub = b.select(torch.tensor([1]))
    assert sub.valid.tolist() == [False] and sub.old_logprobs is ON_POLICY


def test_checkpoint_compatibility(tmp_path):
    def cfg(**trainer):
        return {
            "model": {"actor_model_name_or_path": "m", "critic_model_name_or_path": None},
            "lora": {
                "enable_lora": True,
                "lora_r": 8,
                "lora_alpha": 16,
                "target_modules": ["q_proj"],
            },
            "trainer": {"advantage_estimator": "grpo", **trainer},
        }

    (tmp_path / "config.json").write_text(json.dumps(cfg()))
    check_compatible(tmp_path, cfg(lr=1.0))  # other settings may change
    with pytest.raises(UserError, match="no critic"):
        check_compatible(tmp_path, cfg(advantage_estimator="gae"))
    changed = cfg()
    changed["lora"]["lora_r"] = 16
    with pytest.raises(UserError, match="lora.lora_r=8"):
        check_compatible(tmp_path, changed)
    changed = cfg()
    changed["lora"]["lora_alpha"] = 32  # rescales every LoRA update: refused too
    with pytest.raises(UserError, match="lora.lora_alpha=16"):
        check_compatible(tmp_path, changed)
