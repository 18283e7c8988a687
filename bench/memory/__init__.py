"""How much memory: small cards simulated on a large one, and the memory plan against the
measured peaks."""
