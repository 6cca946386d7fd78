"""Lottery-ticket pruning of a digits classifier from a plain PyTorch loop: no Lightning.

Five rounds of "train, prune 40% of the remaining weights, rewind the survivors to their initial
values, reset Adam" (Frankle & Carbin, 2019) end at 92.2% sparsity. Everything pruning does,
``Pruner`` does: the schedule, rewinding with its snapshot, seeded random draws and the
optimizer reset; the loop only calls ``pruner.step()`` after ``optimizer.step()``.

    python examples/plain_loop.py                                       # L1, rewind to init
    python examples/plain_loop.py --method random_unstructured --seed 1  # the random baseline
    python examples/plain_loop.py --rewind none                          # no lottery ticket
    python examples/plain_loop.py --steps 60 --hidden 16                 # a quick look
"""

import argparse

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

from tensorplay.ao.pruning import ExponentialSchedule, Pruner

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=1200, help="optimizer steps in all")
parser.add_argument("--hidden", type=int, default=256, help="width of the two hidden layers")
parser.add_argument("--method", default="l1_unstructured", help="or random_unstructured")
parser.add_argument("--rewind", default="init", choices=["none", "init", "step"])
parser.add_argument("--seed", type=int, default=0, help="initialisation, batches, random masks")
args = parser.parse_args()
torch.manual_seed(args.seed)

# scikit-learn ships the 1,797 8x8 digits: nothing is downloaded. The last 360 images are held
# out; pixels are scaled by their maximum grey level (16), so no statistics are needed.
digits = load_digits()
x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
y = torch.tensor(digits.target)
x_train, y_train, x_test, y_test = x[:-360], y[:-360], x[-360:], y[-360:]

model = nn.Sequential(
    nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden), nn.ReLU(),
    nn.Linear(args.hidden, 10),
)  # fmt: skip
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

# A round every sixth of the run, five rounds: each pruned network trains as long as the dense
# one did before the first round. 40% a round leaves 0.6**5 = 7.8% of the weights.
every = args.steps // 6
pruner = Pruner(
    model,
    ExponentialSchedule(rate=0.4, every=every, start_step=every, rounds=5),
    method=args.method,
    rewind=args.rewind,  # "init": the values now, before any training
    rewind_step=max(1, every // 4),  # for --rewind step: early training (Renda et al., 2020)
    seed=args.seed,  # random masks drawn from seed + step: the same on every run and rank
    optimizers=[optimizer],  # Adam's moments of the old weights mean nothing after a rewind
)

for step in range(1, args.steps + 1):
    batch = torch.randint(len(x_train), (64,))
    loss = F.cross_entropy(model(x_train[batch]), y_train[batch])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if pruner.step(step):  # units pruned: the pruner has rewound and reset Adam already
        print(f"step {step}: loss {loss.item():.3f}, sparsity {pruner.sparsity():.1%}")

model.eval()
with torch.no_grad():
    accuracy = (model(x_test).argmax(dim=1) == y_test).float().mean().item()
print(f"test accuracy {accuracy:.1%} at sparsity {pruner.sparsity():.1%}")
print(pruner.report())
