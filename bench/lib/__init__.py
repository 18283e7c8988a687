"""What the benchmark groups share: the result JSON and sides in fresh processes
(``common``), danka's trainer internals (``danka_side``, the only module that reaches into
them), GSM8K rows, random-weight training steps, the 7B PPO step and the memory plan
(``ppo_memory``), and kernel profiles."""
