"""A frozen copy of an FSDP2-sharded model, sharded like it, made shard by shard.

:func:`sharded_copy` is what :func:`~tensorplay.ao.pruning.distillation.dense_copy.dense_copy` does
for a model whose parameters are ``DTensor`` s (``fully_shard`` on a 1-D device mesh, lean masks:
``masking="inplace"``): the copy is built on the meta device from the modules FSDP wraps (without
FSDP's state and hooks), each module that is an ``FSDPModule`` in the model is sharded in the copy
with the same mesh, parameter placements, ``reshard_after_forward`` and mixed-precision policy
(children first, the root last), and then each parameter's local shard is copied from the model's on
the same rank. No full tensor is ever gathered or allocated: the copy costs one more shard of the
weights per rank (half of it in ``torch.bfloat16`` for a float32 model).

A lean mask (``<name>_mask`` beside a weight whose pruned entries are zero) is left out: the
weight already holds what the model computes with. Buffers (FSDP does not shard them) are copied
whole. Every parameter of the copy is frozen and the copy is in eval mode.

Example:
    >>> from torch import nn
    >>> sharded_copy(nn.Linear(2, 2))  # a model FSDP2 did not shard
    Traceback (most recent call last):
    ...
    ValueError: Expected a model sharded with FSDP2 (`fully_shard`), but Linear is not one: ...
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.distillation.left_out import drop_left_out_hooks, left_out_memo
from tensorplay.ao.pruning.masking.module_masks import ModuleMasks, read_masks
from tensorplay.ao.pruning.selection import is_dtensor
from tensorplay.ao.pruning.selection.sharding import fsdp_wrapped_class

__all__ = ["check_gatherable", "sharded_copy", "unsharded_meta_copy"]

# What to do instead, when the copy is refused: for a teacher, and for a gathered copy.
_TEACHER_REMEDY = "pass a teacher you built and sharded yourself"
_GATHER_REMEDY = (
    "gather its full state yourself (torch.distributed.checkpoint's get_model_state_dict with "
    "full_state_dict=True) into an unsharded model, then call tensorplay.ao.pruning.shrink"
)
_FSDP_STATE_KEY = "__composable_api_state_key"  # where fully_shard keeps its state
_FSDP_PACKAGE = "torch.distributed.fsdp"


class _Sharding(NamedTuple):
    """What a copy reads of a sharded model before it builds anything
    (:func:`_read_sharding`)."""

    mesh: Any
    masks: dict[int, ModuleMasks]
    classes: dict[int, type[nn.Module]]  # by module id; an FSDPModule's is the class it wraps


def sharded_copy(model: nn.Module, dtype: torch.dtype | None = None) -> nn.Module:
    """A frozen copy of the FSDP2-sharded ``model``, sharded like it, that computes what
    ``model`` computes now; lean masks are left out (the module).

    Collective: every rank of the model's mesh must call it, in the same order.

    Args:
        model: A module sharded with ``fully_shard`` (its root an ``FSDPModule``) on a 1-D
            device mesh, pruned with ``masking="inplace"`` or not.
        dtype: The floating-point dtype of the copy's floating-point parameters and buffers, or
            ``None`` to keep each tensor's dtype.

    Returns:
        The copy, in eval mode; its parameters are ``DTensor`` s placed as the model's, frozen,
        holding copies of this rank's shards.

    Raises:
        ValueError: ``model`` is not an ``FSDPModule``, has a reparametrized tensor (FSDP2 needs
            ``masking="inplace"``), a parameter that is not a ``DTensor`` or is on another mesh
            or on a mesh that is not 1-D, a parameter group offloaded to the CPU, or an
            ``reshard_after_forward`` given as a number of ranks: each named.

    Example:
        >>> from torch import nn
        >>> sharded_copy(nn.Linear(2, 2), dtype=torch.bfloat16)
        Traceback (most recent call last):
        ...
        ValueError: Expected a model sharded with FSDP2 (`fully_shard`), but Linear is not one: ...
    """
    from torch.distributed.fsdp import FSDPModule, fully_shard

    _check_root(model)
    sharding = _read_sharding(model, _TEACHER_REMEDY)
    sharded = [name for name, module in _children_first(model) if isinstance(module, FSDPModule)]
    options = {name: _shard_options(model.get_submodule(name)) for name in sharded}
    placements: dict[int, Any] = {}
    clone = _meta_clone(model, sharding, dtype, placements)
    for name in sharded:
        fully_shard(
            clone.get_submodule(name),
            mesh=sharding.mesh,
            shard_placement_fn=lambda param: placements.get(id(param)),
            **options[name],
        )
    clone.to_empty(device=_local_device(model))
    _copy_local_shards(model, clone)
    clone.requires_grad_(False)
    return clone.eval()


def _read_sharding(model: nn.Module, remedy: str) -> _Sharding:
    """The model's one mesh, the masks of its modules and the class each module is (an
    ``FSDPModule``: the class it wraps), after refusing what the copy would not reproduce
    exactly, each refusal ending with ``remedy``: all a copy reads of the sharding, read once
    before anything is built."""
    masks = read_masks(model)
    meshes: dict[Any, str] = {}  # each mesh and a parameter on it
    for module_name, module in model.named_modules():
        if masks[id(module)].reparametrized:
            raise ValueError(
                f"Expected lean masks (masking='inplace') in a sharded model, but {module_name} "
                "is reparametrized: FSDP2 needs masking='inplace'."
            )
    for name, param in model.named_parameters():
        if not is_dtensor(param):
            raise ValueError(
                f"Expected every parameter of a model sharded with FSDP2 to be a DTensor, but "
                f"{name} is a plain tensor: apply `fully_shard` to the root module too."
            )
        mesh = param.device_mesh  # type: ignore[attr-defined]
        if mesh.ndim != 1:
            raise ValueError(
                f"Expected a 1-D device mesh (FSDP), but {name} is sharded on a mesh of "
                f"{mesh.ndim} dimensions (HSDP or tensor parallelism): {remedy}."
            )
        meshes.setdefault(mesh, name)
    if len(meshes) > 1:
        raise ValueError(
            f"Expected one device mesh for every parameter, but {list(meshes.values())} are on "
            f"different ones: {remedy}."
        )
    classes = {id(module): fsdp_wrapped_class(module) or type(module) for module in model.modules()}
    return _Sharding(next(iter(meshes)), masks, classes)


def _children_first(model: nn.Module, prefix: str = "") -> list[tuple[str, nn.Module]]:
    """The modules in post-order: each after its children, siblings in order, the root last."""
    found: list[tuple[str, nn.Module]] = []
    for name, child in model.named_children():
        found += _children_first(child, f"{prefix}{name}.")
    return [*found, (prefix.removesuffix("."), model)]


def _shard_options(module: Any) -> dict[str, Any]:
    """The ``fully_shard`` options of an ``FSDPModule`` (besides its mesh and placements)."""
    from torch.distributed.fsdp import OffloadPolicy

    state = module._get_fsdp_state()
    groups = state._fsdp_param_groups
    if not groups:  # no parameter of its own: its policy casts the inputs of its forward
        return {"reshard_after_forward": True, "mp_policy": state._mp_policy}
    group = groups[0]
    if type(group.offload_policy) is not OffloadPolicy:
        raise ValueError(
            f"Expected no CPU offloading, but {type(module).__name__} is sharded with "
            f"{type(group.offload_policy).__name__}: pass a teacher you built and sharded yourself."
        )
    after = group.post_forward_mesh_info
    if after is not None and after != group.mesh_info:
        raise ValueError(
            f"Expected reshard_after_forward to be True or False, but {type(module).__name__} "
            "reshards to a number of ranks: pass a teacher you built and sharded yourself."
        )
    return {"reshard_after_forward": after is not None, "mp_policy": state._mp_policy}


def unsharded_meta_copy(
    model: nn.Module, *, keep_masks: bool = True, dtype: torch.dtype | None = None
) -> nn.Module:
    """A copy of the FSDP2-sharded ``model`` on the meta device, at the full shapes, unsharded:
    its modules are instances of the classes FSDP wraps, without FSDP's state and hooks (nor the
    hooks :func:`~tensorplay.ao.pruning.distillation.dense_copy.dense_copy` leaves out); its lean
    masks are kept as bool buffers if ``keep_masks``; its floating-point tensors in ``dtype``
    (``None``: each its own). Not a collective: nothing is read from the shards.

    Raises:
        ValueError: As :func:`sharded_copy`.

    Example:
        >>> unsharded_meta_copy(nn.Linear(2, 2))
        Traceback (most recent call last):
        ...
        ValueError: Expected a model sharded with FSDP2 (`fully_shard`), but Linear is not one: ...
    """
    _check_root(model)
    return _meta_clone(
        model, _read_sharding(model, _GATHER_REMEDY), dtype, {}, keep_masks=keep_masks
    )


def check_gatherable(model: nn.Module) -> Any:
    """Refuse, before anything is read or built, what :func:`unsharded_meta_copy` cannot copy;
    the model's device mesh otherwise. Not a collective.

    Raises:
        ValueError: As :func:`sharded_copy`, each refusal saying how to gather the model
            instead.

    Example:
        >>> check_gatherable(nn.Linear(2, 2))
        Traceback (most recent call last):
        ...
        ValueError: Expected a model sharded with FSDP2 (`fully_shard`), but Linear is not one: ...
    """
    _check_root(model)
    return _read_sharding(model, _GATHER_REMEDY).mesh


def _check_root(model: nn.Module) -> None:
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(model, FSDPModule):
        raise ValueError(
            "Expected a model sharded with FSDP2 (`fully_shard`), but "
            f"{type(model).__name__} is not one: apply `fully_shard` to its root as well."
        )


def _meta_clone(
    model: nn.Module,
    sharding: _Sharding,
    dtype: torch.dtype | None,
    placements: dict[int, Any],
    *,
    keep_masks: bool = False,
) -> nn.Module:
    """A copy of ``model`` with meta parameters and buffers of the full shapes (in ``dtype``),
    its FSDP modules made instances of the classes they wrap (``sharding`` read them, with the
    masks and the mesh), without FSDP's state, FSDP's hooks, the hooks
    :func:`~tensorplay.ao.pruning.distillation.dense_copy.dense_copy` leaves out, or (unless
    ``keep_masks``) lean masks; ``placements`` maps each meta parameter to its model parameter's
    placement."""
    mesh = sharding.mesh
    memo: dict[int, Any] = {id(mesh): mesh}  # shared, as a reference to it in a module is
    for module in model.modules():
        for param in module._parameters.values():
            if param is not None and id(param) not in memo:
                meta = nn.Parameter(_meta(param, dtype), requires_grad=False)
                placements[id(meta)] = param.placements[0]  # type: ignore[attr-defined]
                memo[id(param)] = meta
        for buffer in module._buffers.values():
            if buffer is not None and id(buffer) not in memo:
                memo[id(buffer)] = _meta(buffer, dtype)
    memo.update(left_out_memo(model, also=_is_fsdp_hook))
    for module in reversed(list(model.modules())):  # children first: they are in the memo
        dropped = frozenset() if keep_masks else sharding.masks[id(module)].lean_keys
        memo[id(module)] = _module_copy(module, sharding.classes[id(module)], memo, dropped)
    clone = memo[id(model)]
    assert isinstance(clone, nn.Module)  # for mypy: _module_copy makes modules
    for module in clone.modules():
        drop_left_out_hooks(module)
    return clone


def _meta(tensor: Tensor, dtype: torch.dtype | None) -> Tensor:
    to = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
    return torch.empty(tensor.shape, dtype=to, device="meta")


def _is_fsdp_hook(hook: object) -> bool:
    """FSDP's own hooks (its state's methods, or functions of its modules): a copy leaves them
    out, as it does those
    :func:`~tensorplay.ao.pruning.distillation.dense_copy.dense_copy` leaves out."""
    where = getattr(hook, "__module__", None)
    return isinstance(where, str) and where.startswith(_FSDP_PACKAGE)


def _module_copy(
    module: nn.Module, cls: type[nn.Module], memo: dict[int, Any], dropped: frozenset[str]
) -> nn.Module:
    """A copy of ``module`` as an instance of ``cls`` (an ``FSDPModule``: the class it wraps,
    without FSDP's state), its tensors, children and hooks from ``memo``, without the buffers
    ``dropped``."""
    getstate: Callable[[], Any] | None = getattr(module, "__getstate__", None)
    state = dict(getstate() if getstate is not None else vars(module))  # a LightningModule's
    # leaves its trainer out
    clone = cls.__new__(cls)
    memo[id(module)] = clone  # a reference back to the module inside its state is the clone
    state = {k: v for k, v in state.items() if not k.startswith(_FSDP_STATE_KEY)}
    clone.__setstate__(copy.deepcopy(state, memo))  # type: ignore[no-untyped-call]
    for name in dropped:
        del clone._buffers[name]
        clone._non_persistent_buffers_set.discard(name)
    return clone


def _local_device(model: nn.Module) -> torch.device:
    param = next(model.parameters())
    return param.to_local().device  # type: ignore[attr-defined,no-any-return]


def _copy_local_shards(model: nn.Module, clone: nn.Module) -> None:
    """Each of the clone's parameters and buffers takes the model's on this rank (a DTensor
    its local shard): the clone's names are the model's less the lean masks."""
    sources: dict[str, Tensor] = dict(model.named_parameters(remove_duplicate=False))
    sources.update(model.named_buffers(remove_duplicate=False))
    targets: dict[str, Tensor] = dict(clone.named_parameters(remove_duplicate=False))
    targets.update(clone.named_buffers(remove_duplicate=False))
    with torch.no_grad():
        for name, target in targets.items():
            source = sources[name]
            if is_dtensor(target):
                target.to_local().copy_(source.to_local())  # type: ignore[attr-defined]
            else:
                target.copy_(source)
