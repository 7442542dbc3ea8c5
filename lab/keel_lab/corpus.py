"""A deterministic text corpus for the search suite: pseudo-words with a Zipf-like
frequency distribution, written as Sphinx tsvpipe input (id, gid, title, body)."""
from __future__ import annotations

import itertools
import random
from pathlib import Path

# Bump when the generated text changes (cached corpora carry it in their name).
CORPUS_VERSION = 1

_ONSETS = ["", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v",
           "w", "z", "br", "ch", "cl", "dr", "fl", "gr", "pl", "pr", "sh", "st", "th", "tr"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "ie", "oo", "ou"]
_CODAS = ["", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ck", "ng"]


def vocabulary(size: int, seed: int = 1) -> list[str]:
    """`size` distinct pseudo-words, shortest first-ish (frequent words are short, as in
    real text). Deterministic for a given seed."""
    rng = random.Random(seed)
    syll = sorted({o + v + c for o, v, c in itertools.product(_ONSETS, _VOWELS, _CODAS)})
    rng.shuffle(syll)
    words: list[str] = []
    seen: set[str] = set()
    k, fails = 1, 0
    while len(words) < size:
        # short words first; more syllables once the short ones run out
        k = max(k, 1 + min(3, 4 * len(words) // size))
        w = "".join(rng.choice(syll) for _ in range(k))
        if w in seen or len(w) < 2:
            fails += 1
            if fails > 200:
                k, fails = k + 1, 0
            continue
        fails = 0
        seen.add(w)
        words.append(w)
    return words[:size]


def zipf_cum_weights(n: int, s: float = 1.07) -> list[float]:
    acc, out = 0.0, []
    for r in range(1, n + 1):
        acc += 1.0 / r ** s
        out.append(acc)
    return out


class Corpus:
    """Documents i = 1..ndocs: gid in [1, 1000], a title of 3-10 words and a body of
    `body_min`-`body_max` words drawn from a Zipf(1.07) vocabulary of `vocab` words."""

    def __init__(self, ndocs: int, vocab: int = 60000, seed: int = 20240601,
                 body_min: int = 20, body_max: int = 120):
        self.ndocs = ndocs
        self.seed = seed
        self.words = vocabulary(vocab, seed)
        self.cum = zipf_cum_weights(vocab)
        self.body_min, self.body_max = body_min, body_max

    def write_tsv(self, path: Path) -> int:
        """Writes the corpus; returns its size in bytes."""
        rng = random.Random(self.seed)
        words, cum = self.words, self.cum
        choices = rng.choices
        size = 0
        with open(path, "w", encoding="ascii", newline="\n") as f:
            buf = []
            for i in range(1, self.ndocs + 1):
                nt = rng.randint(3, 10)
                nb = rng.randint(self.body_min, self.body_max)
                ws = choices(words, cum_weights=cum, k=nt + nb)
                buf.append(f"{i}\t{rng.randint(1, 1000)}\t{' '.join(ws[:nt])}\t{' '.join(ws[nt:])}\n")
                if len(buf) >= 2000:
                    chunk = "".join(buf)
                    size += len(chunk)
                    f.write(chunk)
                    buf.clear()
            chunk = "".join(buf)
            size += len(chunk)
            f.write(chunk)
        return size

    def queries(self, n: int = 200, seed: int = 7) -> list[str]:
        """A fixed mix of SphinxQL queries against index `idx`: single terms, AND, OR
        with grouping, phrases, field-limited, sorted by attribute. Terms come from
        frequent (rank 5-100), common (100-2000) and rarer (2000-20000) words."""
        rng = random.Random(seed)
        w = self.words
        top = min(len(w), 20000)

        def term(kind: str) -> str:
            lo, hi = {"freq": (5, 100), "common": (100, 2000), "rare": (2000, top)}[kind]
            return w[rng.randrange(min(lo, top - 1), min(hi, top))]

        kinds = [
            lambda: f"SELECT id, gid FROM idx WHERE MATCH('{term('common')}') LIMIT 20",
            lambda: f"SELECT id, gid FROM idx WHERE MATCH('{term('rare')}') LIMIT 20",
            lambda: f"SELECT id FROM idx WHERE MATCH('{term('freq')} {term('common')}') LIMIT 20",
            lambda: (f"SELECT id FROM idx WHERE MATCH('{term('common')} {term('common')}') "
                     f"ORDER BY gid DESC LIMIT 50"),
            lambda: (f"SELECT gid, COUNT(*) c FROM idx WHERE MATCH('{term('common')} | "
                     f"{term('rare')} | {term('rare')}') GROUP BY gid ORDER BY c DESC LIMIT 10"),
            lambda: f"SELECT id FROM idx WHERE MATCH('\"{term('freq')} {term('freq')}\"') LIMIT 20",
            lambda: f"SELECT id FROM idx WHERE MATCH('@title {term('common')}') LIMIT 20",
            lambda: (f"SELECT id, WEIGHT() w FROM idx WHERE MATCH('{term('freq')} -{term('common')}') "
                     f"LIMIT 20 OPTION ranker=bm25"),
        ]
        return [kinds[i % len(kinds)]() for i in range(n)]
