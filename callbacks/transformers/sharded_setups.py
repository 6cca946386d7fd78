"""Which of the Hugging Face ``Trainer``'s sharded set-ups ``GradualPruningCallback`` serves.

The Trainer shards a model when ``TrainingArguments`` carry ``fsdp`` or ``deepspeed``, or when
``accelerate launch`` turns FSDP or DeepSpeed on; what it really does is Accelerate's to decide
(:func:`accelerate_state`). :func:`trainer_shards_with_fsdp2` reads both, refuses what
the callback cannot serve (naming the option and its value, and saying what works), and tells
the callback whether the model will be sharded with FSDP2 (``fully_shard``: ``DTensor``
parameters), in which case the pruner is built on the sharded model, when training begins.

What is refused, and why:

* ``deepspeed``: its engine partitions the parameters in flat buffers of its own.
* FSDP1 (``fsdp_config={"version": 1}``): it flattens a unit's parameters into one
  ``FlatParameter`` and gives each rank an unshaped slice; a mask can be neither placed nor saved
  sharded (as Lightning's ``FSDPStrategy``,
  :func:`~tensorplay.callbacks.lightning.strategies.check_strategy`).
* FSDP2 where Accelerate does not shard: Accelerate 1.16 turns the FSDP plugin on only for
  accelerators (CUDA, XPU, NPU, ...). With ``use_cpu=True`` its state is ``MULTI_CPU``, the
  plugin is dropped and the Trainer trains with DDP, the parameters never sharded; on a host
  without an accelerator and without ``use_cpu`` the Trainer refuses ``fsdp`` itself ("only works
  in distributed training").
* Under FSDP2: a masking mode that holds no ``DTensor`` (``masking="inplace"`` is the one) and
  rewinding (its snapshot is not in the sharded checkpoint). ``shrink_at_end`` is served there by
  gathering the model on the main process and writing the shrunk copy to a folder
  (:func:`~tensorplay.ao.pruning.save_shrunk`).
* Resuming under FSDP2 (:func:`check_fresh_under_fsdp2`, :func:`refuse_loads_before_build`):
  the Trainer shards the model and loads the checkpoint into it before any callback event, so
  the masks, made on the sharded model when training begins, cannot exist to receive it.

Example:
    >>> from transformers import TrainingArguments
    >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
    >>> from ..core.lifecycle import split_arguments
    >>> config, _ = split_arguments({"schedule": OneShotSchedule(0.5)})
    >>> args = TrainingArguments("out", use_cpu=True, report_to="none")
    >>> trainer_shards_with_fsdp2(args, config)
    False
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from torch import nn
from torch.utils.hooks import RemovableHandle

from tensorplay.ao.pruning.edits import changes
from tensorplay.ao.pruning.pruner.config import PrunerConfig

from ..core.fsdp2_config import check_fsdp2_config

if TYPE_CHECKING:
    from transformers import TrainingArguments

__all__ = [
    "accelerate_state",
    "check_fresh_under_fsdp2",
    "fsdp_version",
    "refuse_loads_before_build",
    "trainer_shards_with_fsdp2",
]

# Why a run cannot resume under the Trainer's FSDP2, and what works.
_NO_RESUME = (
    "resuming under the Trainer's FSDP2 is not supported yet: the Trainer shards the model and "
    "loads the checkpoint into it before any callback event, so the masks (made on the sharded "
    "model when training begins) cannot exist to receive it. Start the run afresh, or train "
    "under Lightning's `ModelParallelStrategy`, which resumes exactly."
)

# What trains a sharded model with pruning today, for the messages.
_WHAT_WORKS = (
    "To prune a model sharded with FSDP2, train it under Lightning's `ModelParallelStrategy` "
    "or in a plain loop over `fully_shard` (docs: large_models), or drop the option to train "
    "under DDP or on one device."
)


def trainer_shards_with_fsdp2(args: TrainingArguments, config: PrunerConfig) -> bool:
    """Whether the Trainer of ``args`` shards the model with FSDP2, refusing the sharded
    set-ups the callback cannot serve; nothing is built or changed before.

    Raises:
        ValueError: With ``deepspeed``; with FSDP1; with FSDP2 that Accelerate does not run (on
            CPU); under FSDP2, a masking mode that holds no ``DTensor`` and rewinding
            (:func:`~tensorplay.callbacks.core.fsdp2_config.check_fsdp2_config`).

    Example:
        >>> from transformers import TrainingArguments
        >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
        >>> from ..core.lifecycle import split_arguments
        >>> config, _ = split_arguments({"schedule": OneShotSchedule(0.5)})
        >>> args = TrainingArguments("out", use_cpu=True, report_to="none", fsdp=True)
        >>> trainer_shards_with_fsdp2(args, config)
        Traceback (most recent call last):
        ...
        ValueError: Expected `fsdp` (FSDP2) to shard the model, but Accelerate ...
    """
    kind, plugin_version = accelerate_state()
    if getattr(args, "deepspeed", None) or kind == "DEEPSPEED":
        raise ValueError(
            "Expected a Trainer without `deepspeed` (GradualPruningCallback cannot mask the "
            "flat, partitioned buffers of DeepSpeed's engine), but got "
            f"deepspeed={args.deepspeed!r} (Accelerate's state: {kind or 'not made'}). "
            f"{_WHAT_WORKS}"
        )
    version = plugin_version if kind == "FSDP" else fsdp_version(args)
    if version is None:
        return False
    if version != 2:
        raise ValueError(
            "Expected FSDP2 (`fsdp_config={'version': 2}`, or `accelerate launch "
            f"--fsdp_version 2`), but got FSDP version {version!r}: FSDP1 flattens a unit's "
            "parameters into one `FlatParameter` and gives each rank an unshaped slice, so a "
            f"mask can be neither placed nor saved sharded. Use version 2. {_WHAT_WORKS}"
        )
    if kind != "FSDP":
        raise ValueError(
            "Expected `fsdp` (FSDP2) to shard the model, but Accelerate does not shard it here "
            f"(fsdp={args.fsdp!r}, use_cpu={args.use_cpu!r}, device {args.device.type!r}, "
            f"Accelerate's state: {kind or 'not made'}): it runs FSDP only on accelerators "
            "(CUDA, XPU, ...); on CPU it drops the FSDP plugin and the Trainer trains with DDP, "
            "its parameters never sharded. Run on GPUs (torchrun), or drop `fsdp` to train "
            f"under DDP. {_WHAT_WORKS}"
        )
    check_fsdp2_config(config, "the Trainer's FSDP2")
    return True


def fsdp_version(args: TrainingArguments) -> int | None:
    """The FSDP version ``args`` ask Accelerate for (``None``: no ``fsdp``), read as the Trainer
    reads it (``fsdp_config["version"]``, 2 by default).

    Example:
        >>> from transformers import TrainingArguments
        >>> fsdp_version(TrainingArguments("out", use_cpu=True, report_to="none")) is None
        True
        >>> fsdp_version(TrainingArguments("out", use_cpu=True, report_to="none", fsdp=True))
        2
    """
    if not getattr(args, "fsdp", None):
        return None
    fsdp_config: dict[str, Any] = getattr(args, "fsdp_config", None) or {}
    return int(fsdp_config.get("version", 2))


def accelerate_state() -> tuple[str, int | None]:
    """What Accelerate's state, made by the Trainer's ``Accelerator``, runs: its distributed
    type by name (``"NO"``, ``"MULTI_CPU"``, ``"MULTI_GPU"``, ``"FSDP"``, ``"DEEPSPEED"``, ...;
    ``""`` before any ``Accelerator`` is made) and, under FSDP, its plugin's version. Read
    apart from ``TrainingArguments``: ``accelerate launch --use_fsdp`` turns FSDP on without
    them, and on CPU Accelerate keeps ``MULTI_CPU`` whatever they ask.

    Example:
        >>> kind, version = accelerate_state()  # one process: none made yet, or one made
        >>> kind in ("", "NO"), version  # that distributes nothing; no FSDP either way
        (True, None)
    """
    from accelerate.state import AcceleratorState, is_initialized
    from accelerate.utils import DistributedType

    if not is_initialized():
        return "", None
    state = AcceleratorState()
    kind = DistributedType(state.distributed_type).value
    plugin = getattr(state, "fsdp_plugin", None) if kind == "FSDP" else None
    return str(kind), None if plugin is None else int(plugin.fsdp_version)


def check_fresh_under_fsdp2(step: int) -> None:
    """Refuse a run under the Trainer's FSDP2 that resumes (``step``: the Trainer's
    ``global_step`` when training begins), before the pruner is built.

    Raises:
        ValueError: ``step`` > 0.

    Example:
        >>> check_fresh_under_fsdp2(0)
        >>> check_fresh_under_fsdp2(4)
        Traceback (most recent call last):
        ...
        ValueError: Expected GradualPruningCallback to start at step 0 under ... but got step 4: ...
    """
    if step > 0:
        raise ValueError(
            "Expected GradualPruningCallback to start at step 0 under the Trainer's FSDP2, but "
            f"got step {step}: {_NO_RESUME}"
        )


def refuse_loads_before_build(model: nn.Module, built: Callable[[], bool]) -> RemovableHandle:
    """Hook ``model`` so that loading a state dict that holds masks (``*_mask``: a checkpoint
    saved under pruning) raises, naming one, while ``built()`` is false: under the Trainer's
    FSDP2 that is the Trainer resuming, refused before any weight is loaded. Remove the handle
    once the pruner is built.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> model = nn.Linear(2, 1)
        >>> handle = refuse_loads_before_build(model, lambda: False)
        >>> saved = {**model.state_dict(), "weight_mask": torch.ones(1, 2, dtype=torch.bool)}
        >>> try:
        ...     model.load_state_dict(saved)
        ... except ValueError as error:
        ...     print(error)
        Expected no checkpoint saved under pruning to be loaded ... 'weight_mask': resuming ...
        >>> handle.remove()
    """

    def refuse(module: nn.Module, state_dict: Mapping[str, Any], prefix: str, *args: Any) -> None:
        masks = [key for key in state_dict if key.startswith(prefix) and key.endswith("_mask")]
        if masks and not built():
            raise ValueError(
                "Expected no checkpoint saved under pruning to be loaded into the model before "
                f"training begins under the Trainer's FSDP2, but got one with {masks[0]!r}: "
                f"{_NO_RESUME}"
            )

    handle: RemovableHandle = changes.hook(model.register_load_state_dict_pre_hook, refuse)
    return handle
