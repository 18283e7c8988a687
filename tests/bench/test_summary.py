"""bench.summary: the headline table computed from the JSON files, not typed in."""

from __future__ import annotations

import json

from bench import summary


def test_ratio_comes_from_both_sides_of_the_file(tmp_path):
    # TRL 12.0 s / danka 3.0 s = 4.0x; peaks copied from the file
    sides = {"trl": {"median_step_s": 12.0, "peak_gib": 1.5, "trl": "1.16.0"},
             "danka": {"median_step_s": 3.0, "peak_gib": 2.0}}  # fmt: skip
    (tmp_path / "trl_x.json").write_text(json.dumps({"variants": {"lora": {"sides": sides}}}))
    scale = {"scaling": [{"engine": "fast", "model": "/m/qwen", "prompts": 4, "samples": 2,
                          "new_tokens": 8, "1gpu": {"median": {"time/step": 9.0}},
                          "2gpu": {"median": {"time/step": 5.0, "time/step_max": 6.0}}}]}  # fmt: skip
    (tmp_path / "scale_2x_a.json").write_text(json.dumps(scale))
    (tmp_path / "scale_2x_b.json").write_text("{}")  # broken: a row says so, no crash
    before = {"n": 200, "samples": 4, "temperature": 1.0, "accuracy": 0.28, "valid_call_rate": 0.5}
    calc = {"before": {"accuracy": 1.0}, "after": {"accuracy": 1.0}, "steps": 60,
            "train_minutes": 1.7, "sampled_before": before,
            "sampled_after": {**before, "accuracy": 0.69, "valid_call_rate": 0.8}}  # fmt: skip
    (tmp_path / "calc_tool_learning_h200_x.json").write_text(json.dumps(calc))
    plain = {"eval_200_greedy_s": 28.0, "rollout_8x8_s": 9.6, "train_fwd_bwd_16_rows_s": 4.0}
    shared = {"eval_200_greedy_s": 14.0, "rollout_8x8_s": 4.8, "train_fwd_bwd_16_rows_s": 3.2}
    (tmp_path / "shared_prefix_cpu.json").write_text(json.dumps({
        "device": "cpu", "sides": {"plain": plain, "shared": shared},
        "same_eval_tokens": True, "same_rollout_tokens": False}))  # fmt: skip
    rows = {what: (measured, f) for what, measured, f in summary.rows(tmp_path)}
    # 28.0 / 14.0 = 2.00x; 4.0 / 3.2 = 1.25x; same tokens only if both comparisons held
    assert rows["shared prefix (cpu), 200 greedy answers"][0] == (
        "28.00 s -> 14.00 s (2.00x); same tokens: False"
    )
    assert rows["shared prefix (cpu), training fwd+bwd, 16 rows"][0].startswith(
        "4.00 s -> 3.20 s (1.25x)"
    )
    assert rows["GRPO step vs TRL 1.16.0, lora"] == (
        "danka 3.00 s vs TRL 12.00 s (4.0x); peak 2.00 vs 1.50 GiB",
        "trl_x.json",
    )
    # the slowest rank's step counts: 9.0 / 6.0 = 1.50x, not 9.0 / 5.0
    assert rows["2-GPU scaling, fast engine, qwen 4 x 2 x 8"][0] == "9.00 s -> 6.00 s (1.50x)"
    assert rows["unreadable: scale_2x_b.json"][1] == "scale_2x_b.json"
    assert rows["learning run (?), held-out sampled (T=1, 200 x 4)"][0] == (
        "28.00% -> 69.00%, valid-call rate 50.00% -> 80.00%"
    )


def test_every_committed_result_file_reads():
    table = summary.table(summary.rows(summary.RESULTS))
    assert "unreadable" not in table
    assert "`train_ppo_7b.json`" in table and "`equivalence_2x.json`" in table
    assert "`gsm8k_floors.json`" in table and "mean answer 17 -> 17 tokens" in table
    assert "`small_card_12gib.json`" in table and "LoRA merge" in table
    assert "36.50% -> 64.50% (guess floor 2.50%), mean answer 12 -> 12 tokens" in table


def test_danka_only_runs_and_the_eager_head_side_get_their_own_rows(tmp_path):
    # TRL 7.5 s / danka 1.5 s = 5.0x; TRL 7.5 / danka-eager 2.5 = 3.0x; a danka-only A/B
    # file (no TRL side) names its overrides and computes no ratio
    sides = {"trl": {"median_step_s": 7.5, "peak_gib": 1.7, "trl": "1.16.0"},
             "danka": {"median_step_s": 1.5, "peak_gib": 2.6},
             "danka-eager": {"median_step_s": 2.5, "peak_gib": 3.0}}  # fmt: skip
    (tmp_path / "trl_a.json").write_text(json.dumps({"variants": {"full": {"sides": sides}}}))
    only = {
        "danka": {"median_step_s": 1.4, "peak_gib": 2.0, "overrides": ["rollout.keep_cache=false"]}
    }
    (tmp_path / "trl_b.json").write_text(json.dumps({"variants": {"full": {"sides": only}}}))
    rows = {what: measured for what, measured, _ in summary.rows(tmp_path)}
    assert rows["GRPO step vs TRL 1.16.0, full"].startswith("danka 1.50 s vs TRL 7.50 s (5.0x)")
    assert "(3.0x)" in rows["GRPO step vs TRL 1.16.0, full (eager head)"]
    assert rows["GRPO step, danka only, full [rollout.keep_cache=false]"] == (
        "danka 1.40 s; peak 2.00 GiB"
    )


def test_no_machine_paths_no_empty_row_and_the_gsm8k_runs():
    table = summary.table(summary.rows(summary.RESULTS))
    assert "/root/" not in table and "/tmp/danka" not in table
    assert all(measured for _, measured, _ in summary.rows(summary.RESULTS))
    assert "| rollout qwen2.5-coder-0.5b-instruct.gguf 256 x 512 | fast-default 75,781" in table
    assert (
        "| GSM8K learning run, qwen2.5-coder-0.5b-instruct.gguf, grpo | strict 0.00% -> " in table
    )


def test_headline_answers_from_the_file_and_device_date_command_from_the_index(tmp_path):
    sides = {
        "trl": {"median_step_s": 12.0, "peak_gib": 1.5, "trl": "1.16.0"},
        "danka": {"median_step_s": 3.0, "peak_gib": 2.0},
    }
    name = "trl_smollm2_real_8x8_lora.json"
    (tmp_path / name).write_text(json.dumps({"variants": {"lora": {"sides": sides}}}))
    (tmp_path / "INDEX.md").write_text(
        "| file | what | device | date | command |\n|---|---|---|---|---|\n"
        f"| `{name}` | GRPO step | H200 | 2026-12-02 | `python -m bench trl --variants lora` |\n"
    )
    lines = summary.headline(tmp_path).splitlines()
    assert len(lines) == 3  # the header, its rule, the one question whose file is here
    # TRL 12.0 s / danka 3.0 s = 4.0x
    assert lines[2] == (
        "| A GRPO step against TRL's GRPOTrainer, LoRA (SmolLM2-135M, 8 x 8 x 256 tokens) | "
        "4.0x faster: 3.00 s vs 12.00 s a step; peak 2.00 vs 1.50 GiB | H200 | 2026-12-02 | "
        f"`python -m bench trl --variants lora` | `{name}` |"
    )


def test_benchmarks_md_opens_with_the_headline_as_summary_prints_it():
    text = (summary.RESULTS.parents[1] / "BENCHMARKS.md").read_text()
    table = summary.headline(summary.RESULTS)
    assert table in text
    assert text.index(table) < text.index("\n## ")  # before the first section
    assert table.count("\n") >= 8  # every question has its file
