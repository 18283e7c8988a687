"""trainer.micro_batch_size: auto — the largest micro-batch the memory plan fits."""

import pytest
import yaml

from danka.cli import main
from danka.config import load_config
from danka.errors import UserError
from danka.models.tiny import qwen2_7b_config
from danka.planning.inputs import PlanInput
from danka.planning.memory import GIB, OVERHEAD_BYTES, price
from danka.planning.micro import plan_memory
from danka.planning.shape import ModelShape


def _config(tmp_path, rollout=None, **trainer) -> PlanInput:
    """What the plan reads of a Qwen2-7B (shape known offline), GRPO + LoRA, 4 prompts x 4
    samples: 16 sequences a mini-batch, log-prob chunk 1024; ``trainer`` and ``rollout``
    settings on top."""
    cfg = {
        "model": {"actor_model_name_or_path": "Qwen/Qwen2-7B-Instruct"},
        "trainer": {
            "algorithm": "grpo",
            "batch_size": 4,
            "samples_per_prompt": 4,
            "micro_batch_size": "auto",
            "max_length": 1024,
            "max_new_tokens": 512,
            **trainer,
        },  # fmt: skip
        "data": {"train_dataset": "x.jsonl"},
        "rollout": rollout or {},
        "speed": {"logprob_chunk_size": 1024},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return PlanInput.of(load_config(str(path), [])[0])


def _shape(inp: PlanInput, model_config=None) -> ModelShape:
    return ModelShape.of(model_config or qwen2_7b_config(), inp.target_modules, inp.lora_r)


def _plan(inp: PlanInput, budget, model_config=None):
    return plan_memory(inp, None if budget is None else _shape(inp, model_config), budget)


def _small_vocab():
    """Qwen2-7B with a 16,384-token vocabulary: a chunk of 1024 rows keeps 64 MiB of fp32
    logits (1024 x 16384 x 4 B), so auto tries every chunk, 1024 first."""
    config = qwen2_7b_config()
    config.vocab_size = 16384
    config.pad_token_id = config.bos_token_id = config.eos_token_id = 0
    return config


def _need(inp: PlanInput, model_config=None, **sizes) -> int:
    """The planned peak plus the CUDA reserve of ``inp`` with ``{field: value}``."""
    return price(inp.with_(**sizes), _shape(inp, model_config)).peak + OVERHEAD_BYTES


def _peak(cfg, micro):
    return _need(cfg, micro_batch_size=micro)


def test_auto_takes_the_largest_divisor_that_fits(tmp_path):
    cfg = _config(tmp_path)
    assert cfg.mini_batch_sequences() == 16  # 4 prompts x 4 samples
    # a budget between the plans at micro-batch 2 and 4: 2 is the largest that fits
    budget = (_peak(cfg, 2) + _peak(cfg, 4)) // 2
    assert _peak(cfg, 2) <= budget < _peak(cfg, 4)
    plan = _plan(cfg, budget)
    assert plan.micro == 2 and plan.fits and plan.peak + OVERHEAD_BYTES == _peak(cfg, 2)
    assert plan.line().startswith(f"micro-batch 2 (auto: planned {_peak(cfg, 2) / GIB:.1f} of")
    # every sequence at once when the budget holds it; the plan's copy has the size
    chosen = _plan(cfg, 10_000 * GIB)
    assert chosen.micro == 16 and chosen.sizes.micro_batch_size == 16
    assert cfg.micro_batch_size == "auto"


def test_auto_refuses_a_budget_that_one_sequence_does_not_fit(tmp_path):
    cfg = _config(tmp_path)
    plan = _plan(cfg, 4 * GIB)  # < the bf16 weights
    assert plan.micro == 1 and not plan.fits
    err = plan.refusal()
    assert isinstance(err, UserError) and err.where == "trainer.micro_batch_size"
    assert "nothing fits in 4.0 GiB: at micro-batch 1 the plan peaks at" in str(err)
    assert "danka estimate" in err.fix


@pytest.mark.parametrize("prompts, samples, size", [(8, 8, 8), (3, 4, 6), (2, 2, 4)])
def test_on_a_cpu_auto_is_the_largest_divisor_up_to_8(tmp_path, prompts, samples, size):
    # 64 sequences -> 8; 12 -> 6 (12's divisors: 12, 6, 4, ...); 4 -> 4
    cfg = _config(tmp_path, batch_size=prompts, samples_per_prompt=samples)
    plan = _plan(cfg, None)
    assert (
        plan.micro == size
        and plan.line() == f"micro-batch {size} (auto: a CPU run, no memory plan)"
    )


def test_a_numeric_micro_batch_is_left_alone(tmp_path):
    cfg = _config(tmp_path, micro_batch_size=4)
    plan = _plan(cfg, 1 * GIB)
    assert plan.sizes == cfg and plan.auto == () and plan.planned == ()


@pytest.mark.parametrize(
    "override, words",
    [
        ("trainer.micro_batch_size=big", "must be a number >= 1 or auto, got 'big'"),
        ("trainer.micro_batch_size=0", "must be a number >= 1 or auto, got 0"),
        ("speed.gpu_memory=lots", "cannot read memory size 'lots'"),
        ("rollout.generation_batch_size=many", "must be a number >= 0 or auto, got 'many'"),
        ("rollout.generation_batch_size=-1", "must be a number >= 0 or auto, got -1"),
        ("speed.logprob_chunk_size=0", "must be a number >= 1 or auto, got 0"),
    ],
)
def test_bad_values_are_refused_with_the_key(tmp_path, override, words):
    _config(tmp_path)
    with pytest.raises(UserError, match=words) as err:
        load_config(str(tmp_path / "c.yaml"), [override])
    assert override.split("=")[0] in str(err.value)  # the key, where it was set


def test_estimate_prints_the_planned_micro_batch(tmp_path, capsys, monkeypatch):
    import danka.planning.shape as shape

    _config(tmp_path)
    monkeypatch.setattr(shape, "load_model_config", lambda name, base_dir=None: qwen2_7b_config())
    assert main(["estimate", str(tmp_path / "c.yaml"), "--gpu-memory", "80GiB"]) == 0
    out = capsys.readouterr().out
    assert "trainer.micro_batch_size: auto -> micro-batch " in out and "of 80.0 GiB" in out


def test_a_bf16_7b_that_fits_nowhere_is_told_about_qlora(tmp_path):
    """16 GiB cannot hold the bf16 Qwen2-7B weights (14.2 GiB) plus a step: among the fixes
    is the NF4 base (QLoRA), with HF generate when the fast engine was asked for."""
    fast = {"engine": "fast", "use_gradient_checkpointing": True}
    plan = _plan(_config(tmp_path).with_(**fast), 16 * GIB)
    assert not plan.fits
    assert any(s.startswith("model.load_in_4bit=true rollout.engine=hf") for s in plan.suggestions)


def _auto_all(tmp_path, **trainer):
    """_config with the generation batch and the log-prob chunk auto too."""
    cfg = _config(tmp_path, **trainer)
    return cfg.with_(generation_batch_size="auto", logprob_chunk_size="auto")


def test_auto_generation_batch_and_chunk_take_the_largest_that_fit(tmp_path):
    """Order: all 16 sequences per generate call first, then the largest micro-batch, then
    the largest chunk; a budget that fits all 16 at micro-batch 16 with chunk 1024 gives
    exactly that; every planned value is named in the start-up line."""
    cfg = _auto_all(tmp_path)
    keys = {"rollout.generation_batch_size": 16, "trainer.micro_batch_size": 16,
            "speed.logprob_chunk_size": 1024}  # fmt: skip
    roomy = _need(cfg, _small_vocab(), generation_batch_size=16, micro_batch_size=16,
                  logprob_chunk_size=1024)  # fmt: skip
    plan = _plan(cfg, roomy, _small_vocab())
    assert plan.micro == 16 and dict(plan.planned) == keys
    assert plan.line().startswith("micro-batch 16, generation batch 16, log-prob chunk 1024 (auto")


def test_auto_chunk_shrinks_before_the_micro_batch_does(tmp_path):
    """Just below the plan at chunk 1024 (micro-batch 16, every sequence per call) and
    above the one at chunk 512: the micro-batch stays 16 and the chunk halves."""
    cfg = _auto_all(tmp_path)
    at = {"generation_batch_size": 16, "micro_batch_size": 16}
    big, small = (
        _need(cfg, _small_vocab(), **at, logprob_chunk_size=1024),
        _need(cfg, _small_vocab(), **at, logprob_chunk_size=512),
    )
    assert small < big
    plan = _plan(cfg, (big + small) // 2, _small_vocab())
    assert dict(plan.planned) == {"rollout.generation_batch_size": 16,
                                  "trainer.micro_batch_size": 16,
                                  "speed.logprob_chunk_size": 512}  # fmt: skip


def test_auto_generation_batch_halves_in_whole_groups_when_the_rollout_does_not_fit(tmp_path):
    """4 prompts x 4 samples: 16, 8, 4 sequences per call (whole groups of 4). A budget
    that the rollout of 16 at once exceeds even at micro-batch 1 and chunk 256, but 8 fits:
    8 per call."""
    cfg = _auto_all(tmp_path, max_length=4096, max_new_tokens=2048)
    cfg = cfg.with_(use_gradient_checkpointing=True)  # the rollout peaks
    smallest = {"micro_batch_size": 1, "logprob_chunk_size": 128}
    all_at_once = _need(cfg, **smallest, generation_batch_size=16)
    half = _need(cfg, **smallest, generation_batch_size=8)
    assert half < all_at_once
    plan = _plan(cfg, (all_at_once + half) // 2)
    assert plan.fits and dict(plan.planned)["rollout.generation_batch_size"] == 8
    from danka.planning.micro import candidates

    assert candidates(cfg)["generation_batch_size"] == [16, 8, 4]


def test_auto_sizes_on_a_cpu_are_the_defaults(tmp_path):
    # no device memory to plan: all 16 sequences at once, chunk 1024, micro-batch 8
    plan = _plan(_auto_all(tmp_path), None)
    assert dict(plan.planned) == {"rollout.generation_batch_size": 16,
                                  "trainer.micro_batch_size": 8,
                                  "speed.logprob_chunk_size": 1024}  # fmt: skip


def test_auto_chunks_are_sized_to_the_vocabulary():
    """auto tries the chunks whose fp32 logits take <= 640 MiB: 151,936 (Qwen2.5) -> all
    four (1024 x 151936 x 4 B = 594 MiB); 256,000 (Gemma) -> 512 first (1024 rows would be
    1000 MiB, 512 rows 500 MiB); 2,000,000 -> even 128 rows take 977 MiB: the smallest."""
    from danka.planning.memory import chunk_candidates

    assert chunk_candidates(151936) == [1024, 512, 256, 128]
    assert chunk_candidates(256000) == [512, 256, 128]
    assert chunk_candidates(2_000_000) == [128]


def test_the_default_chunk_is_auto_and_a_gpu_plan_sizes_it_to_the_head(tmp_path):
    """The schema's default speed.logprob_chunk_size is auto: with room to spare a Qwen2-7B
    (152k vocabulary) plan takes 1024 rows (594 MiB of fp32 logits); a tight one shrinks the
    chunk before the micro-batch; a CPU run keeps 1024."""
    cfg = _config(tmp_path, micro_batch_size=4).with_(logprob_chunk_size="auto")
    from danka.schema.sections import SpeedConfig

    assert SpeedConfig().logprob_chunk_size == "auto"
    plan = _plan(cfg, 10_000 * GIB)
    assert plan.logprob_chunk == 1024 and plan.micro == 4
    roomy = plan.peak + 1 * GIB + 1  # + OVERHEAD_BYTES: fits exactly at chunk 1024
    tight = _plan(cfg, roomy - 400 * 2**20)  # 400 MiB less: the head's chunk gives way
    assert tight.micro == 4 and tight.logprob_chunk < 1024
    assert dict(_plan(cfg, None).planned) == {"speed.logprob_chunk_size": 1024}


def test_cuda_graphs_add_one_gradient_of_the_trained_weights_to_the_update(tmp_path):
    cfg = _config(tmp_path).with_(micro_batch_size=2)
    shape = _shape(cfg)
    plain = price(cfg, shape)
    graphs = price(cfg.with_(cuda_graphs=True), shape)
    sums = shape.lora_params * 4  # fp32 sums of the adapters' gradients
    assert graphs.components["CUDA-graph gradient sums (update)"] == sums
    assert graphs.phases["update"] - plain.phases["update"] == sums
    assert graphs.phases["rollout"] == plain.phases["rollout"]
    full = cfg.with_(enable_lora=False, cuda_graphs=True)
    extra = (
        price(full, shape).phases["update"]
        - price(full.with_(cuda_graphs=False), shape).phases["update"]
    )
    assert extra == shape.params * 2  # bf16 gradients of every weight
    ckpt = cfg.with_(cuda_graphs=True, use_gradient_checkpointing=True)
    assert "CUDA-graph gradient sums (update)" not in price(ckpt, shape).components
