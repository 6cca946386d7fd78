"""The API of ``torch.nn.utils.prune``, behaviour for behaviour.

The reparametrization (``<name>_orig``, ``<name>_mask``, the forward pre-hook), the pruning
methods and their functional forms, ``amount``, and an exact, streaming ``global_unstructured``.
Everything else in tensorplay builds on this layer; it builds on the exact selection alone.
"""
