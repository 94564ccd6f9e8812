"""How one job seed becomes the seeds of every draw, so that a run replays exactly: each
constant is a stride or an offset that keeps two kinds of draws from sharing a seed.

    a reply of a rollout      rollout seed + TURN_STRIDE * turn          (rollout/episode.py)
    the epoch's row order     job seed * EPOCH_STRIDE + epoch            (train/loop.py)
    a training step's rollouts job seed * STEP_STRIDE + step             (train/loop.py)
    the in-loop evaluation    job seed + EVAL_OFFSET + step              (train/loop.py)
"""

TURN_STRIDE = 7919  # a prime, so the turns of neighbouring rollouts' seeds do not collide
EPOCH_STRIDE = 7919
STEP_STRIDE = 100_003  # a prime above any row count times samples per row in one step
EVAL_OFFSET = 1_000_000  # evaluation draws stay clear of the training steps' seeds
