"""Loading a folder saved with its units masked, masks and all, to shrink it later.

A Hugging Face model pruned with lean masks (``masking="inplace"``) saves its masks with its
weights: ``save_pretrained`` writes each ``<name>_mask`` (bool) beside ``<name>``, whose pruned
entries are zero, and its config holds the unit groups the pruner masked
(:mod:`~tensorplay.ao.pruning.structured.dependency.recorded`). That is what a sharded run saves
when its full state is gathered (the Hugging Face ``Trainer`` under FSDP2, or
``get_model_state_dict(..., full_state_dict=True)`` and ``save_pretrained``). ``from_pretrained``
drops the masks (no module has such buffers). :func:`load_masked` loads the folder and installs them
again, so that :func:`~tensorplay.ao.pruning.shrink` removes exactly the units that were masked, in
the groups that were recorded: nothing is inferred from zeros, on a machine without a GPU.

Example:
    >>> import tempfile
    >>> import torch
    >>> import transformers
    >>> from tensorplay.ao.pruning import Pruner, shrink
    >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
    >>> config = transformers.LlamaConfig(
    ...     vocab_size=16, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
    ...     num_attention_heads=4, num_key_value_heads=2)
    >>> model = transformers.LlamaForCausalLM(config)
    >>> _ = Pruner(model, OneShotSchedule(0.5), structure="channel", scope="layerwise",
    ...            masking="inplace").step(0)
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     model.save_pretrained(folder)
    ...     loaded = load_masked(transformers.LlamaForCausalLM, folder)
    >>> loaded.model.layers[0].mlp.up_proj.weight_mask.sum(0)[:4].tolist()  # 12 of 24 rows kept
    [12, 12, 12, 12]
    >>> shrink(loaded).config, loaded.config.intermediate_size
    ('uniform', 12)
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.edits import changes
from tensorplay.ao.pruning.masking.lean_masks import MASK_SUFFIX, install_mask
from tensorplay.ao.pruning.parity.aliases import alias_map

__all__ = ["install_saved_masks", "load_masked", "saved_masks"]

_SAFETENSORS_INDEX = "model.safetensors.index.json"
_SAFETENSORS = "model.safetensors"
_BIN_INDEX = "pytorch_model.bin.index.json"
_BIN = "pytorch_model.bin"


def load_masked(model_class: Any, directory: str | os.PathLike[str], **kwargs: Any) -> Any:
    """``model_class.from_pretrained(directory, **kwargs)`` with the lean masks the folder
    holds installed again (see the module docstring).

    Args:
        model_class: A Hugging Face model class or auto class (tensorplay does not import
            ``transformers`` itself).
        directory: A folder ``save_pretrained`` wrote from a model with lean masks.
        **kwargs: Passed to ``from_pretrained``.

    Returns:
        The model, each saved mask its parameter's ``<name>_mask`` buffer.

    Raises:
        ValueError: The folder holds no mask; a mask names no parameter of the model, or has
            another shape, or is not bool; a pruned entry is not zero in the loaded weights
            (the weights were changed after the masks were saved): each named.

    Example:
        See the module docstring.
    """
    masks = saved_masks(directory)
    if not masks:
        raise ValueError(
            f"Expected `<name>{MASK_SUFFIX}` tensors in {os.fspath(directory)!r} (a model saved "
            "with masking='inplace'), but it holds none: load it with from_pretrained and "
            "shrink it by its zeros (tensorplay.ao.pruning.shrink)."
        )
    model = model_class.from_pretrained(directory, **kwargs)
    install_saved_masks(model, masks)
    return model


@changes.atomic
def install_saved_masks(model: nn.Module, state_dict: Mapping[str, Tensor]) -> int:
    """Install the ``<name>_mask`` entries of ``state_dict`` (a saved state of a model pruned
    with lean masks, its weights already loaded into ``model``) as the lean masks of ``model``,
    after checking them all; other entries are ignored. How a full state saved from a sharded
    run (a distributed checkpoint converted with
    ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save``) gets its masks back.

    Returns:
        The number of masks installed.

    Raises:
        ValueError: As :func:`load_masked`, before any mask is installed.

    Example:
        >>> layer = nn.Linear(2, 2)
        >>> with torch.no_grad():
        ...     _ = layer.weight.fill_(1.0).__setitem__((0, 0), 0.0)
        >>> mask = torch.tensor([[False, True], [True, True]])
        >>> install_saved_masks(layer, {"weight": layer.weight, "weight_mask": mask})
        1
        >>> layer.weight_mask.tolist()
        [[False, True], [True, True]]
    """
    aliases = alias_map(model)
    masks = {key: value for key, value in state_dict.items() if key.endswith(MASK_SUFFIX)}
    for key, mask in masks.items():
        _check_mask(aliases, key.removesuffix(MASK_SUFFIX), mask)
    for key, mask in masks.items():
        tied = aliases[key.removesuffix(MASK_SUFFIX)]
        install_mask(tied.pairs, mask.to(tied.parameter.device))
    return len(masks)


def _check_mask(aliases: Any, name: str, mask: Tensor) -> None:
    if name not in aliases:
        raise ValueError(
            f"Expected each saved mask to belong to a parameter of the model, but "
            f"{name + MASK_SUFFIX!r} has no parameter {name!r}."
        )
    param = aliases[name].parameter
    if mask.dtype != torch.bool or mask.shape != param.shape:
        raise ValueError(
            f"Expected {name + MASK_SUFFIX!r} to be a bool mask of {name!r}'s shape "
            f"{tuple(param.shape)}, but it is {mask.dtype} of shape {tuple(mask.shape)}."
        )
    with torch.no_grad():
        revived = int((param.detach()[~mask.to(param.device)] != 0).sum())
    if revived:
        raise ValueError(
            f"Expected the pruned entries of {name!r} to be zero, as its saved mask says, but "
            f"{revived} are not: the weights were changed after the masks were saved."
        )


def saved_masks(directory: str | os.PathLike[str]) -> dict[str, Tensor]:
    """The ``<name>_mask`` tensors of a Hugging Face folder (``model.safetensors``, sharded
    or not, or ``pytorch_model.bin``), reading nothing else.

    Example:
        >>> import tempfile
        >>> from safetensors.torch import save_file
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     save_file({"w": torch.ones(2), "w_mask": torch.ones(2, dtype=torch.bool)},
        ...               f"{folder}/model.safetensors")
        ...     sorted(saved_masks(folder))
        ['w_mask']
    """
    folder = Path(directory)
    for index_name, single in ((_SAFETENSORS_INDEX, _SAFETENSORS), (_BIN_INDEX, _BIN)):
        files = _weight_files(folder, index_name, single)
        if files:
            masks: dict[str, Tensor] = {}
            for path in files:
                masks.update(_masks_in(path))
            return masks
    raise ValueError(
        f"Expected a Hugging Face model folder ({_SAFETENSORS}, {_SAFETENSORS_INDEX}, {_BIN} or "
        f"{_BIN_INDEX}) at {os.fspath(directory)!r}, but found none of them."
    )


def _weight_files(folder: Path, index_name: str, single: str) -> list[Path]:
    index = folder / index_name
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [folder / name for name in dict.fromkeys(weight_map.values())]
    return [folder / single] if (folder / single).is_file() else []


def _masks_in(path: Path) -> dict[str, Tensor]:
    if path.suffix == ".safetensors":
        from safetensors import safe_open  # installed with transformers

        with safe_open(os.fspath(path), framework="pt") as weights:
            names = [key for key in weights.keys() if key.endswith(MASK_SUFFIX)]  # noqa: SIM118
            return {key: weights.get_tensor(key) for key in names}
    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    return {key: value for key, value in state.items() if key.endswith(MASK_SUFFIX)}
