"""Model-optimisation tools; pruning lives in :mod:`tensorplay.ao.pruning`."""
