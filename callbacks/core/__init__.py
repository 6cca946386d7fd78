"""What every framework adapter shares: the pruner's lifecycle inside a training framework."""
