"""``tensorplay.ao.pruning``: the ``torch.nn.utils.prune`` API, exact and fast at scale.

Every name that ``torch.nn.utils.prune`` has behaves the same here; see the docs for the few
places where tensorplay is deliberately stricter or more general.
"""

from tensorplay.ao.pruning.amount import (
    _compute_nparams_toprune,
    _validate_pruning_amount,
    _validate_pruning_amount_init,
    compute_nparams_to_prune,
    validate_pruning_amount,
    validate_pruning_amount_init,
)
from tensorplay.ao.pruning.base import BasePruningMethod, PruningContainer, PruningShapeError
from tensorplay.ao.pruning.global_pruning import global_unstructured
from tensorplay.ao.pruning.methods import (
    CustomFromMask,
    Identity,
    L1Unstructured,
    LnStructured,
    RandomStructured,
    RandomUnstructured,
    custom_from_mask,
    identity,
    is_pruned,
    l1_unstructured,
    ln_structured,
    random_structured,
    random_unstructured,
    remove,
)

__all__ = [
    # reparametrization mechanics
    "BasePruningMethod",
    "PruningContainer",
    "PruningShapeError",
    # methods
    "CustomFromMask",
    "Identity",
    "L1Unstructured",
    "LnStructured",
    "RandomStructured",
    "RandomUnstructured",
    # functional forms
    "custom_from_mask",
    "global_unstructured",
    "identity",
    "l1_unstructured",
    "ln_structured",
    "random_structured",
    "random_unstructured",
    "remove",
    "is_pruned",
    # amount
    "compute_nparams_to_prune",
    "validate_pruning_amount",
    "validate_pruning_amount_init",
    "_compute_nparams_toprune",
    "_validate_pruning_amount",
    "_validate_pruning_amount_init",
]
