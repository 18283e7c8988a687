"""Running code the user named (a reward or tool file): importing its function, the call
contracts (verl's and TRL's reward signatures), the worker process that runs it bounded by
time, and the sweep that ends every process it started. Used by rewards and agent tools
alike, so it sits below both."""
