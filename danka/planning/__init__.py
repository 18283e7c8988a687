"""Planning before a run starts: the memory model of a training step (``memory``, what
``danka estimate`` prints) and the rollout engine chosen from it (``engine``)."""
