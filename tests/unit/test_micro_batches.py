"""How the update splits a step's rollouts into micro-batches (train/update.py): a group
that shares a prompt counts the prompt once and each row's own suffix; rows that share no
prompt run padded to the longest, so each counts as long as the longest."""

from __future__ import annotations

from agentrft.train.update import MIN_SHARED, Scored, micro_batches, shared_prefix


def row(tokens: list[int], group: int = 0) -> Scored:
    return Scored(tokens, [len(tokens) - 1], [0.0], 1.0, group=group)


def test_rows_without_a_shared_prompt_count_as_long_as_the_longest() -> None:
    # the first tokens differ, so nothing is shared and token_logprobs pads the rows
    items = [row([i, *range(100, 100 + n - 1)]) for i, n in enumerate((100, 60, 20))]
    assert shared_prefix(items) == 0
    # own lengths would sum to 180 (one batch); padded, the second row counts 100 and the
    # third would make 300
    assert micro_batches(items, max_tokens=200) == [[0, 1], [2]]
    assert micro_batches(items, max_tokens=300) == [[0, 1, 2]]


def test_a_prompt_shorter_than_the_sharing_minimum_is_not_shared() -> None:
    short = MIN_SHARED - 1
    items = [row([*range(short), 1000 + i, *range(2000, 2000 + n)]) for i, n in enumerate((80, 8))]
    assert shared_prefix(items) == 0
    longest = len(items[0].tokens)
    assert micro_batches(items, max_tokens=longest + len(items[1].tokens)) == [[0], [1]]
    assert micro_batches(items, max_tokens=2 * longest) == [[0, 1]]


def test_a_shared_prompt_counts_once_and_each_suffix_at_its_own_length() -> None:
    prompt = list(range(MIN_SHARED + 40))
    items = [
        row([*prompt, *range(5000 + 100 * i, 5000 + 100 * i + n)])
        for i, n in enumerate((50, 10, 10))
    ]
    p = shared_prefix(items)
    assert p == len(prompt)
    assert micro_batches(items, max_tokens=p + 70) == [[0, 1, 2]]
    assert micro_batches(items, max_tokens=p + 69) == [[0, 1], [2]]
    # groups never mix
    other = [row(it.tokens, group=1) for it in items]
    batches = micro_batches(items + other, max_tokens=10_000)
    assert sorted(map(sorted, batches)) == [[0, 1, 2], [3, 4, 5]]
