"""Following channels through a traced forward, node by node.

:func:`follow` walks the graph of :mod:`.fx_capture` once: the model's inputs hold no
channels, each call asks its rule (:mod:`.channel_modules` for modules, :mod:`.channel_ops`
for functions and tensor methods) what its result holds, a call without a rule makes every
channel reaching it unprunable, a parameter read directly in the forward can never be sliced,
and the channels that reach the model's outputs (a classifier's) are never removed.

Example:
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.structured.dependency.fx_capture import capture
    >>> model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    >>> graph, shapes = capture(model)
    >>> [c.reason for c in follow(model, graph, shapes).classes() if c.producers()][-1]
    "they reach the model's output"
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import fx, nn

from tensorplay.ao.pruning.parity.aliases import ParameterTable
from tensorplay.ao.pruning.structured.dependency.channel_atoms import ChannelAtoms
from tensorplay.ao.pruning.structured.dependency.channel_modules import module_rule, unknown_module
from tensorplay.ao.pruning.structured.dependency.channel_ops import FUNCTION_RULES, METHOD_RULES
from tensorplay.ao.pruning.structured.dependency.channel_values import Call, Tracked, values_in

__all__ = ["follow"]


def follow(
    model: nn.Module,
    graph: fx.Graph,
    shapes: Mapping[fx.Node, tuple[int, ...] | None],
    *,
    table: ParameterTable | None = None,
) -> ChannelAtoms:
    """The channel atoms of ``model``'s traced forward: who is joined with whom, and what
    cannot be removed (``table``: ``model``'s parameters, where they were read already)."""
    atoms = ChannelAtoms()
    names = (ParameterTable.of(model) if table is None else table).canonical
    values: dict[fx.Node, Any] = {}
    for node in graph.nodes:
        call = Call(
            node,
            fx.node.map_arg(node.args, values.__getitem__),
            fx.node.map_arg(node.kwargs, values.__getitem__),
            shapes.get(node),
            atoms,
            _describe(model, node),
        )
        values[node] = _value(model, call, names)
    return atoms


def _value(model: nn.Module, call: Call, names: Mapping[str, str]) -> Any:
    node = call.node
    if node.op == "placeholder":
        return call.result()
    if node.op == "output":
        for value in values_in((call.args, call.kwargs)):
            atoms = value.atoms() if isinstance(value, Tracked) else value.read_atoms()
            call.atoms.poison(list(atoms), "they reach the model's output")
        return None
    if node.op == "get_attr":
        return _direct_read(model, call, names)
    if node.op == "call_module":
        call.module = model.get_submodule(str(node.target))
        prefix = f"{node.target}."
        call.name_of = lambda name: names.get(prefix + name, prefix + name)
        rule = module_rule(call.module)
        return unknown_module(call) if rule is None else rule(call)
    if node.op == "call_method":
        method_rule = METHOD_RULES.get(str(node.target))
        return call.opaque() if method_rule is None else method_rule(call)
    function_rule = FUNCTION_RULES.get(node.target)
    return call.opaque() if function_rule is None else function_rule(call)


def _direct_read(model: nn.Module, call: Call, names: Mapping[str, str]) -> Tracked:
    """A parameter (or a module's) read in the forward itself: its entries cannot be sliced
    by the analysis, so they are never removed."""
    target = str(call.node.target)
    why = f"'{target}' is used directly in the forward"
    owner, _, leaf = target.rpartition(".")
    module = model.get_submodule(owner) if owner else model
    read = getattr(module, leaf, None)
    if isinstance(read, nn.Module):
        for name, _ in read.named_parameters():
            full = f"{target}.{name}"
            call.atoms.poison_parameter(names.get(full, full), why)
    else:
        call.atoms.poison_parameter(names.get(target, target), why)
    return call.result()


def _describe(model: nn.Module, node: fx.Node) -> str:
    if node.op == "call_module":
        module = model.get_submodule(str(node.target))
        return f"module {node.target!r} ({type(module).__name__})"
    if node.op == "call_method":
        return f"Tensor.{node.target}"
    if node.op == "call_function":
        return _function_name(node.target)
    return node.op


def _function_name(function: Any) -> str:
    module = getattr(function, "__module__", None) or ""
    module = {"_operator": "operator", "torch._C._VariableFunctions": "torch"}.get(module, module)
    name = getattr(function, "__name__", repr(function))
    return f"{module}.{name}" if module else name
