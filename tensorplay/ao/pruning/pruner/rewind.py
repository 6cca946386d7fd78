"""Rewinding (lottery tickets): the snapshot of the targets' values and copying it back.

After a pruning step, ``rewind="init"`` or ``"step"`` resets the unpruned values of the targets
to a snapshot (Frankle & Carbin 2019; weight rewinding, Renda et al. 2020), keeping the masks.
The snapshot holds one clone per target, by its canonical name; values are copied into the
parameter (``<name>_orig`` while reparametrized, this rank's rows of a shard under FSDP2) and the
masking mode re-applies the mask.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.masking import masking_mode
    >>> from tensorplay.ao.pruning.targets.tied import Target
    >>> layer = nn.Linear(2, 1)
    >>> targets = [Target(("weight",), ((layer, "weight"),))]
    >>> saved = snapshot_of(targets)
    >>> with torch.no_grad():
    ...     _ = layer.weight.add_(1.0)
    >>> copy_back(targets, saved, masking_mode("reparametrize"))
    >>> layer.weight.equal(saved["weight"])
    True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from tensorplay.ao.pruning.masking.lean_masks import local_tensor
from tensorplay.ao.pruning.masking.mode import MaskingMode
from tensorplay.ao.pruning.pruner.config import PrunerConfig
from tensorplay.ao.pruning.selection.shards import local_values
from tensorplay.ao.pruning.targets.tied import Target

__all__ = ["check_values", "copy_back", "snapshot_due", "snapshot_of"]


def snapshot_of(targets: Sequence[Target]) -> dict[str, Tensor]:
    """Clones of the targets' unpruned values, by canonical name."""
    return {target.name: target.parameter().detach().clone() for target in targets}


def snapshot_due(config: PrunerConfig, step: int, last_step: int, taken: bool) -> bool:
    """Whether the snapshot is to be taken now, at ``step`` after ``last_step``
    (``rewind="step"``: at ``rewind_step``, or at the first step past it if the counter jumped
    over it since a step the pruner took; a first step past it is a run resumed without the
    pruner's state, whose snapshot is gone).

    Raises:
        RuntimeError: The snapshot is due and was neither ``taken`` nor loaded.

    Example:
        >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
        >>> config = PrunerConfig(OneShotSchedule(0.5), rewind="step", rewind_step=3)
        >>> [snapshot_due(config, step, step - 2, False) for step in (2, 4)]
        [False, True]
    """
    if config.rewind == "none" or taken:
        return False
    if config.rewind == "step" and step < config.rewind_step:
        return False
    if config.rewind == "step" and (
        step == config.rewind_step or 0 <= last_step < config.rewind_step
    ):
        return True
    due = "the initial values" if config.rewind == "init" else f"step {config.rewind_step}"
    raise RuntimeError(
        f"Expected the rewind snapshot of {due} to be taken or loaded with "
        f"load_state_dict(), but the pruner has none at step {step}."
    )


def check_values(values: object, targets: Sequence[Target], key: str) -> dict[int, Tensor]:
    """``values`` (target name or alias -> tensor of its shape) by target index.

    Raises:
        TypeError: ``values`` is not a mapping.
        ValueError: A name that is not a target, two names of one target, or a value of
            another shape.
    """
    if not isinstance(values, Mapping):
        raise TypeError(f"Expected `{key}` to be a mapping of name to tensor, but got {values!r}.")
    index = {alias: i for i, target in enumerate(targets) for alias in target.names}
    found: dict[int, Tensor] = {}
    seen: dict[int, str] = {}
    for fq_name, value in values.items():
        if fq_name not in index:
            raise ValueError(
                f"Expected the keys of `{key}` to be targets of the pruner, but got "
                f"{fq_name!r}; targets: {[target.name for target in targets]}."
            )
        if index[fq_name] in seen:
            raise ValueError(
                f"Expected one value per target in `{key}`, but {seen[index[fq_name]]!r} and "
                f"{fq_name!r} name the same tied parameter."
            )
        seen[index[fq_name]] = fq_name
        shape = tuple(targets[index[fq_name]].parameter().shape)
        if not isinstance(value, Tensor) or tuple(value.shape) != shape:
            got = tuple(value.shape) if isinstance(value, Tensor) else repr(value)
            raise ValueError(
                f"Expected `{key}[{fq_name!r}]` to be a tensor of shape {shape}, but got {got}."
            )
        found[index[fq_name]] = value
    return found


def copy_back(targets: Sequence[Target], values: Mapping[str, Tensor], mode: MaskingMode) -> None:
    """Copy ``values`` into the targets' unpruned values and re-apply their masks; every value
    is checked before any is copied.

    Raises:
        TypeError, ValueError: As :func:`check_values`.
    """
    for index, value in check_values(values, targets, "state").items():
        target = targets[index]
        param = target.parameter()
        with torch.no_grad():  # a shard (FSDP2) takes its own rows of a full value
            local_tensor(param.detach()).copy_(local_values(value, param))
        mode.after_rewind(target)
