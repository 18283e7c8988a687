"""The fast rollout engine (:class:`danka.rollout.fast.engine.FastEngine`) and its pieces:
weights read live (weights, colocate, peft), the forward (model; Triton kernels in
triton_decode and triton_step), the KV cache (slots, staged), sampling, options, sessions.
Nothing is imported here: the memory plan reads ``options`` without loading the engine."""
