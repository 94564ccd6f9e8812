"""Datasets: JSONL rows in OpenAI's shape, loaded with line-numbered errors."""

from agentrft.data.jsonl import load_dataset

__all__ = ["load_dataset"]
