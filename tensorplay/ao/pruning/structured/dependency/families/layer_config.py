"""A layer's own view of its model's config, for attention code that reads widths from it.

Some attention modules read a width from the config shared by every layer at each forward
(Phi-3 splits its fused ``qkv_proj`` at ``config.num_attention_heads * head_dim``). Once one
layer keeps fewer heads than another, no single config value is right for all of them: such a
module gets a :class:`LayerConfig`, which answers its own values for the few keys it overrides
and passes every other read and write through to the shared config (so a later change of the
model's config, such as its attention implementation, still reaches the layer). The saved
config is the model's own; the layer's widths are recorded beside it
(:mod:`~tensorplay.ao.pruning.structured.shrinking.hf_config`) and restored by ``sync`` after
loading.

Example:
    >>> from types import SimpleNamespace
    >>> shared = SimpleNamespace(num_attention_heads=4, attn="eager")
    >>> view = layer_config(shared, num_attention_heads=3)
    >>> view.num_attention_heads, view.attn
    (3, 'eager')
    >>> shared.attn = "sdpa"
    >>> view.attn, shared_config(view) is shared
    ('sdpa', True)
    >>> layer_config(shared, num_attention_heads=4) is shared  # nothing to override
    True
"""

from __future__ import annotations

from typing import Any

__all__ = ["LayerConfig", "layer_config", "shared_config"]


class LayerConfig:
    """The shared config ``shared`` with ``overrides`` in place of its own values.

    Args:
        shared: The model's config.
        **overrides: The keys this layer answers itself.
    """

    def __init__(self, shared: Any, **overrides: Any) -> None:
        vars(self).update(_shared=shared, _overrides=dict(overrides))

    def __getattr__(self, name: str) -> Any:
        # Called only for what the instance itself lacks: the overrides, then the shared config
        # (never for dunders, so copying and pickling see a plain object).
        state = vars(self)
        if name.startswith("__") or "_shared" not in state:
            raise AttributeError(name)
        if name in state["_overrides"]:
            return state["_overrides"][name]
        return getattr(state["_shared"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        state = vars(self)
        if name in state["_overrides"]:
            state["_overrides"][name] = value
        else:
            setattr(state["_shared"], name, value)

    def __repr__(self) -> str:
        return f"LayerConfig({type(vars(self)['_shared']).__name__}, {vars(self)['_overrides']})"


def shared_config(config: Any) -> Any:
    """The model's config behind ``config`` (``config`` itself if it is not a view)."""
    return vars(config)["_shared"] if isinstance(config, LayerConfig) else config


def layer_config(config: Any, **values: Any) -> Any:
    """The shared config behind ``config`` if it already holds ``values``, else a view of it
    overriding those that differ (see the module example)."""
    shared = shared_config(config)
    differ = {key: value for key, value in values.items() if getattr(shared, key, None) != value}
    return LayerConfig(shared, **differ) if differ else shared
