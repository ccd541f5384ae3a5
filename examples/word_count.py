"""Count words and keep each word's running count, on an embedded two-worker Dask cluster.

Run: python examples/word_count.py
"""
from __future__ import annotations

from collections import Counter

import pandas as pd
from streamz import Stream

import streamlb

TEXT = """the quick brown fox jumps over the lazy dog the dog sleeps and the fox runs""".split()


def running_count(count, record):
    """Per-key state: how many times this word was seen so far."""
    count = (count or 0) + 1
    return count, f"{record['word']}#{count}"


def main() -> None:
    source = Stream.from_iterable([{"word": w, "position": i} for i, w in enumerate(TEXT)])
    source.key_by("word").aggregate(
        {"count": ("position", "count"), "first": ("position", "min")}, name="words"
    )
    labels = source.key_by("word").stateful_map(running_count, name="labels").sink_to_list()

    with streamlb.run(source, n_workers=2, batch_size=4) as job:
        job.wait(timeout=120)
        counts = job.state("words")

    print(counts.sort_values("count", ascending=False).head())
    assert counts["count"].to_dict() == dict(Counter(TEXT))
    emitted = pd.concat(labels)["output"].tolist()
    assert sorted(emitted) == sorted(f"{w}#{n}" for w, c in Counter(TEXT).items() for n in range(1, c + 1))
    print(f"{len(emitted)} running-count labels, e.g. {emitted[:4]}")


if __name__ == "__main__":
    main()
