"""Does it learn: learning runs before/after, GSM8K time-to-accuracy and floors, task
candidates, the calculator tool, and reward models."""
