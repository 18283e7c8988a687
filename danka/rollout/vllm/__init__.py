"""vLLM as a rollout engine (:class:`danka.rollout.vllm.engine.VllmEngine`): calls, memory,
sync. Imports are absolute, so ``vllm`` in these modules is the library, never this package."""
