"""``tensorplay.ao.pruning``: the ``torch.nn.utils.prune`` API, exact and fast at scale.

Every name that ``torch.nn.utils.prune`` has behaves the same here; see the docs for the few
places where tensorplay is deliberately stricter or more general. Schedules, the stateful
:class:`Pruner`, sparsity statistics, checkpoint restoring, saving and the compressed export
build on that API; :class:`DependencyGraph` and :func:`shrink` find a model's channels, heads and
layers and remove the pruned ones physically, and :class:`Distillation` recovers what pruning
costs.
"""

from tensorplay.ao.pruning.distillation.dense_copy import dense_copy
from tensorplay.ao.pruning.distillation.distill import Distillation, kd_loss
from tensorplay.ao.pruning.edits.spent import SpentPrunerError
from tensorplay.ao.pruning.masking.permanent import permanent_state_dict
from tensorplay.ao.pruning.masking.restore import (
    is_pruned_state_dict,
    pruned_names,
    restore_pruning,
)
from tensorplay.ao.pruning.masking.saved_masks import install_saved_masks, load_masked
from tensorplay.ao.pruning.masking.stats import (
    SparsityReport,
    TensorSparsity,
    sparsity_report,
    tensor_sparsity,
)
from tensorplay.ao.pruning.parity.amount import (
    _compute_nparams_toprune,
    _validate_pruning_amount,
    _validate_pruning_amount_init,
    compute_nparams_to_prune,
    validate_pruning_amount,
    validate_pruning_amount_init,
)
from tensorplay.ao.pruning.parity.base import BasePruningMethod, PruningContainer, PruningShapeError
from tensorplay.ao.pruning.parity.global_unstructured import global_unstructured
from tensorplay.ao.pruning.parity.methods import (
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
from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.gradual_search import SearchedPruner
from tensorplay.ao.pruning.pruner.one_shot import calibrate, prune_one_shot
from tensorplay.ao.pruning.pruner.schedules import (
    CallableSchedule,
    ConstantSchedule,
    CubicSchedule,
    ExponentialSchedule,
    LinearSchedule,
    OneShotSchedule,
    Schedule,
    schedule_from_dict,
)
from tensorplay.ao.pruning.pruner.search import SearchResult
from tensorplay.ao.pruning.saving.sparse_export import load_sparse, save_sparse
from tensorplay.ao.pruning.structured.dependency.graph import DependencyGraph
from tensorplay.ao.pruning.structured.shrinking.gathered import gather_shrunk, save_shrunk
from tensorplay.ao.pruning.structured.shrinking.hf_config import load_shrunk
from tensorplay.ao.pruning.structured.shrinking.shrink import shrink
from tensorplay.ao.pruning.structured.shrinking.shrink_report import ShrinkReport
from tensorplay.ao.pruning.structured.units.budget_target import BudgetReport
from tensorplay.ao.pruning.structured.units.latency import (
    LatencyTable,
    estimate_latency,
    latency_table,
)
from tensorplay.ao.pruning.structured.units.latency_setting import LatencyBudget
from tensorplay.ao.pruning.structured.units.memory_setting import MemoryBudget
from tensorplay.ao.pruning.targets.parameters import (
    resolve_method,
    resolve_parameters,
    select_parameters,
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
    # schedules and the pruner
    "Schedule",
    "CubicSchedule",
    "LinearSchedule",
    "ConstantSchedule",
    "OneShotSchedule",
    "ExponentialSchedule",
    "CallableSchedule",
    "schedule_from_dict",
    "Pruner",
    "SpentPrunerError",
    "prune_one_shot",
    "calibrate",
    "SearchResult",
    "SearchedPruner",
    "MemoryBudget",
    "LatencyBudget",
    "LatencyTable",
    "latency_table",
    "estimate_latency",
    "BudgetReport",
    "select_parameters",
    "resolve_parameters",
    "resolve_method",
    # structured units: dependency analysis and shrinking
    "DependencyGraph",
    "shrink",
    "ShrinkReport",
    "load_shrunk",
    "gather_shrunk",
    "save_shrunk",
    "load_masked",
    "install_saved_masks",
    # statistics and checkpoints
    "SparsityReport",
    "TensorSparsity",
    "sparsity_report",
    "tensor_sparsity",
    "restore_pruning",
    "is_pruned_state_dict",
    "pruned_names",
    # recovering accuracy: distillation
    "Distillation",
    "kd_loss",
    "dense_copy",
    # saving and export
    "permanent_state_dict",
    "save_sparse",
    "load_sparse",
    # amount
    "compute_nparams_to_prune",
    "validate_pruning_amount",
    "validate_pruning_amount_init",
    "_compute_nparams_toprune",
    "_validate_pruning_amount",
    "_validate_pruning_amount_init",
]
