"""``tensorplay.callbacks.transformers`` imports, and trains, where Lightning cannot be imported."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = textwrap.dedent(
    """
    import sys

    BLOCKED = ("lightning", "lightning_fabric", "pytorch_lightning", "torchmetrics")

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{name} is blocked in this test")
            return None

    sys.meta_path.insert(0, Block())
    try:
        import lightning
    except ImportError:
        pass
    else:
        raise SystemExit("lightning was not blocked")

    import tensorplay.callbacks
    from tensorplay.callbacks.transformers.gradual_pruning_callback import GradualPruningCallback
    from tensorplay.callbacks import GradualPruningCallback as again
    from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
    from tests.callbacks.hf_trainer_helpers import make_trainer
    from tests.hf_models import tiny_gpt2
    import tempfile, pathlib

    assert again is GradualPruningCallback
    callback = GradualPruningCallback(OneShotSchedule(0.5, step=1), verbose=False)
    with tempfile.TemporaryDirectory() as out:
        make_trainer(tiny_gpt2().train(), pathlib.Path(out), [callback], max_steps=2).train()
    assert callback.pruner.pruned_count() == round(0.5 * callback.pruner.total_count())
    try:
        from tensorplay.callbacks import GradualPruning
    except ImportError as error:
        assert "lightning" in str(error), error
    else:
        raise SystemExit("the Lightning callback imported without Lightning")
    # The Trainer example needs no Lightning either.
    import importlib.util
    spec = importlib.util.spec_from_file_location("example", "examples/lm/train_trainer.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.schedule_for(600).end_step == 400
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    assert not loaded, loaded
    print("trainer callback ok without lightning")
    """
)


@pytest.mark.slow
def test_the_trainer_callback_needs_no_lightning() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trainer callback ok without lightning" in done.stdout
