"""danka next to another framework at the same settings: TRL's GRPOTrainer."""
