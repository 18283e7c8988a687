import pytest
import yaml

from danka.cli import main
from danka.config import load_config
from danka.models.tiny import qwen2_7b_config
from danka.planning.memory import GIB, estimate_memory
from danka.planning.shape import count_parameters
from danka.schema.units import parse_memory

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _config(tmp_path, model="Qwen/Qwen2-7B-Instruct", **trainer):
    cfg = {
        "model": {"actor_model_name_or_path": model},
        "trainer": {
            "algorithm": "grpo",
            "batch_size": 4,
            "samples_per_prompt": 4,
            "micro_batch_size": 4,
            "max_length": 1024,
            "max_new_tokens": 512,
            **trainer,
        },
        "data": {"train_dataset": "x.jsonl"},
        "speed": {"logprob_chunk_size": 1024},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def counts_7b():
    return count_parameters(qwen2_7b_config(), ALL, 8)


def test_7b_parameter_count_by_hand(counts_7b):
    params, lora = counts_7b
    h, i, v, kv = 3584, 18944, 152064, 512  # kv = 4 heads x 128
    layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * i + 2 * h  # qkv bias, 2 norms
    assert params == 2 * v * h + 28 * layer + h  # untied embed + head, final norm
    # LoRA r=8: r x (in + out) per adapted linear
    per_layer = 8 * (2 * (h + h) + 2 * (h + kv) + 2 * (h + i) + (i + h))
    assert lora == 28 * per_layer


def test_7b_estimate_order_of_magnitude_and_verdict(tmp_path, counts_7b):
    cfg, base = load_config(str(_config(tmp_path)), [])
    plan = estimate_memory(
        cfg, base_dir=base, gpu_memory=parse_memory("24GB"), model_config=qwen2_7b_config()
    )
    weights = plan.components["weights"]
    assert weights == counts_7b[0] * 2 and 14e9 < weights < 16e9  # ~15 GB in bf16
    # KV cache: 28 layers x 2 x 512 x (512 prompt + 512 new) tokens x 16 sequences x 2 bytes
    assert plan.components["KV cache (rollout)"] == 28 * 2 * 512 * 1024 * 16 * 2
    assert plan.components["lora + Adam (fp32)"] == counts_7b[1] * 16
    assert plan.peak_phase == "update" and plan.verdict.fits is False
    assert any("use_gradient_checkpointing=true" in s for s in plan.verdict.suggestions)
    # checkpointing keeps only layer inputs: far less than full activations
    assert (
        plan.components["activations (checkpointing)"]
        < plan.components["activations (no checkpointing)"] / 10
    )
    big = estimate_memory(
        cfg, base_dir=base, gpu_memory=parse_memory("141GB"), model_config=qwen2_7b_config()
    )
    assert big.verdict.fits is True and big.verdict.suggestions == ()


def test_tiny_model_count_matches_the_real_model(tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    cfg, base = load_config(str(_config(tmp_path, model=str(tiny_dir))), [])
    plan = estimate_memory(cfg, base_dir=base)
    real = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(str(tiny_dir)).parameters())
    assert plan.params == real
    assert plan.verdict is None


@pytest.mark.parametrize(
    "text, n",
    [
        ("24GB", 24 * GIB),
        ("80GiB", 80 * GIB),
        ("40", 40 * GIB),
        ("512MB", 512 * 2**20),
        ("1.5T", int(1.5 * 2**40)),
    ],
)
def test_parse_memory(text, n):
    assert parse_memory(text) == n


def test_cli_estimate_known_shape_offline(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = _config(tmp_path)
    assert main(["estimate", str(path), "--gpu-memory", "24GB"]) == 0
    out = capsys.readouterr().out
    assert "7.616B parameters" in out and "verdict: does not fit in 24.0 GiB" in out
    assert "try:" in out
    assert main(["estimate", str(path), "--gpu-memory", "lots"]) == 2


def test_qlora_4bit_base_weights_and_engine(tmp_path, counts_7b):
    cfg, base = load_config(str(_config(tmp_path)), ["model.load_in_4bit=true"])
    plan = estimate_memory(cfg, base_dir=base, model_config=qwen2_7b_config())
    params = counts_7b[0]
    h, i, kv, q = 3584, 18944, 512, 3584
    lin = 28 * ((q + 2 * kv) * h + q * h + 3 * i * h)  # decoder linears, quantised
    # NF4 + double quantisation: 0.5 + 1/64 + 4/16384 bytes; the rest (embeddings, head,
    # biases, norms) stays bf16 (freeze_quantized_base); plus one dequantised (I x H) bf16
    # weight in flight. 6.53e9 x 0.516 + 1.09e9 x 2 + 0.14e9 = 5.69e9
    expected = int(lin * (0.5 + 1 / 64 + 4 / 16384)) + (params - lin) * 2 + i * h * 2
    assert plan.components["weights"] == expected
    assert 5.6e9 < expected < 5.8e9  # vs ~15.2 GB in bf16
    assert plan.assumptions.rollout_engine == "hf"  # auto: the fast engine needs plain weights
    assert plan.assumptions.quantised_base == "4bit"
    assert "fast engine weight buffers" not in plan.components
    # bf16 residual stream: the HF engine's KV cache in 2 bytes, 16 sequences x 1024 tokens
    assert plan.components["KV cache (rollout)"] == 28 * 2 * 512 * 1024 * 16 * 2


def test_quantized_base_is_frozen_without_an_fp32_cast():
    """danka.trainer.components.freeze_quantized_base (QLoRA): every base tensor frozen; bf16
    stays bf16 (peft's prepare_model_for_kbit_training would cast it to fp32, ~4 GiB more on
    a 7B base and an fp32 residual stream); fp16 tensors are cast to fp32 (fp16 range)."""
    import torch

    from danka.models.tiny import tiny_causal_lm, tiny_tokenizer
    from danka.trainer.components import freeze_quantized_base

    model = tiny_causal_lm(tiny_tokenizer(), arch="qwen2").to(torch.bfloat16)
    freeze_quantized_base(model)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert not any(p.requires_grad for p in model.parameters())
    assert model.get_input_embeddings()(torch.tensor([[1, 2]])).dtype == torch.bfloat16
    half = tiny_causal_lm(tiny_tokenizer(), arch="qwen2").to(torch.float16)
    freeze_quantized_base(half)
    assert {p.dtype for p in half.parameters()} == {torch.float32}


def test_fast_engine_cache_is_a_batch_bucket_of_rounded_length(tmp_path, counts_7b):
    """The fast engine's KV cache has bucket_size(rows) rows (3 sequences -> the 8-row CUDA
    graph bucket) and the length rounded up to 32 (600 + 100 -> 704); HF's is exact."""
    from danka.rollout.fast.engine import FastEngine

    engine = FastEngine()
    assert (engine.seq_round, engine.prefill_batch) == (32, 32)  # the plan imports them
    sizes = {"algorithm": "ppo", "batch_size": 3, "samples_per_prompt": 1, "micro_batch_size": 1}
    over = ["data.max_prompt_length=600", "trainer.max_length=700", "trainer.max_new_tokens=100"]
    cfg, base = load_config(str(_config(tmp_path, **sizes)), over + ["rollout.engine=fast"])
    fast = estimate_memory(cfg, base_dir=base, model_config=qwen2_7b_config()).components
    cfg, base = load_config(str(_config(tmp_path, **sizes)), over + ["rollout.engine=hf"])
    hf = estimate_memory(cfg, base_dir=base, model_config=qwen2_7b_config()).components
    assert fast["KV cache (rollout)"] == 28 * 2 * 512 * 704 * 8 * 2
    assert hf["KV cache (rollout)"] == 28 * 2 * 512 * 700 * 3 * 2
    assert fast["logits (rollout)"] == 8 * 152064 * 4 * 3
    # prefill: 3 prompts x 600 tokens x 2 bytes x (4H + 2I) for both (n = 1)
    assert (
        fast["prefill (rollout)"] == hf["prefill (rollout)"] == 3 * 600 * 2 * (4 * 3584 + 2 * 18944)
    )


def test_fast_engine_cache_holds_one_decode_batch_not_the_whole_call(tmp_path):
    """64 prompts x 8 = 512 sequences a call: the fast engine decodes 256 at a time (its
    MAX_BATCH with generation_batch_size 0, whole groups), so its cache has 256 rows, not
    512 (the GSM8K GRPO example: the plan said 7.07 GiB for the rollout, an H100 measured
    4.41); generation_batch_size 512 decodes them all at once; HF's generate takes all 512."""
    sizes = {"batch_size": 64, "samples_per_prompt": 8, "micro_batch_size": 8}
    over = ["data.max_prompt_length=200", "trainer.max_length=712", "trainer.max_new_tokens=512"]
    kv = {}
    for engine, gen in (("fast", 0), ("fast", 512), ("fast", 100), ("hf", 0)):
        extra = [f"rollout.engine={engine}", f"rollout.generation_batch_size={gen}"]
        cfg, base = load_config(str(_config(tmp_path, **sizes)), over + extra)
        plan = estimate_memory(cfg, base_dir=base, model_config=qwen2_7b_config())
        kv[engine, gen] = plan.components["KV cache (rollout)"]
    layer_row_slot = 28 * 2 * 512 * 2  # layers x (k, v) x kv width (4 x 128) x bf16 bytes
    assert kv["fast", 0] == layer_row_slot * 736 * 256  # 712 rounded up to 32: 736 slots
    assert kv["fast", 512] == layer_row_slot * 736 * 512
    assert kv["fast", 100] == layer_row_slot * 736 * 128  # 12 groups of 8: the 128-row bucket
    assert kv["hf", 0] == layer_row_slot * 712 * 512


def test_fast_engine_holds_no_weight_copy_for_a_7b(tmp_path, counts_7b):
    cfg, base = load_config(str(_config(tmp_path)), ["rollout.engine=fast"])
    plan = estimate_memory(cfg, base_dir=base, model_config=qwen2_7b_config())
    # fused q|k|v + gate|up are views of the co-located parameters (fast.colocate):
    # only fp32 copies of the LoRA matrices remain
    assert plan.components["fast engine weight buffers"] == counts_7b[1] * 4


def test_fast_engine_cache_counts_in_the_update_only_when_kept(tmp_path, tiny_dir):
    """The fast engine frees its KV cache and buffers before the update unless
    rollout.keep_cache is true (its keeps_cache rule), whatever the model's size."""
    from danka.rollout.fast.options import keeps_cache

    assert not keeps_cache(None) and not keeps_cache(False) and keeps_cache(True)
    cfg, base = load_config(str(_config(tmp_path)), ["rollout.engine=fast"])
    big = estimate_memory(cfg, base_dir=base, model_config=qwen2_7b_config())
    c = big.components
    assert big.assumptions.rollout_cache_kept_for_update is False  # 15 GB of weights
    acts = c["activations (no checkpointing)"]  # no checkpointing: activations + head
    assert big.phases["update"] == big.persistent + acts + c["logits (chunked, update)"]
    # the rollout phase still holds them
    assert big.phases["rollout"] >= big.persistent + c["KV cache (rollout)"]

    over = ["rollout.engine=fast"]
    cfg, base = load_config(str(_config(tmp_path, model=str(tiny_dir))), over)
    freed = estimate_memory(cfg, base_dir=base)
    assert freed.assumptions.rollout_cache_kept_for_update is False
    cfg, base = load_config(
        str(_config(tmp_path, model=str(tiny_dir))), [*over, "rollout.keep_cache=true"]
    )
    small = estimate_memory(cfg, base_dir=base)
    c = small.components
    held = c["KV cache (rollout)"] + c["fast engine weight buffers"]
    assert small.assumptions.rollout_cache_kept_for_update is True
    acts = c["activations (no checkpointing)"]
    update = small.persistent + held + acts + c["logits (chunked, update)"]
    assert small.phases["update"] == update


def test_logits_chunk_counts_response_positions_only(tmp_path):
    """The LM head runs over response positions only (trainer.forward.policy_logprobs), so
    the chunk is min(logprob_chunk_size, micro x max_new_tokens), not micro x sequence.
    Measured on an H200 (bench/results/train_ppo_7b.json, 4 x (512 + 128)): counting the
    prompt too over-estimated the update by ~1.2 GiB."""
    v = 152064
    short = ["trainer.micro_batch_size=4", "trainer.max_new_tokens=128", "trainer.max_length=640"]
    cfg, base = load_config(str(_config(tmp_path)), short)
    plan = estimate_memory(cfg, base_dir=base, model_config=qwen2_7b_config())
    # 4 x 128 = 512 response rows < chunk 1024; compiled head (the default): 512 x V x
    # (4 bytes fp32 z + 2 bytes bf16 dz)
    assert plan.components["logits (chunked, update)"] == 512 * v * (4 + 2)
    # eagerly: 512 x V x 4 bytes x 4 (z, log-softmax, p, grad)
    eager, _ = load_config(str(_config(tmp_path)), [*short, "speed.fused_logprob_head=false"])
    plan_eager = estimate_memory(eager, base_dir=base, model_config=qwen2_7b_config())
    assert plan_eager.components["logits (chunked, update)"] == 512 * v * 4 * 4
    assert plan.full_logits_would_be == 512 * v * 4 * 4  # the 4 eager buffers, all rows
    cfg, base = load_config(str(_config(tmp_path)), ["trainer.micro_batch_size=4"])
    plan = estimate_memory(cfg, base_dir=base, model_config=qwen2_7b_config())
    # 4 x 512 = 2048 response rows > 1024: the chunk is capped at logprob_chunk_size
    assert plan.components["logits (chunked, update)"] == 1024 * v * (4 + 2)


def test_with_checkpointing_the_head_and_the_recomputed_layer_take_turns(tmp_path):
    """With gradient checkpointing the update holds the layer inputs (L x T x H x d) plus
    the larger of one recomputed layer (with its fp32 grad buffers) and the head's chunk,
    not their sum: the head's backward ends before the first layer is recomputed."""
    short = ["trainer.micro_batch_size=4", "trainer.max_new_tokens=128", "trainer.max_length=640",
             "model.use_gradient_checkpointing=true"]  # fmt: skip
    cfg, base = load_config(str(_config(tmp_path)), short)
    plan = estimate_memory(cfg, base_dir=base, model_config=qwen2_7b_config())
    c = plan.components
    inputs = 28 * (4 * 640) * 3584 * 2  # L x T x H x bf16 = 0.48 GiB
    layer = c["activations (checkpointing)"] - inputs
    assert layer > c["logits (chunked, update)"]  # here the recomputed layer is larger
    assert plan.phases["update"] == plan.persistent + inputs + layer


def test_a_critic_is_counted_whenever_the_estimator_needs_one(tmp_path):
    """The registry decides, not the algorithm's name: grpo with advantage_estimator gae
    trains a critic (validation builds one), so its plan holds the critic's LoRA and value
    head; plain grpo holds none."""
    plain, _ = load_config(_config(tmp_path))
    gae, _ = load_config(_config(tmp_path, advantage_estimator="gae"))
    a = estimate_memory(plain, model_config=qwen2_7b_config()).components
    b = estimate_memory(gae, model_config=qwen2_7b_config()).components
    assert "critic LoRA + value head" not in a
    assert "critic LoRA + value head" in b


def test_verdict_shows_the_margin_and_never_calls_full_logits_smaller(tmp_path):
    from danka.planning.memory import GIB
    from danka.tools.estimate import format_plan

    cfg, base = load_config(str(_config(tmp_path)), ["trainer.micro_batch_size=4"])
    plan = estimate_memory(cfg, base_dir=base, model_config=qwen2_7b_config())
    assert plan.full_logits_would_be >= plan.components["logits (chunked, update)"]
    needed = plan.peak + plan.overhead
    roomy = estimate_memory(cfg, base_dir=base, model_config=qwen2_7b_config(),
                            gpu_memory=int(needed * 2))  # fmt: skip
    assert roomy.verdict.fits and not roomy.verdict.tight
    assert "GiB to spare)" in format_plan(roomy) and "only just" not in format_plan(roomy)
    tight = estimate_memory(cfg, base_dir=base, model_config=qwen2_7b_config(),
                            gpu_memory=int(needed + 0.01 * GIB))  # fmt: skip
    assert tight.verdict.fits and tight.verdict.tight
    assert "fits only just" in format_plan(tight)
    short = ["trainer.micro_batch_size=4", "trainer.max_new_tokens=128", "trainer.max_length=640"]
    cfg, base = load_config(str(_config(tmp_path)), short)
    text = format_plan(estimate_memory(cfg, base_dir=base, model_config=qwen2_7b_config()))
    assert "chunking saves nothing at these settings" in text


def test_generation_batch_size_counts_sequences_in_whole_groups(tmp_path):
    """rollout.generation_batch_size counts sequences (as the engines read it), filled with
    whole groups: 4 prompts x 4 samples with 8 per call is 2 groups = 8 sequences; 6 per
    call rounds down to one group of 4; 0 is all 16 at once."""
    from danka.planning.inputs import PlanInput

    base = ["trainer.batch_size=4", "trainer.samples_per_prompt=4", "trainer.algorithm=grpo"]
    for per_call, seqs in ((0, 16), (8, 8), (6, 4), (2, 4), (64, 16)):
        cfg, _ = load_config(
            str(_config(tmp_path)), [*base, f"rollout.generation_batch_size={per_call}"]
        )
        assert PlanInput.of(cfg).sequences_per_call() == seqs, per_call
        plan = estimate_memory(cfg, model_config=qwen2_7b_config())
        assert plan.assumptions.rollout_sequences == seqs
