"""A plain PyTorch model as a torch.fx graph, with every value's shape where example inputs
are given; nothing of the model changes.

:func:`capture` traces the forward symbolically (``torch.fx``), keeping each module the
channel analysis knows (:mod:`.channel_modules`) as one ``call_module`` node, so parameters
keep their names in the model. A forward that cannot be traced (Python control flow on a
tensor's values) is refused naming the submodule whose forward failed. Shapes come from
running the graph on the meta device: modules are copied with meta tensors one at a time, so
no data is computed, no memory is taken and no running statistic moves (a module sharded by
FSDP2's ``fully_shard`` is copied as the module it wraps, with the full shapes and without
FSDP's hooks).

Example:
    >>> import torch
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    >>> graph, shapes = capture(model, torch.randn(5, 4))
    >>> [(node.target, shapes[node]) for node in graph.nodes if node.op == "call_module"]
    [('0', (5, 3)), ('1', (5, 3)), ('2', (5, 2))]
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, fx, nn
from torch.utils._pytree import tree_map

from tensorplay.ao.pruning.selection.sharding import fsdp_wrapped_class
from tensorplay.ao.pruning.structured.dependency.channel_modules import module_rule
from tensorplay.ao.pruning.structured.dependency.channel_ops import (
    ELEMENTWISE_FUNCTIONS,
    ELEMENTWISE_METHODS,
)

__all__ = ["capture", "example_tuple"]

Shapes = dict[fx.Node, tuple[int, ...] | None]


def example_tuple(example_inputs: object) -> tuple[Any, ...] | None:
    """``example_inputs`` as positional inputs: a tensor is one input, a tuple several.

    Raises:
        TypeError: Anything else.

    Example:
        >>> import torch
        >>> len(example_tuple(torch.zeros(2))), example_tuple(None)
        (1, None)
    """
    if example_inputs is None or isinstance(example_inputs, tuple):
        return example_inputs
    if isinstance(example_inputs, Tensor):
        return (example_inputs,)
    raise TypeError(
        "Expected `example_inputs` to be a tensor or a tuple of the forward's positional "
        f"inputs, but got {type(example_inputs).__name__}."
    )


def capture(model: nn.Module, example_inputs: object = None) -> tuple[fx.Graph, Shapes]:
    """The model's forward as a graph, and each node's output shape (empty without inputs).

    Raises:
        TypeError: ``example_inputs`` is neither a tensor nor a tuple.
        ValueError: The forward cannot be traced (naming the submodule whose forward
            failed), or the example inputs do not run through it (naming the call).
    """
    inputs = example_tuple(example_inputs)
    graph = _trace(model)
    if inputs is None:
        return graph, {}
    return graph, _shapes(model, graph, inputs)


class _Untraceable(Exception):
    def __init__(self, path: str, module: nn.Module, error: Exception) -> None:
        super().__init__(path)
        self.path, self.module, self.error = path, module, error


class _NamingTracer(fx.Tracer):
    """torch.fx's tracer that keeps the analysis' known modules whole and remembers whose
    forward failed."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return module_rule(m) is not None or super().is_leaf_module(m, module_qualified_name)

    def call_module(
        self,
        m: nn.Module,
        forward: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        try:
            return super().call_module(m, forward, args, kwargs)
        except _Untraceable:
            raise
        except Exception as error:
            raise _Untraceable(self.path_of_module(m), m, error) from error


def _trace(model: nn.Module) -> fx.Graph:
    try:
        return _NamingTracer().trace(model)
    except _Untraceable as failure:
        where = f"submodule {failure.path!r} ({type(failure.module).__name__})"
        error = failure.error
    except Exception as root_error:
        where = f"the model itself ({type(model).__name__})"
        error = root_error
    raise ValueError(
        f"Expected the forward of {where} to be traceable by torch.fx for the channel "
        f"analysis, but tracing failed ({type(error).__name__}: {error}). torch.fx traces with "
        "symbolic values, so Python control flow on a tensor's values or shape cannot be "
        "traced (example_inputs do not change that); express that branch with tensor "
        "operations (torch.where, a mask) or move it out of the module."
    ) from error


def _shapes(model: nn.Module, graph: fx.Graph, inputs: tuple[Any, ...]) -> Shapes:
    runner = _MetaShapes(fx.GraphModule(model, graph))
    meta_inputs = tree_map(_to_meta, inputs)
    try:
        runner.run(*meta_inputs)
    except _NodeFailed as failure:
        raise ValueError(
            "Expected `example_inputs` to run through the model's traced forward (on the meta "
            f"device, no data computed), but {_call_name(failure.node)} failed: "
            f"{type(failure.error).__name__}: {failure.error}"
        ) from failure.error
    except Exception as error:
        raise ValueError(
            f"Expected `example_inputs` to be the inputs of the model's forward, but they "
            f"could not be passed to it: {type(error).__name__}: {error}"
        ) from error
    return runner.shapes


def _call_name(node: fx.Node) -> str:
    if node.op == "call_module":
        return f"submodule {node.target!r}"
    return f"{node.op} {node.name!r} ({node.format_node()})"


def _to_meta(value: Any) -> Any:
    if isinstance(value, Tensor):
        return torch.empty(value.shape, dtype=value.dtype, device="meta")
    return value


class _NodeFailed(Exception):
    def __init__(self, node: fx.Node, error: Exception) -> None:
        super().__init__(node.name)
        self.node, self.error = node, error


_SHAPE_KEEPING = (
    nn.ReLU,
    nn.GELU,
    nn.SiLU,
    nn.Sigmoid,
    nn.Tanh,
    nn.modules.batchnorm._BatchNorm,
    nn.modules.instancenorm._InstanceNorm,
    nn.GroupNorm,
    nn.LayerNorm,
    nn.Identity,
    nn.modules.dropout._DropoutNd,
)


class _MetaShapes(fx.Interpreter):
    """Runs the graph on meta tensors: each module called through a copy of itself whose
    tensors are meta, each parameter read as a meta tensor; records every node's shape."""

    def __init__(self, module: fx.GraphModule) -> None:
        super().__init__(module)
        self.shapes: Shapes = {}
        self._copies: dict[str, nn.Module] = {}

    def run_node(self, n: fx.Node) -> Any:
        try:
            result = super().run_node(n)
        except _NodeFailed:
            raise
        except Exception as error:
            if n.op == "placeholder":
                raise
            raise _NodeFailed(n, error) from error
        self.shapes[n] = tuple(result.shape) if isinstance(result, Tensor) else None
        return result

    # Norms, activations, dropout and identity keep their input's shape: running them on meta
    # tensors (through Python decompositions there) only costs time.

    def call_function(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if target in ELEMENTWISE_FUNCTIONS and args and isinstance(args[0], Tensor):
            return args[0]
        return super().call_function(target, args, kwargs)

    def call_method(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if target in ELEMENTWISE_METHODS and args and isinstance(args[0], Tensor):
            return args[0]
        return super().call_method(target, args, kwargs)

    def call_module(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        module = self.fetch_attr(target)
        keeps_shape = isinstance(module, _SHAPE_KEEPING) and module_rule(module) is not None
        if keeps_shape and len(args) == 1 and not kwargs and isinstance(args[0], Tensor):
            return args[0]
        copied = self._copies.get(target)
        if copied is None:
            copied = self._copies[target] = _meta_copy(module)
        return copied(*args, **kwargs)

    def get_attr(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return tree_map(_to_meta, super().get_attr(target, args, kwargs))


def _tensors(values: list[Any]) -> list[Tensor]:
    return [value for value in values if isinstance(value, Tensor)]


def _meta_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` whose parameters and buffers are meta tensors (no data copied)."""
    memo: dict[int, Any] = {}
    # A pruned tensor's recomputed attribute (``weight`` beside ``weight_orig``) is neither.
    loose = [value for m in module.modules() for value in vars(m).values()]
    for tensor in [*module.parameters(), *module.buffers(), *_tensors(loose)]:
        meta = torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")
        memo[id(tensor)] = (
            nn.Parameter(meta, tensor.requires_grad) if isinstance(tensor, nn.Parameter) else meta
        )
    wrapped = fsdp_wrapped_class(module)
    if wrapped is None:
        return copy.deepcopy(module, memo)
    # FSDP2 (fully_shard) refuses deepcopy: copy the module it wraps, without FSDP's state and
    # hooks (gathering shards, which the meta run, reading only shapes, never needs).
    copied = wrapped.__new__(wrapped)
    for key, value in vars(module).items():
        if key.startswith("__composable_api_state_key"):
            continue
        fresh = isinstance(value, OrderedDict) and "hooks" in key
        copied.__dict__[key] = OrderedDict() if fresh else copy.deepcopy(value, memo)
    return copied
