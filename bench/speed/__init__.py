"""How fast: rollout engines (HF, the fast engine, vLLM), decode kernels, shared prefixes,
the update step and its sections (``python -m bench train``), and 1 vs 2 GPUs."""
