"""Shrinking: removing pruned units physically, so the model is smaller and faster.

:func:`~tensorplay.ao.pruning.structured.shrinking.shrink.shrink` reads the model once
(:mod:`.reading`): which units are masked (the groups a structured pruner recorded, then the
dependency graph's); it cuts them from every tensor they span (:mod:`.removal`, :mod:`.resize`),
brings a Hugging Face config in line (:mod:`.hf_config`) and reports what it did
(:mod:`.shrink_report`); :mod:`.reshape` builds a fresh model at a shrunk one's widths so its
checkpoint loads. A model sharded with FSDP2 is shrunk in a copy gathered on rank 0
(:mod:`.gathered`); a folder saved with its units masked loads with its masks (:mod:`.saved_masks`)
to be shrunk later.
"""
