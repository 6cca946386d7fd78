"""The memory per rank and the bytes per pruning step of structured pruning under FSDP2, computed
from a Llama-style config (no model is built).

* :class:`LlamaShape`: the sizes that decide the counts (a Llama-3-8B shape: :data:`LLAMA3_8B`);
* :func:`parameters`, :func:`target_parameters`: every parameter, and those a ``"channel"`` or
  ``"head"`` pruner targets (the FFNs' or the attention's linear weights);
* :func:`bytes_per_step`: what one pruning step's ``all_reduce`` carries: 8 bytes (float64) per
  unit for each slice it spans, and 8 more (its squared score);
* :func:`memory_per_rank`: the bytes each of ``world`` ranks holds, item by item, for a student
  trained in mixed precision with AdamW (FSDP2: float32 sharded parameters, gradients and Adam
  moments, bfloat16 compute), its lean masks and, optionally, a bfloat16 teacher sharded like it
  (what a root holds, :func:`root_parameters`, is gathered for its whole forward).

Activations are not counted: they depend on the batch, the sequence and activation
checkpointing, not on pruning.

Example:
    >>> shape = LlamaShape(hidden=32, layers=3, intermediate=48, heads=4, kv_heads=2, vocab=97)
    >>> bytes_per_step(shape, "channel"), bytes_per_step(shape, "head")  # the tests' tiny Llama
    (4608, 240)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "LLAMA3_8B",
    "MemoryItem",
    "LlamaShape",
    "bytes_per_step",
    "layer_parameters",
    "memory_per_rank",
    "parameters",
    "root_parameters",
    "target_parameters",
]

Structure = Literal["channel", "head"]
GB = 1e9


@dataclass(frozen=True)
class LlamaShape:
    """The sizes of a Llama-style decoder (``LlamaConfig``'s fields, untied LM head, no biases).

    Args:
        hidden: ``hidden_size``.
        layers: ``num_hidden_layers``.
        intermediate: ``intermediate_size`` (the FFN's channels).
        heads: ``num_attention_heads``.
        kv_heads: ``num_key_value_heads`` (grouped-query attention: a head unit is one key/value
            head with its ``heads // kv_heads`` query heads).
        vocab: ``vocab_size``.

    Raises:
        ValueError: If a size is not a positive int, or ``heads`` is not a multiple of
            ``kv_heads`` or does not divide ``hidden``.

    Example:
        >>> LLAMA3_8B.head_dim, LLAMA3_8B.heads // LLAMA3_8B.kv_heads
        (128, 4)
    """

    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int

    def __post_init__(self) -> None:
        for name in ("hidden", "layers", "intermediate", "heads", "kv_heads", "vocab"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Expected `{name}` to be a positive int, but got {value!r}.")
        if self.heads % self.kv_heads or self.hidden % self.heads:
            raise ValueError(
                f"Expected `heads` to be a multiple of `kv_heads` and to divide `hidden`, but "
                f"got heads={self.heads}, kv_heads={self.kv_heads}, hidden={self.hidden}."
            )

    @property
    def head_dim(self) -> int:
        """``hidden // heads``."""
        return self.hidden // self.heads


LLAMA3_8B = LlamaShape(
    hidden=4096, layers=32, intermediate=14336, heads=32, kv_heads=8, vocab=128256
)


def layer_parameters(shape: LlamaShape) -> int:
    """One decoder layer's parameters: q, k, v, o, gate, up, down and two RMSNorms.

    Example:
        >>> layer_parameters(LLAMA3_8B)
        218112000
    """
    return target_parameters(shape) // shape.layers + 2 * shape.hidden


def target_parameters(shape: LlamaShape, structure: Structure | None = None) -> int:
    """The parameters a pruner of ``structure`` targets: a ``"channel"`` one the FFNs'
    ``gate_proj``, ``up_proj`` and ``down_proj`` weights, a ``"head"`` one the attention's q, k,
    v and o weights; ``None``: both (the embedding, the LM head and the norms are no targets).

    Example:
        >>> target_parameters(LLAMA3_8B, "channel"), target_parameters(LLAMA3_8B)
        (5637144576, 6979321856)
    """
    kv = shape.kv_heads * shape.head_dim
    attention = 2 * shape.hidden * shape.hidden + 2 * shape.hidden * kv
    ffn = 3 * shape.hidden * shape.intermediate
    per_layer = {"channel": ffn, "head": attention, None: ffn + attention}[structure]
    return shape.layers * per_layer


def parameters(shape: LlamaShape) -> int:
    """Every parameter: embedding and LM head (untied), the layers, the final norm.

    Example:
        >>> parameters(LLAMA3_8B)  # Llama-3-8B's count
        8030261248
    """
    return root_parameters(shape) + shape.layers * layer_parameters(shape)


def root_parameters(shape: LlamaShape) -> int:
    """The parameters ``fully_shard`` on the root holds when every decoder layer has its own:
    the embedding, the LM head and the final norm, gathered from the root's forward to its
    backward (a teacher's until tensorplay reshards it after the forward).

    Example:
        >>> root_parameters(LLAMA3_8B)
        1050677248
    """
    return 2 * shape.vocab * shape.hidden + shape.hidden


def bytes_per_step(shape: LlamaShape, structure: Structure) -> int:
    """The bytes one pruning step's ``all_reduce`` carries: per unit, a float64 for each slice it
    spans and one more. A channel spans 3 slices (``gate_proj``'s and ``up_proj``'s rows,
    ``down_proj``'s columns); a head (a key/value group) 4 (its rows of q, k and v, its columns
    of ``o_proj``).

    Raises:
        ValueError: If ``structure`` is neither ``"channel"`` nor ``"head"``.

    Example:
        >>> bytes_per_step(LLAMA3_8B, "channel"), bytes_per_step(LLAMA3_8B, "head")
        (14680064, 10240)
    """
    if structure == "channel":
        return shape.layers * shape.intermediate * (3 + 1) * 8
    if structure == "head":
        return shape.layers * shape.kv_heads * (4 + 1) * 8
    raise ValueError(f"Expected `structure` to be 'channel' or 'head', but got {structure!r}.")


@dataclass(frozen=True)
class MemoryItem:
    """One line of :func:`memory_per_rank`: what is held, how many bytes per what, and the bytes
    on each rank."""

    item: str
    rate: str
    bytes: int
    teacher_only: bool = False


def memory_per_rank(
    shape: LlamaShape, world: int, structure: Structure = "channel", embeddings_apart: bool = True
) -> list[MemoryItem]:
    """The bytes each of ``world`` ranks holds to prune ``shape`` under FSDP2 (``fully_shard``
    on every decoder layer and on the root, ``masking="inplace"``) while training it with AdamW
    in mixed precision (``MixedPrecisionPolicy(param_dtype=torch.bfloat16)``), and to distil it
    from a bfloat16 teacher (the items marked ``teacher_only``).

    What FSDP2 gathers, in bfloat16: during a forward, a decoder layer and the next (prefetched),
    or the LM head beside the last layer; a root stays gathered from its forward to its
    backward (a teacher's, which runs no backward, is resharded after its forward).

    Args:
        shape: The model.
        world: The ranks the model is sharded over.
        structure: The unit: which weights have masks, and the ``all_reduce`` payload.
        embeddings_apart: ``True``: ``fully_shard`` on the embedding and on the LM head too, so
            the root holds only the final norm; ``False``: the root holds them.

    Raises:
        ValueError: If ``world`` is not a positive int.

    Example:
        >>> items = memory_per_rank(LLAMA3_8B, 8)
        >>> [round(item.bytes / 1e9, 2) for item in items]  # GB: student, masks, ..., teacher
        [16.06, 0.7, 1.49, 0.01, 2.01, 1.49]
        >>> [round(item.bytes / 1e9, 2) for item in memory_per_rank(LLAMA3_8B, 8, "channel", False)]
        [16.06, 0.7, 2.97, 0.01, 2.01, 2.97]
    """
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise ValueError(f"Expected `world` to be a positive int, but got {world!r}.")
    total, targets = parameters(shape), target_parameters(shape, structure)
    layer, head = layer_parameters(shape), shape.vocab * shape.hidden
    if embeddings_apart:
        gathered = 2 * max(2 * layer, layer + head)
        where = "2 layers, or the LM head and a layer"
    else:
        gathered = 2 * (root_parameters(shape) + 2 * layer)
        where = "the root and 2 layers"
    return [
        MemoryItem(
            "student: float32 parameters, gradients, Adam moments",
            f"16 B/param / {world}",
            16 * total // world,
        ),
        MemoryItem("lean masks (bool)", f"1 B/target param / {world}", targets // world),
        MemoryItem("student: gathered in a forward (bfloat16, transient)", where, gathered),
        MemoryItem(
            "unit sums and scores (float64)",
            "the all_reduce payload",
            bytes_per_step(shape, structure),
        ),
        MemoryItem("teacher shard (bfloat16)", f"2 B/param / {world}", 2 * total // world, True),
        MemoryItem("teacher: gathered in a forward (bfloat16, transient)", where, gathered, True),
    ]
