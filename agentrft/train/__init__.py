"""Training: group-relative advantages, the GRPO-family loss, LoRA updates, checkpoints.

`loop.py` is the readable top-to-bottom loop; the math (advantages.py, loss.py) is pure
tensor code with no I/O.
"""
