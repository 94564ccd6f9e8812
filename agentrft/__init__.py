"""agentrft: open, self-hosted Agent Reinforcement Fine-Tuning."""

__version__ = "0.1.0"
