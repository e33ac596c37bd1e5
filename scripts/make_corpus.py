"""Regenerate src/latencylab/workloads/data/corpus.txt (the text workload's inputs).

Real English prose, offline: the docstrings of CPython's standard library,
cut into a realistic mix of lengths for a sentence-embedding service:
short search queries, single sentences and multi-sentence passages.
Deterministic for a given Python version; the shipped file is the reference.

    python scripts/make_corpus.py > src/latencylab/workloads/data/corpus.txt
"""

from __future__ import annotations

import importlib
import inspect
import random
import re
import sys

MODULES = [
    "argparse",
    "asyncio",
    "collections",
    "concurrent.futures",
    "contextlib",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "email",
    "enum",
    "fractions",
    "functools",
    "heapq",
    "http.client",
    "inspect",
    "ipaddress",
    "itertools",
    "json",
    "logging",
    "mailbox",
    "multiprocessing",
    "os",
    "pathlib",
    "pickle",
    "queue",
    "random",
    "re",
    "selectors",
    "shutil",
    "socket",
    "sqlite3",
    "statistics",
    "string",
    "subprocess",
    "tarfile",
    "textwrap",
    "threading",
    "typing",
    "unittest",
    "urllib.parse",
    "uuid",
    "zipfile",
]


def sentences() -> list[str]:
    out: list[str] = []
    for name in MODULES:
        mod = importlib.import_module(name)
        docs = [inspect.getdoc(mod) or ""]
        for _, obj in sorted(vars(mod).items()):
            if (inspect.isfunction(obj) or inspect.isclass(obj)) and getattr(obj, "__module__", "") == name:
                docs.append(inspect.getdoc(obj) or "")
        for doc in docs:
            for para in re.split(r"\n\s*\n", doc):
                text = " ".join(para.split())
                if not text or ">>>" in text or text.count("(") > 3 or not text[0].isupper():
                    continue
                out += [s for s in re.split(r"(?<=[.!?])\s+", text) if 25 <= len(s) <= 400 and " " in s]
    return sorted(set(out))


def main() -> None:
    rng = random.Random(20261130)
    pool = sentences()
    rng.shuffle(pool)
    lines: list[str] = []
    i = 0
    while i < len(pool) and len(lines) < 600:
        r = rng.random()
        if r < 0.3:  # a search query: a few words of a sentence
            words = pool[i].rstrip(".").split()
            lines.append(" ".join(words[: rng.randint(3, 8)]))
            i += 1
        elif r < 0.75:  # one sentence
            lines.append(pool[i])
            i += 1
        else:  # a passage of 3-9 sentences
            k = rng.randint(3, 9)
            lines.append(" ".join(pool[i : i + k]))
            i += k
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
