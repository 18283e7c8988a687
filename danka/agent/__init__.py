"""Agentic rollouts: multi-turn generation with tool calls and environments.

* ``tools.py``    tools as plain Python functions; JSON schema from signature + docstring
* ``parse.py``    Hermes/Qwen ``<tool_call>{...}</tool_call>`` parsing (good and malformed)
* ``builtins.py`` builtin tools: ``calculator`` (safe arithmetic) and ``python`` (subprocess)
* ``worker.py``   guarded tool execution in a killable worker process (timeouts, errors)
* ``chat.py``     prompts with the tool schemas and tool-response turns, via the chat template
* ``env.py``      environments (``reset(row)``, ``step(text)``); tools are one environment
* ``loop.py``     the multi-turn rollout over any ``RolloutEngine``
* ``rewards.py``  rewards for tool-using answers (final answer + valid-call bonus)

This ``__init__`` imports nothing heavy: the tool worker process imports ``builtins``.
"""
