"""Every dotted path that earlier releases documented still imports, as the same object.

The library's modules were regrouped into packages (:mod:`tensorplay.moved`); a path a user wrote
(a LightningCLI ``class_path``, an import, a pickled object, a saved pruner state) must keep
working. ``DOCUMENTED`` is every ``tensorplay.ao.pruning.*`` and ``tensorplay.callbacks.*`` path
that the README, the docs and the example configs named before the regrouping.
"""

from __future__ import annotations

import importlib
import pickle
import warnings
from pathlib import Path

import pytest
import torch

from tensorplay.ao.pruning.imports import import_object
from tensorplay.moved import MOVED, new_name

DOCUMENTED = [
    "tensorplay.ao.pruning",
    "tensorplay.ao.pruning.BasePruningMethod",
    "tensorplay.ao.pruning.DependencyGraph",
    "tensorplay.ao.pruning.Distillation",
    "tensorplay.ao.pruning.Pruner",
    "tensorplay.ao.pruning.Pruner.history",
    "tensorplay.ao.pruning.PruningContainer",
    "tensorplay.ao.pruning.PruningShapeError",
    "tensorplay.ao.pruning.SpentPrunerError",
    "tensorplay.ao.pruning.amount",
    "tensorplay.ao.pruning.attached_optimizers",
    "tensorplay.ao.pruning.base",
    "tensorplay.ao.pruning.batches",
    "tensorplay.ao.pruning.checkpoint",
    "tensorplay.ao.pruning.checkpoint.restore_pruning",
    "tensorplay.ao.pruning.collapse",
    "tensorplay.ao.pruning.compute_nparams_to_prune",
    "tensorplay.ao.pruning.config",
    "tensorplay.ao.pruning.config.PrunerConfig",
    "tensorplay.ao.pruning.dense_copy",
    "tensorplay.ao.pruning.dense_copy.dense_copy",
    "tensorplay.ao.pruning.dependency",
    "tensorplay.ao.pruning.dependency.blocks",
    "tensorplay.ao.pruning.dependency.families",
    "tensorplay.ao.pruning.dependency.families.bert",
    "tensorplay.ao.pruning.dependency.families.family",
    "tensorplay.ao.pruning.dependency.families.gpt2",
    "tensorplay.ao.pruning.dependency.families.llama",
    "tensorplay.ao.pruning.dependency.families.moe",
    "tensorplay.ao.pruning.dependency.families.projections",
    "tensorplay.ao.pruning.dependency.families.vit",
    "tensorplay.ao.pruning.dependency.graph",
    "tensorplay.ao.pruning.dependency.recorded",
    "tensorplay.ao.pruning.dependency.unit_groups",
    "tensorplay.ao.pruning.dependency.unit_groups.Slice",
    "tensorplay.ao.pruning.dependency.unit_groups.UnitGroup",
    "tensorplay.ao.pruning.distillation",
    "tensorplay.ao.pruning.dtensor_targets",
    "tensorplay.ao.pruning.frames",
    "tensorplay.ao.pruning.gather_shrunk",
    "tensorplay.ao.pruning.global_pruning",
    "tensorplay.ao.pruning.global_unstructured",
    "tensorplay.ao.pruning.importance",
    "tensorplay.ao.pruning.importance.expert_routing",
    "tensorplay.ao.pruning.importance.gradients",
    "tensorplay.ao.pruning.importance.input_features",
    "tensorplay.ao.pruning.importance.magnitude",
    "tensorplay.ao.pruning.importance.movement",
    "tensorplay.ao.pruning.importance.order",
    "tensorplay.ao.pruning.importance.registry",
    "tensorplay.ao.pruning.importance.score",
    "tensorplay.ao.pruning.importance.score.Importance",
    "tensorplay.ao.pruning.importance.step_hooks",
    "tensorplay.ao.pruning.importance.taylor",
    "tensorplay.ao.pruning.importance.wanda",
    "tensorplay.ao.pruning.imports",
    "tensorplay.ao.pruning.install_saved_masks",
    "tensorplay.ao.pruning.kd_loss",
    "tensorplay.ao.pruning.layouts",
    "tensorplay.ao.pruning.ln_structured",
    "tensorplay.ao.pruning.load_masked",
    "tensorplay.ao.pruning.load_shrunk",
    "tensorplay.ao.pruning.load_sparse",
    "tensorplay.ao.pruning.masking",
    "tensorplay.ao.pruning.masking.gradient_masks",
    "tensorplay.ao.pruning.masking.lean",
    "tensorplay.ao.pruning.masking.lean_masks",
    "tensorplay.ao.pruning.masking.mode",
    "tensorplay.ao.pruning.masking.mode.MaskingMode",
    "tensorplay.ao.pruning.masking.mode.own_masks",
    "tensorplay.ao.pruning.masking.optimizer_hooks",
    "tensorplay.ao.pruning.masking.readers",
    "tensorplay.ao.pruning.masking.reparametrized",
    "tensorplay.ao.pruning.method_selection",
    "tensorplay.ao.pruning.methods",
    "tensorplay.ao.pruning.one_shot",
    "tensorplay.ao.pruning.one_shot.prune_one_shot",
    "tensorplay.ao.pruning.pair",
    "tensorplay.ao.pruning.permanent_saves",
    "tensorplay.ao.pruning.permanent_saves.kept_zeros",
    "tensorplay.ao.pruning.permanent_saves.restore_masks",
    "tensorplay.ao.pruning.permanent_saves.save_permanent",
    "tensorplay.ao.pruning.permanent_state_dict",
    "tensorplay.ao.pruning.prune_one_shot",
    "tensorplay.ao.pruning.pruner",
    "tensorplay.ao.pruning.pruner.Pruner",
    "tensorplay.ao.pruning.pruner.Pruner.report",
    "tensorplay.ao.pruning.pruner.Pruner.state_dict",
    "tensorplay.ao.pruning.pruner.Pruner.take_snapshot",
    "tensorplay.ao.pruning.pruner_optimizers",
    "tensorplay.ao.pruning.pruner_state",
    "tensorplay.ao.pruning.pruner_targets",
    "tensorplay.ao.pruning.reconstruction",
    "tensorplay.ao.pruning.reconstruction.consumers",
    "tensorplay.ao.pruning.reconstruction.driver",
    "tensorplay.ao.pruning.reconstruction.ridge",
    "tensorplay.ao.pruning.reconstruction.ridge.ridge_solve",
    "tensorplay.ao.pruning.remove",
    "tensorplay.ao.pruning.reparametrization",
    "tensorplay.ao.pruning.restore_pruning",
    "tensorplay.ao.pruning.rewind",
    "tensorplay.ao.pruning.row_pruning",
    "tensorplay.ao.pruning.save_shrunk",
    "tensorplay.ao.pruning.save_sparse",
    "tensorplay.ao.pruning.schedules",
    "tensorplay.ao.pruning.schedules.CallableSchedule",
    "tensorplay.ao.pruning.schedules.ConstantSchedule",
    "tensorplay.ao.pruning.schedules.CubicSchedule",
    "tensorplay.ao.pruning.schedules.ExponentialSchedule",
    "tensorplay.ao.pruning.schedules.LinearSchedule",
    "tensorplay.ao.pruning.schedules.OneShotSchedule",
    "tensorplay.ao.pruning.schedules.Schedule",
    "tensorplay.ao.pruning.schedules.Schedule.latest_pruning_step",
    "tensorplay.ao.pruning.schedules.Schedule.to_dict",
    "tensorplay.ao.pruning.scopes",
    "tensorplay.ao.pruning.scopes.global_",
    "tensorplay.ao.pruning.scopes.layerwise",
    "tensorplay.ao.pruning.scopes.row",
    "tensorplay.ao.pruning.scopes.scope",
    "tensorplay.ao.pruning.scopes.scope.PruningScope",
    "tensorplay.ao.pruning.scopes.space",
    "tensorplay.ao.pruning.scopes.space.UnitSpace",
    "tensorplay.ao.pruning.scores",
    "tensorplay.ao.pruning.selection",
    "tensorplay.ao.pruning.serialization",
    "tensorplay.ao.pruning.sharded_copy",
    "tensorplay.ao.pruning.sharded_copy.sharded_copy",
    "tensorplay.ao.pruning.shrink",
    "tensorplay.ao.pruning.shrinking.gathered",
    "tensorplay.ao.pruning.shrinking.hf_config",
    "tensorplay.ao.pruning.shrinking.left_masked",
    "tensorplay.ao.pruning.shrinking.removal",
    "tensorplay.ao.pruning.shrinking.resize",
    "tensorplay.ao.pruning.shrinking.saved_masks",
    "tensorplay.ao.pruning.shrinking.shrink",
    "tensorplay.ao.pruning.shrinking.shrink_groups",
    "tensorplay.ao.pruning.shrinking.shrink_report",
    "tensorplay.ao.pruning.sparse_export",
    "tensorplay.ao.pruning.spent",
    "tensorplay.ao.pruning.stats",
    "tensorplay.ao.pruning.structures",
    "tensorplay.ao.pruning.structures.budget",
    "tensorplay.ao.pruning.structures.budget_space",
    "tensorplay.ao.pruning.structures.budget_target",
    "tensorplay.ao.pruning.structures.combined",
    "tensorplay.ao.pruning.structures.coverage",
    "tensorplay.ao.pruning.structures.element",
    "tensorplay.ao.pruning.structures.experts",
    "tensorplay.ao.pruning.structures.routing",
    "tensorplay.ao.pruning.structures.sharded_units",
    "tensorplay.ao.pruning.structures.structure",
    "tensorplay.ao.pruning.structures.structure.PruningStructure",
    "tensorplay.ao.pruning.structures.structured",
    "tensorplay.ao.pruning.structures.unit_space",
    "tensorplay.ao.pruning.targets",
    "tensorplay.ao.pruning.targets.DEFAULT_MODULE_TYPES",
    "tensorplay.ao.pruning.targets.DEFAULT_NAMES",
    "tensorplay.ao.pruning.targets.SelectionWarning",
    "tensorplay.ao.pruning.targets.resolve_method",
    "tensorplay.ao.pruning.targets.select_parameters",
    "tensorplay.ao.pruning.tied_targets",
    "tensorplay.callbacks",
    "tensorplay.callbacks.GradualPruning",
    "tensorplay.callbacks.PrunableMixin",
    "tensorplay.callbacks.PruningRollbackWarning",
    "tensorplay.callbacks.transformers",
    "tensorplay.callbacks.transformers.GradualPruningCallback",
    "tensorplay.callbacks.transformers.GradualPruningCallback.put_first",
]


def resolve(path: str) -> object:
    try:
        return importlib.import_module(path)
    except ImportError:
        return import_object(path)


@pytest.mark.parametrize("path", DOCUMENTED)
def test_a_documented_path_still_imports(path: str) -> None:
    assert resolve(path) is not None


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_earlier_module_path_is_the_module_that_holds_its_code_now(old: str) -> None:
    if old.startswith(("tensorplay.callbacks.",)):
        pytest.importorskip("lightning")
        pytest.importorskip("transformers")
    assert importlib.import_module(old) is importlib.import_module(MOVED[old])


def test_a_module_inside_a_moved_package_is_one_module_under_both_names() -> None:
    from tensorplay.ao.pruning.dependency.graph import DependencyGraph as earlier
    from tensorplay.ao.pruning.structured.dependency.graph import DependencyGraph

    assert earlier is DependencyGraph
    assert new_name("tensorplay.ao.pruning.dependency.graph") == (
        "tensorplay.ao.pruning.structured.dependency.graph"
    )


def test_an_object_pickled_under_an_earlier_path_unpickles() -> None:
    from tensorplay.ao.pruning import CubicSchedule

    # protocol 0's GLOBAL opcode names the class by the module path it was pickled under
    assert pickle.loads(b"ctensorplay.ao.pruning.schedules\nCubicSchedule\n.") is CubicSchedule


def test_a_state_saved_under_earlier_paths_resumes_without_a_configuration_warning() -> None:
    from tensorplay.ao.pruning import Pruner
    from tensorplay.ao.pruning.pruner.schedules import LinearSchedule
    from tests.core.data.make_saved_states import CASES, model

    saved = torch.load(
        Path(__file__).parent / "core" / "data" / "saved_states.pt", weights_only=True
    )
    case = "reparametrize-rewind"
    state = saved[case]["pruner"]
    assert state["schedule"]["class_path"] == "tensorplay.ao.pruning.schedules.LinearSchedule"
    net = model()
    pruner = Pruner(net, LinearSchedule(**state["schedule"]["init_args"]), **CASES[case])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pruner.load_state_dict(state)
    assert pruner.last_step == state["step"]
