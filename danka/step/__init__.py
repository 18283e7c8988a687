"""One training step, knowing nothing of the run around it.

``train_step(stages, step, micro, clock=None)`` (danka/step/train_step.py) runs steps 1-7:
sample prompts, rollout (answers.py, or the agent loop: agent_rollout.py), rewards
(score.py), old/reference log-probs and values (prepare.py over forward.py), advantages,
the update (update.py). Each stage is bound once to what it needs (stages.py) and hands
the next a typed record (records.py). The run (building it, the loop, checkpoints,
evaluation's files, logs) is danka/trainer's, which imports this package and never the
other way round.
"""
