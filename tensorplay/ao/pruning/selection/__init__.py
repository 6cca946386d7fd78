"""Choosing the ``k`` lowest-scored units across many tensors, exactly, without concatenating.

The units of several tensors ("sources") compete for one budget: the ``k`` units with the lowest
*key* are pruned, among the units still *eligible* (those whose earlier mask is ``1``).

Tie rule:
    Units are ordered by ``(key, source index, flat index)``: among equal keys, a unit of an
    earlier source is pruned first, and within one source the lower flat (row-major) index.
    The rule does not depend on the device, the dtype layout or the chunk size.

Where the ``k``-th key is decided: :func:`~.cut.find_cut` (``cut.py``), for every caller, out
of place and in place, sharded or not. The streaming algorithm (no vector of all scores is
ever built):

1. **Guess a band** (``sample.py``). A seeded sample of keys (a private
   :class:`torch.Generator`, so the global RNG is untouched) gives two keys ``lo <= hi`` whose
   ranks bracket ``k`` with overwhelming probability. For uniform random keys the band follows
   from the quantile directly.
2. **One pass over the band** (``passes.py``). Each source is read once, in chunks small enough
   to stay in cache (``plan.py``: sources smaller than a chunk share one, so a thousand tiny
   tensors cost about what one tensor of their total size does), spread over the CPU threads
   in order (``threads.py``). Every chunk counts the eligible units below ``lo`` and gathers
   the few candidates in ``[lo, hi]`` (value and position). What the pass writes on the way is
   the caller's *scan* (``scans.py``): nothing; out of place, the speculative keep masks
   (``key >= lo``); in place, after a first pass that only counts, the units below ``lo``,
   which are then certainly pruned, cleared in the masks and zeroed in the weights.
3. **Resolve exactly** (``cut.resolve``). If ``count(below lo) < k <= count(below lo) +
   candidates``, the cut is the ``(k - count(below lo))``-th lowest candidate in the tie-rule
   order: a ``(key, order)`` pair, found by a radix selection of the candidates' bit patterns
   that reads them a block at a time and never joins them (``ranks.py``).
4. **Fallbacks, still exact** (``refine.py``, ``cut.cut_between``, ``cut.tie_cut``). A bad
   sample or a band swollen by ties falls back to counting passes over thresholds (the sampled
   quantiles, then a bisection of the keys' bit patterns, which for non-negative floats is
   monotone and converges in a few passes) until the interval is small enough to gather, or
   narrows to one value, whose tied units are counted per source to place the cut.
5. **Write** (``write.py``). If the band pass wrote the masks, the candidates at or below the
   cut are cleared (a few positions); otherwise one pass writes every mask at the cut.

Memory: the keep masks (which the caller needs anyway), three buffers of one chunk per device
and thread (keys, flags, scratch; ``buffers.py``), and the candidates (a small fraction of the
units). Counts are kept on the device and read once per pass.

Out of place (``masks.py``, :func:`keep_masks`): new keep masks, written by the band pass; one
read of every score when the band brackets the ``k``-th key.

In place (``clear.py``, :func:`clear_lowest`): the caller's bool keep masks are the
eligibility and the output, and the tensors given as ``zero`` (the weights) are multiplied by
the new masks in the same passes (``stream.py``): two reads of the scores, one write of the
masks and weights. A sample that misses costs passes, never exactness: ``lo`` too high, and
nothing is written before the cut is found by counting; a band too small or too big to
gather, and the rest is selected among the units left. Masks known to be all ``True``
(``n_eligible`` equal to every unit, as counted eight bytes at a time when not given) are not
read at all. No mask-sized temporary: memory beyond the masks is the chunk buffers and the
candidates.

Sharded (``sharding.py``, which also holds the one DTensor rule: :func:`is_dtensor`,
:func:`check_placement`): with a process group each rank passes its local pieces (FSDP2
``DTensor`` shards: ``Shard(0)`` on a 1-D mesh, uneven or empty; a replicated tensor is
refused, its units would count once per rank) and their :class:`ShardLayout`. The sample is
drawn over the full sources and gathered (every rank gets the band one process would), every
count is summed with one ``all_reduce`` of a small vector, the candidates stay on their ranks
and are narrowed by counting collectives until a few thousand are left, which are gathered; a
``k``-th key too tied to gather is resolved from every rank's per-source tie counts. Each rank
writes only its pieces; the masks are bit-identical to one process on the full tensors (ties
by the *global* flat index; random keys follow it too).
:class:`SelectionCost` reports the bytes and collectives.

Caps (``capped.py``): :func:`capped_keep_masks` gives no source more than its cap of units (the
greedy result: lowest key first, skipping sources at their cap), with a few uncapped selections;
:func:`clear_lowest_capped` the same in place (a few uncapped cuts, one writing pass).

Rows (``rows.py``, :func:`clear_lowest_per_row`): ``scope="row"``, each row of one tensor its
own group with its own exact count, the same keys and tie rule within the row.

Threads: the selection never changes a thread setting of the process (see ``threads.py``), so
it may run in several threads at once.
"""

from tensorplay.ao.pruning.selection.capped import SubsetKeys, capped_keep_masks, settle_caps
from tensorplay.ao.pruning.selection.checks import check_finite_scores, count_eligible
from tensorplay.ao.pruning.selection.clear import clear_lowest, clear_lowest_capped
from tensorplay.ao.pruning.selection.keys import AbsKeys, KeySpec, UniformKeys
from tensorplay.ao.pruning.selection.masks import keep_masks, multiply_in_place
from tensorplay.ao.pruning.selection.rows import clear_lowest_per_row
from tensorplay.ao.pruning.selection.sharding import (
    SelectionCost,
    ShardLayout,
    check_placement,
    global_counts,
    is_dtensor,
    local_part,
    shard_layout,
)

__all__ = [
    # keys: the order in which units are pruned
    "KeySpec",
    "AbsKeys",
    "UniformKeys",
    # the selection, and applying its keep factors
    "keep_masks",
    "multiply_in_place",
    # in place: clearing bits of bool keep masks, also across the ranks of a process group
    "clear_lowest",
    "clear_lowest_capped",
    # within each row of a tensor (scope="row")
    "clear_lowest_per_row",
    "SelectionCost",
    # sources sharded across ranks (FSDP2 DTensors)
    "ShardLayout",
    "shard_layout",
    "is_dtensor",
    "check_placement",
    "local_part",
    "global_counts",
    # under per-source caps (min_density)
    "capped_keep_masks",
    "settle_caps",
    "SubsetKeys",
    # what the inputs hold
    "count_eligible",
    "check_finite_scores",
]
