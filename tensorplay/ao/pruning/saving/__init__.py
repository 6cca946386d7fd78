"""Saving a model under pruning: every save in the permanent form, and the compressed export."""
