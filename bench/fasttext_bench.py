"""fastText scoring: shardkit's `fasttext` scorer against the binding's own predict loop, per core.

A supervised model is trained here with the installed binding (nothing downloaded: two labels over
generated text, dim 64, word bigrams), then, in one process on one core, interleaved repeats of:

  A. the binding's own loop: `model.predict(text.replace("\\n", " "), k=-1)` per document
     (fastText predicts one line; datatrove's FastTextClassifierFilter does the same replace);
  B. shardkit's scorer: `FastText.check(text)` (score + verdict) per document, what `build
     --filter fasttext` runs per sample;
  C. the whole curation stage: `stages.filters.curate` over Samples (decode, counts, verdict).

It prints docs/s of each and the ratios B/A and C/A (the target: >= 0.8), the model's load time,
and whether the binding's `predict` works under this numpy (old bindings call np.array(copy=False),
which numpy 2 refuses). To compare bindings, install each into its own folder and put it first:
    pip install --no-deps --target /tmp/ft-b fasttext-numpy2-wheel
    PYTHONPATH=/tmp/ft-b:. python bench/fasttext_bench.py --binding-only

Usage:
    PYTHONPATH=. python bench/fasttext_bench.py --docs 20000 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time

GOOD = ("the river runs past the old mill and turns toward the quiet valley where farmers grow wheat and "
        "barley for many generations while children look after the school garden near the bridge").split()
BAD = "buy cheap casino now free bonus win click deal offer limited prize subscribe today best price".split()


def _doc(rng: random.Random, words: list, n: int) -> str:
    lines = [" ".join(rng.choice(words) for _ in range(12)) + "." for _ in range(max(1, n // 12))]
    return "\n".join(lines)


def train(folder: str) -> str:
    import fasttext

    rng = random.Random(0)
    path = os.path.join(folder, "train.txt")
    with open(path, "w") as f:
        for _ in range(3000):
            f.write(f"__label__hq {_doc(rng, GOOD, 60).replace(chr(10), ' ')}\n")
            f.write(f"__label__lq {_doc(rng, BAD, 60).replace(chr(10), ' ')}\n")
    model = os.path.join(folder, "quality.bin")
    for _ in range(20):  # the binding's "Encountered NaN" race on small corpora (see tests/test_fasttext.py)
        try:
            fasttext.train_supervised(input=path, epoch=5, dim=64, wordNgrams=2, minCount=1, thread=1, verbose=0,
                                      bucket=200_000).save_model(model)
            return model
        except RuntimeError as e:
            if "NaN" not in str(e):
                raise
    raise RuntimeError("training raised NaN 20 times")


def documents(n: int) -> list[str]:
    """Page-sized documents (~300 words) mixing the two vocabularies in every proportion."""
    rng = random.Random(1)
    return [_doc(rng, GOOD * (i % 5) + BAD * (4 - i % 5) + GOOD, 300) for i in range(n)]


def binding(model_path: str, docs: list[str]) -> None:
    import fasttext
    import numpy

    start = time.perf_counter()
    m = fasttext.load_model(model_path)
    load = time.perf_counter() - start
    try:
        m.predict(docs[0].replace("\n", " "), k=-1)
        works = "works"
    except ValueError as e:
        works = f"FAILS ({str(e).splitlines()[0]})"
    print(f"binding {fasttext.__file__}: numpy {numpy.__version__}, load {load * 1000:.1f} ms, predict {works}")
    if works == "works":
        start = time.process_time()
        for t in docs:
            m.predict(t.replace("\n", " "), k=-1)
        print(f"  predict loop {len(docs) / (time.process_time() - start):,.0f} docs/s per core")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--binding-only", action="store_true", help="load time and predict loop of the binding alone")
    args = ap.parse_args()
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    folder = tempfile.mkdtemp(prefix="ft-bench-")
    model_path = train(folder)
    docs = documents(args.docs)
    binding(model_path, docs)
    if args.binding_only:
        return
    from shardkit.sample import Sample
    from shardkit.stages.filters import Curation, curate
    from shardkit.stages.filters.classifier import model

    opts = (f"fasttext.model={model_path},fasttext.label=__label__hq,fasttext.threshold=0.5",)
    curation = Curation.from_options("fasttext", opts)
    scorer, m = curation.steps[0], model(model_path)
    encoded = [t.encode() for t in docs]

    def a():
        for t in docs:
            m.predict(t.replace("\n", " "), k=-1)

    def b():
        for t in docs:
            scorer.check(t)

    def c():
        stats: dict = {}
        for _ in curate((Sample(str(i), {"txt": v}) for i, v in enumerate(encoded)), curation=curation,
                        stats=stats, dropped=[]):
            pass

    times = {"A": [], "B": [], "C": []}
    for r in range(args.repeats):
        order = [("A", a), ("B", b), ("C", c)] if r % 2 == 0 else [("C", c), ("B", b), ("A", a)]
        for name, fn in order:
            start = time.process_time()
            fn()
            times[name].append(time.process_time() - start)
    best = {k: min(v) for k, v in times.items()}
    for name, label in (("A", "binding's predict loop"), ("B", "shardkit FastText.check"),
                        ("C", "shardkit curate stage")):
        print(f"{label:<26} {len(docs) / best[name]:>10,.0f} docs/s per core (best of {args.repeats})")
    print(f"ratio B/A {best['A'] / best['B']:.3f}   C/A {best['A'] / best['C']:.3f}   (target >= 0.8)")


if __name__ == "__main__":
    main()
