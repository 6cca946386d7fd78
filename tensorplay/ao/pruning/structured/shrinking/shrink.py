"""Shrinking: removing pruned units physically, so the model is smaller and faster.

:func:`shrink` reads which units are pruned, removes them from every tensor they span (a
channel's rows and columns, a head's q/k/v rows and output columns, a whole residual block) and
returns a :class:`~tensorplay.ao.pruning.structured.shrinking.shrink_report.ShrinkReport`. The
shrunk model computes what the masked model computed (to float rounding), in training and in
evaluation, and a decoder generates the same tokens with its KV cache. (In training, dropout draws
other random numbers where a shape changed, such as attention probabilities with fewer heads.)

Which groups: those given (``groups=``), else the groups a structured
:class:`~tensorplay.ao.pruning.Pruner` recorded on the model when it was built
(:mod:`~tensorplay.ao.pruning.structured.dependency.recorded`: exactly what it masked, found with
its ``example_inputs``; never re-derived) and every other group the model's dependency graph finds
now (:mod:`~tensorplay.ao.pruning.structured.shrinking.shrink_groups`). A plain model's graph is
traced: without ``example_inputs`` tracing cannot follow channels through a reshape, a flattening or
a concatenation, so pass them (the inputs the model was pruned with) when no pruner recorded its
groups, as after masks made by hand or loaded into a fresh model.

Which units are pruned:

* A tensor held under a tensorplay or ``torch.nn.utils.prune`` mask, in either masking mode
  (the reparametrized ``<name>_orig``/``<name>_mask`` with its forward pre-hook, or the lean
  bool ``<name>_mask`` buffer), is read through its mask; any other tensor through its values
  (an exact zero is pruned).
* A unit is removed when **every** slice it spans is pruned: its weights, its biases, its norm
  entries. A unit pruned in some slices but not others (element pruning leaves such units; a
  weight row masked but its bias not) is kept, with its zeros, and counted in
  :attr:`~tensorplay.ao.pruning.structured.shrinking.shrink_report.ShrinkReport.partial_units`:
  shrinking never loses what was computed, and never refuses work already done.
* A group keeps at least one unit: where all its units are pruned, the first stays (all zero, so
  its module still computes zero): attention cannot run with no heads. A mixture-of-experts
  layer must keep its ``top_k`` experts: fewer is refused before anything changes.
* A masked structured unit never stays silently: where one would (in a group not shrunk whose
  tensors the shrink spans: a recorded group left out of ``groups=``, a graph's group set aside
  for an overlapping recorded one; a masked channel of a plain model that tracing without
  ``example_inputs`` could not follow), shrinking refuses before changing anything, naming it
  and what to pass (:mod:`~tensorplay.ao.pruning.structured.shrinking.left_masked`).
* A routed expert's channels are cut from its slices of the fused expert tensors. One fused
  tensor holds one width for all the experts of a layer: where they keep different numbers, each
  keeps as many as the widest, some pruned channels staying as zeros (exact: they add nothing;
  :mod:`~tensorplay.ao.pruning.structured.shrinking.expert_widths`), counted in
  :attr:`~tensorplay.ao.pruning.structured.shrinking.shrink_report.ShrinkReport.padded_units`.
* Hidden channels (``structure="hidden"``: one channel of the residual stream in every tensor
  that reads or writes it) are cut from all of them; the norms' hooks that normalised the kept
  channels go with them (:mod:`~tensorplay.ao.pruning.structured.units.stream_norms`), and the
  config's ``hidden_size`` follows, with ``head_dim`` written out where the family derives it.
* Experts (a masked expert is never routed to:
  :mod:`~tensorplay.ao.pruning.structured.units.routing`) are cut from the fused expert tensors and
  the router; the router's hook goes with them, and the config's ``num_experts``
  (``num_local_experts``) follows.

The masks of every tensor the groups span are made permanent (the pruned values are zero and
stay in the kept units; the masks, ``_orig`` parameters and hooks are gone); other masks are
left as they are.

**Optimizers and gradients.** Every parameter that loses units becomes a new ``nn.Parameter``:
an optimizer built before shrinking holds the old tensors and their state and must not be used
with the shrunk model. Build a new optimizer (and a new pruner) after shrinking. Gradients of the
sliced parameters are dropped.

**Pruners.** A :class:`~tensorplay.ao.pruning.Pruner` made before shrinking, any of whose targets
the groups span, is spent: its units, masks and counts are those of the model before. Its
methods that read or change the model through its targets (``step``, ``report``, ``sparsity``
and the counts, ``state_dict``, ``load_state_dict``, ``apply_masks``, ``reparametrize``,
``make_permanent``, ``snapshot``, ``take_snapshot``, ``rewind``, ``attach``, ``held_by``,
``accumulate``, ``mask_gradients``, and the steps of the optimizers attached to it) raise
:class:`~tensorplay.ao.pruning.SpentPrunerError`; its record (``history``, ``last_step``,
``targets``, ``target_sparsity``, the configuration) stays readable. Read ``pruner.report()``
and save ``pruner.state_dict()`` before shrinking; build a new pruner on the shrunk model to
prune or count it further.

Example:
    >>> import torch
    >>> import transformers
    >>> from tensorplay.ao.pruning import DependencyGraph, shrink
    >>> from tensorplay.ao.pruning.structured.dependency.unit_groups import expand_keep, shapes_of
    >>> config = transformers.LlamaConfig(
    ...     vocab_size=16, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
    ...     num_attention_heads=4, num_key_value_heads=2)
    >>> model = transformers.LlamaForCausalLM(config).eval()
    >>> with torch.no_grad():  # zero half of every FFN's channels: what a pruner masks
    ...     for group in DependencyGraph(model).groups("channel"):
    ...         keep = torch.arange(group.size) % 2 == 0
    ...         for name, mask in expand_keep(group, keep, shapes_of(model)).items():
    ...             _ = model.get_parameter(name).mul_(mask)
    >>> tokens = torch.tensor([[1, 2, 3]])
    >>> masked = model(tokens).logits
    >>> report = shrink(model)
    >>> model.config.intermediate_size, report.removed
    (12, 1152)
    >>> torch.allclose(model(tokens).logits, masked, atol=1e-6)
    True
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.edits import changes
from tensorplay.ao.pruning.edits.spent import record_shrink
from tensorplay.ao.pruning.masking.held_tensors import drop_masks
from tensorplay.ao.pruning.structured.dependency.blocks import FoundBlocks
from tensorplay.ao.pruning.structured.dependency.own_configs import own_configs
from tensorplay.ao.pruning.structured.dependency.recorded import (
    RECORD_ATTRIBUTE,
    records_without,
)
from tensorplay.ao.pruning.structured.dependency.unit_groups import UnitGroup, pruned_units
from tensorplay.ao.pruning.structured.shrinking.expert_widths import (
    even_expert_widths,
    fold_expert_rows,
)
from tensorplay.ao.pruning.structured.shrinking.hf_config import update_config
from tensorplay.ao.pruning.structured.shrinking.left_masked import (
    LeftMasked,
    refuse_untraced_channels,
)
from tensorplay.ao.pruning.structured.shrinking.reading import Reading, read_model
from tensorplay.ao.pruning.structured.shrinking.removal import (
    Cut,
    apply_cuts,
    plan_cuts,
    remove_blocks,
)
from tensorplay.ao.pruning.structured.shrinking.shrink_report import (
    ConfigUpdate,
    GroupWidth,
    ShrinkReport,
)
from tensorplay.ao.pruning.structured.units.routing import remove_routing
from tensorplay.ao.pruning.structured.units.stream_norms import remove_stream_norms

__all__ = ["shrink"]


def shrink(
    model: nn.Module,
    *,
    groups: Iterable[UnitGroup] | None = None,
    example_inputs: Tensor | tuple[Any, ...] | None = None,
) -> ShrinkReport:
    """Remove the pruned units of ``model`` physically, in place (see the module docstring).

    A :class:`~tensorplay.ao.pruning.Pruner` made before, any of whose targets the groups span,
    is spent afterwards: read its ``report()`` and save its ``state_dict()`` before shrinking,
    and build a new pruner on the shrunk model to prune or count it (its other methods raise
    :class:`~tensorplay.ao.pruning.SpentPrunerError`; see the module docstring).

    Args:
        model: A model whose units are masked or zero: a Hugging Face model of a known family
            (or a module holding one), or a plain PyTorch model.
        groups: The unit groups to shrink (those of a
            :class:`~tensorplay.ao.pruning.DependencyGraph`); by default the groups structured
            pruners recorded on the model and every other group of every kind the model's
            dependency graph has.
        example_inputs: Inputs for tracing a plain model (see
            :class:`~tensorplay.ao.pruning.DependencyGraph`): needed where no structured pruner
            recorded its groups and a pruned channel reaches a reshape, a flattening or a
            concatenation; not used when ``groups`` is given.

    Returns:
        The report: parameters and widths before and after, and how the Hugging Face config
        describes the result (a uniform model loads with plain ``from_pretrained``; one whose
        widths differ per layer with :func:`~tensorplay.ao.pruning.load_shrunk`).

    Raises:
        ValueError: Before anything changes: groups that do not fit the model (given, or
            recorded by a pruner on a model changed since), a layer group that is not a block
            of a Hugging Face family, a module that cannot be resized, a config with
            transformers' own ``per_layer_config``; a masked structured unit that would stay
            (naming the group, unit and tensor, or the module, channel and the missing
            ``example_inputs``); what :class:`~tensorplay.ao.pruning.DependencyGraph` raises
            where nothing is recorded; a sharded (FSDP2 ``DTensor``) parameter, first of all:
            :func:`~tensorplay.ao.pruning.save_shrunk` shrinks a sharded model.
    """
    reading = read_model(model, groups, example_inputs)
    plan = _plan(model, reading)
    _refuse_left_masked(model, reading, plan)
    with changes.transaction():  # an unexpected failure below puts every module back
        own_configs(model)  # never the config of another model built from the same one
        for module in model.modules():
            changes.touch(module)
            if (config := vars(module).get("config")) is not None:
                changes.touch(config)
        update = _apply(model, reading, plan)
    after = sum(param.numel() for param in model.parameters())  # each once, as the table counts
    record_shrink(pair for name in reading.tensors for pair in reading.table.aliases[name].pairs)
    return ShrinkReport(
        reading.table.count,
        after,
        plan.widths,
        plan.partial_units,
        update,
        plan.removed_layers,
        plan.padded_units,
    )


def _apply(model: nn.Module, reading: Reading, plan: _Plan) -> ConfigUpdate:
    """Carry out ``plan`` (every check passed); the config update it made."""
    aliases, found = reading.table.aliases, reading.blocks
    drop_masks({id(aliases[name].parameter): aliases[name] for name in reading.tensors}.values())
    apply_cuts(plan.cuts)
    hidden = next((width.after for width in plan.widths if width.kind == "hidden"), None)
    config: ConfigUpdate = "none"
    if found is not None:
        layers_before = len(found.blocks)
        remove_blocks(found.blocks, plan.dropped_blocks)
        if found.config is not None:
            config = update_config(found, plan.kept_blocks(layers_before), hidden)
        for block in found.blocks:  # after the config: a layer reads what the config lacks
            found.family.sync(block)
    changed = aliases if plan.dropped_blocks else reading.tensors  # blocks renumbered: all
    records = records_without(model, {alias for name in changed for alias in aliases[name].names})
    for group in reading.chosen:
        if group.kind == "expert":  # its masked experts are gone: route as a plain model
            for name in group.parameters():
                for module, _ in aliases[name].pairs:
                    remove_routing(module)
        if group.kind == "hidden":  # its masked channels are gone: the norms read them all
            for name in group.parameters():
                for module, _ in aliases[name].pairs:
                    remove_stream_norms(module)
    for holder, record in records:  # the records forget the groups whose tensors changed
        changes.set_attribute(holder, RECORD_ATTRIBUTE, record)
    return config


@dataclass(frozen=True)
class _Plan:
    """Everything shrinking will do, decided before it changes anything."""

    cuts: list[Cut]
    dropped_blocks: list[int]
    dropped_prefixes: list[str]
    widths: tuple[GroupWidth, ...]
    partial_units: int
    removed_layers: tuple[str, ...]
    padded_units: int = 0

    def kept_blocks(self, count: int) -> list[int]:
        return [index for index in range(count) if index not in self.dropped_blocks]


def _plan(model: nn.Module, reading: Reading) -> _Plan:
    found, kept_elements = reading.blocks, reading.kept
    layers = [group for group in reading.chosen if group.kind == "layer"]
    dropped_blocks = _dropped_blocks(layers, kept_elements, found)
    dropped_names = [f"{found.block_names()[i]}." for i in dropped_blocks] if found else []
    keeps: list[tuple[UnitGroup, Tensor]] = []
    widths: list[GroupWidth] = []
    partial = 0
    for group in reading.chosen:
        if group.kind == "layer":
            if found is not None and group is layers[0]:  # one row: the layer group
                count = len(found.blocks)
                widths.append(GroupWidth(found.name, "layer", count, count - len(dropped_blocks)))
            continue
        if any(group.name.startswith(prefix) for prefix in dropped_names):
            continue  # gone with its layer, which the layer group's row counts
        pruned, partly = _pruned(group, kept_elements)
        partial += partly
        if int((~pruned).sum()) < group.min_kept > 1:
            raise ValueError(
                f"Expected group {group.name!r} to keep at least {group.min_kept} {group.kind} "
                f"units (the experts routed to per token), but only {int((~pruned).sum())} of "
                f"{group.size} are unpruned: unmask some, or prune fewer."
            )
        if pruned.all():
            pruned[0] = False  # attention cannot run without heads: one zero unit stays
        keeps.append((group, ~pruned))
        widths.append(GroupWidth(group.name, group.kind, group.size, int((~pruned).sum())))
    keeps, padded = even_expert_widths(keeps, reading.table.element_sizes)  # one width per tensor
    widths = fold_expert_rows(widths, keeps)
    cuts = plan_cuts(
        model, [(group, keep) for group, keep in keeps if not keep.all()], table=reading.table
    )
    removed = tuple(found.block_names()[i] for i in dropped_blocks) if found else ()
    return _Plan(cuts, dropped_blocks, dropped_names, tuple(widths), partial, removed, padded)


def _refuse_left_masked(model: nn.Module, reading: Reading, plan: _Plan) -> None:
    """Refuse, before any change, where a masked structured unit would stay (see
    :mod:`~tensorplay.ao.pruning.structured.shrinking.left_masked`): of the groups known but
    not shrunk (each with how to fix it) or in channels tracing left out."""
    if not reading.checked:
        return
    aliases = reading.table.aliases
    removed: dict[tuple[str, int | None] | tuple[str, int | None, int], set[int]] = {}
    for cut in plan.cuts:
        for dim, kept in cut.kept.items():
            gone = set(range(aliases[cut.name].parameter.shape[dim])) - set(kept.tolist())
            removed.update({(alias, dim): gone for alias in aliases[cut.name].names})
        for dim, rows in cut.per_expert.items():  # each expert's own channels
            length = aliases[cut.name].parameter.shape[dim]
            for expert, kept in enumerate(rows.tolist()):
                gone = set(range(length)) - set(kept)
                removed.update({(alias, dim, expert): gone for alias in aliases[cut.name].names})
    dropped = {name for name in aliases if name.startswith(tuple(plan.dropped_prefixes))}
    kept_elements = {name: reading.kept[name] for name in reading.checked}
    held = {name for name in reading.checked if name in reading.held}
    left = LeftMasked(kept_elements, held, removed, dropped)
    left.refuse(reading.unshrunk, reading.spanned)
    spanned_dims = {
        (alias, piece.dim)
        for group in reading.chosen
        for piece in group.slices
        for alias in aliases[piece.parameter].names
    }
    refuse_untraced_channels(model, reading.untraced, left, spanned_dims)


def _dropped_blocks(
    layers: Sequence[UnitGroup], kept_elements: Mapping[str, Tensor], found: FoundBlocks | None
) -> list[int]:
    if not layers:
        return []
    names = found.block_names() if found is not None else []
    dropped = []
    for group in layers:
        if group.name not in names:
            raise ValueError(
                f"Expected layer groups to be blocks of a Hugging Face model of a known family, "
                f"but {group.name!r} is not one."
            )
        if bool(pruned_units(group, kept_elements, partial="keep")[0]):
            dropped.append(names.index(group.name))
    if len(dropped) == len(names):
        dropped.remove(min(dropped))  # as for units: one (zero) block stays
    return sorted(dropped)


def _pruned(group: UnitGroup, kept_elements: Mapping[str, Tensor]) -> tuple[Tensor, int]:
    """Per unit whether every slice is pruned, and how many units are pruned in some scored
    slices but not all."""
    pruned = torch.ones(group.size, dtype=torch.bool)
    somewhere = torch.zeros(group.size, dtype=torch.bool)
    for piece in group.slices:
        alone = pruned_units(UnitGroup(group.name, group.kind, group.size, (piece,)), kept_elements)
        pruned &= alone
        if piece.scored:
            somewhere |= alone
    return pruned, int((somewhere & ~pruned).sum())
