"""Tiny-model training on CPU: GRPO and PPO with LoRA, full-parameter with KL."""

from __future__ import annotations

import json

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from danka.config import load_config
from danka.trainer.fit import fit

from .conftest import make_config


def run(tmp_path, model_dir, **sections):
    cfg, base = load_config(make_config(tmp_path, model_dir, **sections))
    return cfg, fit(cfg, base)


def test_grpo_lora_trains_and_writes_the_seed_layout(tmp_path, tiny_model_dir):
    cfg, _ = run(tmp_path, tiny_model_dir)
    out = tmp_path / "out"
    log = (out / "logs" / "train.log").read_text()
    assert "[INFO] Using HF Transformers backend for Actor/Critic inference" in log
    assert f"[INFO] Loaded model {tiny_model_dir}" in log
    assert "[INFO] LoRA enabled on q_proj, v_proj" in log
    assert "loss: " in log and "reward: " in log
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2]
    assert all(torch.isfinite(torch.tensor(x["loss"])) for x in lines)
    # the adapter loads with PEFT, changed from its zero-initialised B, base untouched
    ckpt = out / "actor" / "checkpoint_2"
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    base_state = {k: v.clone() for k, v in base.state_dict().items()}
    model = PeftModel.from_pretrained(base, ckpt)
    adapter = load_file(ckpt / "adapter_model.safetensors")
    lora_b = [v for k, v in adapter.items() if "lora_B" in k]
    assert lora_b and any(v.abs().sum() > 0 for v in lora_b)
    merged = model.merge_and_unload()
    changed = [k for k, v in merged.state_dict().items() if not torch.equal(v, base_state[k])]
    assert changed and all("q_proj" in k or "v_proj" in k for k in changed)
    first = json.loads((out / "completions" / "step_1.jsonl").read_text().splitlines()[0])
    assert set(first["rewards"]) == {"reward"} and first["reward"] == first["rewards"]["reward"]


def test_ppo_lora_trains_a_critic(tmp_path, tiny_model_dir):
    run(
        tmp_path,
        tiny_model_dir,
        trainer={
            "algorithm": "ppo",
            "samples_per_prompt": 1,
            "micro_batch_size": 1,
            "batch_size": 2,
            "total_steps": 2,
        },
    )
    out = tmp_path / "out"
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert all("critic/vf_loss" in x for x in lines)
    critic = out / "critic" / "checkpoint_2"
    assert (critic / "adapter_model.safetensors").exists()
    assert any(p.name.startswith("value_head") for p in critic.iterdir())


def test_full_parameter_grpo_with_kl_reference(tmp_path, tiny_model_dir):
    cfg, _ = run(
        tmp_path,
        tiny_model_dir,
        lora={"enable_lora": False},
        trainer={"lr": 1e-3, "kl": {"coef": 0.1, "estimator": "k3"}},
    )
    out = tmp_path / "out"
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    # step 1 starts at the reference: KL is 0; step 2 has moved away from it
    assert lines[0]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)
    assert lines[1]["actor/kl_loss"] > 0
    assert (out / "actor" / "checkpoint_2" / "model.safetensors").exists()


def test_preflight_and_oom_is_explained(tmp_path, tiny_model_dir, monkeypatch, capsys):
    """Preflight runs the worst case without an optimizer step; an out-of-memory in its
    update is reported with the phase and the settings to change (exit code 2: the
    settings do not fit the card)."""
    import danka.step.update as upd
    from danka.cli import main

    cfg_path = make_config(tmp_path, tiny_model_dir, trainer={"preflight": True, "total_steps": 1})
    cfg, base = load_config(cfg_path)
    fit(cfg, base)
    log = (tmp_path / "out" / "logs" / "train.log").read_text()
    assert "preflight passed at the worst-case shapes (2 x 4 sequences" in log

    def boom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(upd, "actor_minibatch", boom)
    code = main(["train", str(cfg_path), "output_dir=" + str(tmp_path / "oom")])
    assert code == 2
    err = capsys.readouterr().err
    assert "out of memory during update (2 prompts x 4 samples, micro-batch 4" in err
    assert "in the preflight at the worst-case shapes" in err
    assert "micro_batch_size" in err and "use_gradient_checkpointing" in err
    assert "danka estimate CONFIG --gpu-memory SIZE" in err
    # without preflight: the halving retries reach micro-batch 1, then the same verdict
    no_pre = ["output_dir=" + str(tmp_path / "oom2"), "trainer.preflight=false"]
    assert main(["train", str(cfg_path), *no_pre]) == 2
    err = capsys.readouterr().err
    assert "micro-batch 1" in err and "at the smallest micro_batch_size the halving" in err
    # with the retries off the first out-of-memory stops the run as a fault (exit 3)
    off = [*no_pre[1:], "output_dir=" + str(tmp_path / "oom3"), "speed.auto_micro_batch=false"]
    assert main(["train", str(cfg_path), *off]) == 3
    assert "micro-batch 4" in capsys.readouterr().err


def test_an_oom_in_the_update_halves_the_micro_batch_for_the_rest_of_the_run(
    tmp_path, tiny_model_dir, monkeypatch
):
    import danka.step.update as upd

    real, calls = upd.actor_minibatch, []

    def flaky(models, algo, opt, mini, settings, micro_size, *rest):
        calls.append(micro_size)
        if micro_size > 2:
            raise torch.OutOfMemoryError("out of memory")
        return real(models, algo, opt, mini, settings, micro_size, *rest)

    monkeypatch.setattr(upd, "actor_minibatch", flaky)
    cfg, _ = run(tmp_path, tiny_model_dir, trainer={"total_steps": 2})  # on by default
    # the run's state halves once and stays halved (step 2 starts at 2); the validated
    # config stays as written (read-only)
    assert calls[:2] == [4, 2] and 4 not in calls[2:] and cfg.trainer.micro_batch_size == 4
    log = (tmp_path / "out" / "logs" / "train.log").read_text()
    assert log.count("out of memory in the update: micro_batch_size 4 -> 2 (kept for") == 1


def test_an_oom_in_the_log_probs_halves_the_micro_batch_with_the_same_numbers(
    tmp_path, tiny_model_dir, monkeypatch
):
    """The reference log-probs (KL to the reference) run out at micro-batch 4: computed
    again at 2, the run trains on, and its losses equal an untroubled run's (the forward
    under no_grad has no randomness; losses use the step's token counts)."""
    import danka.step.prepare as prep

    kl = {"kl": {"coef": 0.01}}  # a reference forward at every step
    for side in ("clean", "oom"):
        (tmp_path / side).mkdir()
    _, clean = run(tmp_path / "clean", tiny_model_dir, trainer={"total_steps": 1}, loss=kl)
    real, calls = prep.batched, []

    def flaky(fn, model, batch, micro, **kw):
        calls.append(micro)
        if micro > 2:
            raise torch.OutOfMemoryError("out of memory")
        return real(fn, model, batch, micro, **kw)

    monkeypatch.setattr(prep, "batched", flaky)
    _, got = run(tmp_path / "oom", tiny_model_dir, trainer={"total_steps": 1}, loss=kl)
    assert calls[:2] == [4, 2]
    log = (tmp_path / "oom" / "out" / "logs" / "train.log").read_text()
    assert "out of memory in the logprobs: micro_batch_size 4 -> 2 (kept for" in log
    lines = {
        side: json.loads((tmp_path / side / "out" / "metrics.jsonl").read_text())
        for side in ("clean", "oom")
    }
    assert lines["oom"]["loss"] == pytest.approx(lines["clean"]["loss"], rel=1e-5, abs=1e-7)
    assert got["steps"] == clean["steps"] == 1


def test_an_oom_at_micro_batch_1_stops_with_the_explanation(tmp_path, tiny_model_dir, monkeypatch):
    import danka.step.update as upd
    from danka.step.guards import OutOfMemory

    def boom(*args, **kwargs):
        raise torch.OutOfMemoryError("out of memory")

    monkeypatch.setattr(upd, "actor_minibatch", boom)
    with pytest.raises(OutOfMemory, match=r"out of memory during update \(.*micro-batch 1"):
        run(tmp_path, tiny_model_dir, trainer={"total_steps": 1})
    log = (tmp_path / "out" / "logs" / "train.log").read_text()
    assert "micro_batch_size 4 -> 2" in log and "micro_batch_size 2 -> 1" in log


def test_non_finite_steps_are_skipped_then_stop_with_an_explanation(
    tmp_path, tiny_model_dir, monkeypatch, capsys
):
    """A NaN loss skips the optimizer step (weights untouched); max_bad_steps in a row stop
    the run with exit code 3 and the likely causes."""
    from danka.algorithms.losses import POLICY_LOSSES
    from danka.cli import main

    real_get = POLICY_LOSSES.get

    def nan_loss(name, *a, **k):
        fn = real_get(name, *a, **k)
        return lambda *args, **kw: (fn(*args, **kw)[0] * float("nan"), {})

    monkeypatch.setattr(POLICY_LOSSES, "get", nan_loss)
    cfg_path = make_config(tmp_path, tiny_model_dir, trainer={"max_bad_steps": 2, "total_steps": 4})
    assert main(["train", str(cfg_path)]) == 3
    err = capsys.readouterr().err
    assert "2 steps in a row had a non-finite loss or gradient (last: step 2)" in err
    assert "lower optim.lr" in err
    lines = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [x["skipped_step"] for x in lines] == [1.0, 1.0]


def test_grpo_with_packing_trains_without_padding(tmp_path, tiny_model_dir):
    run(tmp_path, tiny_model_dir, data={"packing": True, "max_packed_length": 512})
    lines = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    # 8 sequences of a step fit one 512-token row: only the real tokens are computed
    assert [x["packing/effective_token_ratio"] for x in lines] == [1.0, 1.0]
    assert all(x["loss"] is not None and x["actor/grad_norm"] > 0 for x in lines)


def test_an_oom_in_the_rollout_halves_the_sequences_per_generate_call(
    tmp_path, tiny_model_dir, monkeypatch
):
    """2 prompts x 4 samples in one generate call run out; the engine halves to 4 sequences
    (one group) a call, the step samples again and trains; the size stays."""
    from danka.rollout.hf import HFGenerateEngine

    real = HFGenerateEngine._generate_chunk

    def flaky(self, model, prompts, params, *rest):
        if len(prompts) * params.n > 4 and params.n > 1:  # the training rollout, not eval
            raise torch.OutOfMemoryError("out of memory")
        return real(self, model, prompts, params, *rest)

    monkeypatch.setattr(HFGenerateEngine, "_generate_chunk", flaky)
    _, result = run(tmp_path, tiny_model_dir, trainer={"total_steps": 2})
    assert result["steps"] == 2
    log = (tmp_path / "out" / "logs" / "train.log").read_text()
    # once: step 2 generates 4 at a time from the start
    assert log.count("out of memory in the rollout: sequences per generate call 8 -> 4") == 1


def test_micro_batch_auto_on_a_cpu_takes_8_and_says_so(tmp_path, tiny_model_dir):
    _, result = run(
        tmp_path, tiny_model_dir, trainer={"total_steps": 1, "micro_batch_size": "auto"}
    )
    assert result["steps"] == 1
    log = (tmp_path / "out" / "logs" / "train.log").read_text()
    # 2 prompts x 4 samples = 8 sequences a mini-batch: 8 is a divisor and the CPU size
    # the log-prob chunk is auto by default too: the CPU's 1024
    assert (
        "trainer.micro_batch_size, speed.logprob_chunk_size: auto -> micro-batch 8, log-prob "
        "chunk 1024 (auto: a CPU run, no memory plan)" in log
    )
    assert "micro-batch 8 sequences" in log


def test_a_gpu_memory_budget_is_refused_on_a_cpu(tmp_path, tiny_model_dir, capsys):
    from danka.cli import main

    cfg_path = make_config(tmp_path, tiny_model_dir, speed={"gpu_memory": "24GiB"})
    assert main(["train", str(cfg_path)]) == 2
    err = capsys.readouterr().err
    assert "speed.gpu_memory plans a GPU's memory; this run is on cpu" in err
    assert "Traceback" not in err


def test_auto_sizes_on_a_cpu_run_take_the_defaults_and_say_so(tmp_path, tiny_model_dir):
    """rollout.generation_batch_size and speed.logprob_chunk_size auto on a CPU: all 8
    sequences per generate call (2 prompts x 4), chunk 1024; the run trains and the
    start-up line names the planned values. The losses equal a run with those values
    written out (the same computation)."""
    auto = {"generation_batch_size": "auto"}, {"logprob_chunk_size": "auto"}
    for side in ("auto", "written"):
        (tmp_path / side).mkdir()
    run(tmp_path / "auto", tiny_model_dir, rollout=auto[0], speed=auto[1])
    run(tmp_path / "written", tiny_model_dir, rollout={"generation_batch_size": 8},
        speed={"logprob_chunk_size": 1024})  # fmt: skip
    log = (tmp_path / "auto" / "out" / "logs" / "train.log").read_text()
    assert (
        "rollout.generation_batch_size, speed.logprob_chunk_size: auto -> micro-batch 4, "
        "generation batch 8, log-prob chunk 1024 (auto: a CPU run, no memory plan)" in log
    )
    got = {
        side: [json.loads(x)["loss"] for x in (tmp_path / side / "out" / "metrics.jsonl").open()]
        for side in ("auto", "written")
    }
    assert got["auto"] == pytest.approx(got["written"], rel=1e-6)


def test_evaluations_between_first_and_last_use_the_subset(tmp_path, tiny_model_dir):
    """eval.subset_size: the middle evaluations read the first N held-out prompts, the
    first and the last every prompt; each record says when it ended (eval/minutes)."""
    run(
        tmp_path,
        tiny_model_dir,
        trainer={"total_steps": 3},
        data={"train_dataset": "rows.jsonl", "eval_size": 6},
        eval={"every_steps": 1, "subset_size": 2},
    )
    evals = {
        s: json.loads((tmp_path / "out" / "eval" / f"step_{s}.json").read_text()) for s in range(4)
    }
    assert [evals[s]["eval/n"] for s in range(4)] == [6, 2, 2, 6]
    minutes = [evals[s]["eval/minutes"] for s in range(4)]
    assert minutes == sorted(minutes) and minutes[0] > 0
    # the middle ones graded the same two prompts the full ones start with
    assert [x["prompt"] for x in evals[1]["samples"]] == [
        x["prompt"] for x in evals[0]["samples"][:2]
    ]


def test_ppo_padding_free_trains_as_the_padded_run_and_reports_model_flops(
    tmp_path, tiny_model_dir
):
    """speed.packed_update: true on the CPU (per-sequence attention): a PPO run with a
    critic, token-budget micro-batches and LoRA, whose losses follow the padded run's; the
    step metrics carry each phase's model TFLOP/s (no MFU off an H100/H200)."""
    ppo = {"algorithm": "ppo", "samples_per_prompt": 1, "micro_batch_size": 1, "batch_size": 2,
           "total_steps": 2}  # fmt: skip
    losses = {}
    for on in (False, True):
        side = tmp_path / str(on)
        side.mkdir()
        run(side, tiny_model_dir, trainer=ppo, speed={"packed_update": on})
        lines = [json.loads(x) for x in (side / "out" / "metrics.jsonl").read_text().splitlines()]
        losses[on] = [(x["loss"], x["critic/vf_loss"]) for x in lines]
        assert all(x["perf/update_tflops"] > 0 and x["perf/values_tflops"] > 0 for x in lines)
        assert not any(k.endswith("_mfu") for k in lines[0])
    assert lines[0]["packing/effective_token_ratio"] == 1.0
    for got, want in zip(losses[True], losses[False]):
        assert got == pytest.approx(want, rel=1e-3, abs=1e-5)
