"""danka/rollout/fast/colocate.py: co-located parameters (the fused matrices as views of the
model's own weights, no copy; rows reserved for a live adapter's A) and how
danka/rollout/fast/weights.py reads them, on tiny random models (CPU)."""

import torch

from danka.models.unwrap import unwrap_causal_lm
from danka.rollout.base import SamplingParams
from danka.rollout.fast.colocate import adjacent, colocate, reserved_rows
from danka.rollout.fast.engine import FastEngine
from danka.rollout.fast.weights import Owned, load_weights, model_spec

from .test_fast_engine import PROMPTS, fast_run, hf_greedy, tiny


def test_colocate_keeps_parameters_and_values_and_stores_them_back_to_back():
    model = tiny("qwen2")  # q/k/v biases too
    attn = model.model.layers[0].self_attn
    params = [attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]
    before = [p.detach().clone() for p in params]
    ids = [id(p) for p in params]
    assert adjacent(params) is None  # separate tensors as loaded
    # 2 layers x (q|k|v weight, q|k|v bias, gate|up weight); gate/up have no bias
    assert colocate(model) == 2 * 3
    assert [id(p) for p in params] == ids  # same nn.Parameter objects (optimizers keep them)
    assert all(torch.equal(p, b) for p, b in zip(params, before))
    fused = adjacent(params)
    assert fused is not None and fused.shape == (64 + 32 + 32, 64)  # 4 + 2 + 2 heads x 16
    assert fused.data_ptr() == params[0].data_ptr()
    torch.testing.assert_close(fused, torch.cat(before))
    assert colocate(model) == 0  # already back to back: nothing moves


def test_the_engine_reads_colocated_weights_without_a_copy():
    model = tiny("llama")
    engine = FastEngine()
    out = fast_run(model, SamplingParams(n=1, temperature=0.0, max_new_tokens=8), engine)
    torch.testing.assert_close(out.response_ids, hf_greedy(model, PROMPTS, max_new=8).response_ids)
    root = unwrap_causal_lm(model)
    owned = Owned()
    w = load_weights(root, model_spec(root), owned)
    assert owned.buf == {}  # no engine-owned weight at all
    assert w["0.qkv"].data_ptr() == root.model.layers[0].self_attn.q_proj.weight.data_ptr()
    assert w["1.gu"].data_ptr() == root.model.layers[1].mlp.gate_proj.weight.data_ptr()


def test_an_optimizer_step_on_colocated_weights_is_seen_and_saves_round_trip(tmp_path):
    """Full-parameter training: AdamW updates the co-located parameters in place (fused
    and foreach paths treat them as any parameter); the next rollout samples from the new
    weights (greedy = HF generate), and save_pretrained/from_pretrained round-trips them
    (transformers clones disjoint views of one storage)."""
    from transformers import AutoModelForCausalLM

    model = tiny("llama")
    engine = FastEngine()
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=8)
    first = fast_run(model, greedy, engine)  # co-locates
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    model.train()
    loss = model(input_ids=torch.tensor([PROMPTS[0]]), labels=torch.tensor([PROMPTS[0]])).loss
    loss.backward()
    opt.step()
    model.eval()
    after = fast_run(model, greedy, engine)
    torch.testing.assert_close(
        after.response_ids, hf_greedy(model, PROMPTS, max_new=8).response_ids
    )
    assert not torch.equal(first.response_ids, after.response_ids)
    model.save_pretrained(tmp_path)
    back = AutoModelForCausalLM.from_pretrained(tmp_path)
    for (name, p), q in zip(model.named_parameters(), back.parameters()):
        assert torch.equal(p, q), name


def test_a_live_adapter_is_folded_into_rows_reserved_after_the_weights():
    """lora_compute auto (= base): colocate reserves the stacked A rows after each adapted
    group, so the engine's [W; A] is a view of the model's storage (no weight copy); its
    tokens equal HF generate's with the adapter on (fp32 tiny model: exact arithmetic)."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny("llama"), LoraConfig(r=4, lora_alpha=8,
                                                     target_modules=["q_proj", "v_proj", "down_proj"]))  # fmt: skip
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.3)
    model.eval()
    engine = FastEngine()
    out = fast_run(model, SamplingParams(n=1, temperature=0.0, max_new_tokens=8), engine)
    torch.testing.assert_close(out.response_ids, hf_greedy(model, PROMPTS, max_new=8).response_ids)
    root = unwrap_causal_lm(model)
    attn, mlp = root.model.layers[0].self_attn, root.model.layers[0].mlp
    q = attn.q_proj.get_base_layer().weight
    down = mlp.down_proj.get_base_layer().weight
    assert reserved_rows(q) == 8 and reserved_rows(down) == 4  # q + v ranks; down's
    owned = Owned(lora_compute="base")
    w = load_weights(root, model_spec(root), owned)
    assert w["0.qkv"].shape == (64 + 32 + 32 + 8, 64) and w["0.qkv"].data_ptr() == q.data_ptr()
    assert w["0.down"].shape == (64 + 4, 128) and w["0.down"].data_ptr() == down.data_ptr()
    assert w["0.qkv.la"] is None  # folded
    assert not [k for k in owned.buf if not k.endswith((".lb", ".b"))]  # no weight copy
