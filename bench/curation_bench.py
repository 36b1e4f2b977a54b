"""Curation filters: agreement with datatrove 0.10.1 and speed per core, and language ID accuracy.

Documents: the text this machine already holds, cut into page-sized documents (blank-line
blocks joined to >= 2,000 characters, at most 40 per file), in a fixed order: package
documentation (READMEs, changelogs, copyright and license files, NEWS, Vim's help, man pages'
roff source, translated docs), then Python sources and their docs. That spans what a web crawl
holds and the four filters exist for: prose, lists and changelogs (bullet lines, short lines),
license boilerplate repeated from file to file (repetition), code and markup (symbols, curly
brackets, no terminal punctuation) and text in other languages.

The same documents go through datatrove's GopherQualityFilter, GopherRepetitionFilter,
C4QualityFilter and FineWebQualityFilter (in that order; C4 rewrites the text the next filter
sees, in both) in a separate venv (datatrove never enters shardkit's), and through shardkit's
`gopher-quality,gopher-repetition,c4,fineweb`. Each side runs in a fresh process per chunk,
timed by CPU seconds inside the process after a warm-up (one core each), chunks alternating
which side goes first. datatrove's filters are called directly (their `filter`, without the
pipeline's stats bookkeeping), which favours datatrove.

Language ID: every message catalog under /usr/share/locale (compiled .mo files of Debian's
packages: translations labelled by their folder's language); a document is 8 consecutive
translated messages of one catalog (>= 80 characters), at most 300 per language, for the
languages the model knows that have >= 50 such documents.

Usage:
    python bench/curation_bench.py --docs 60000 --datatrove-python /work/dt-venv/bin/python
    # the datatrove venv: python -m venv dt-venv && dt-venv/bin/pip install "datatrove[processing]==0.10.1" spacy
    # before/after: another checkout's filters interleaved with this one's, the filters only
    python bench/curation_bench.py --docs 12000 --chunks 4 --skip-lang --baseline /path/to/other/checkout
"""

from __future__ import annotations

import argparse
import gettext
import gzip
import json
import os
import subprocess
import sys
import time
from collections import Counter

PROSE_ROOTS = ["/usr/share/doc", "/usr/share/vim", "/usr/share/common-licenses", "/usr/share/man", "/usr/share/perl"]
CODE_ROOTS = [os.path.dirname(os.__file__), os.path.dirname(os.path.dirname(json.__file__)) + "/site-packages"]
NAMES = ("README", "copyright", "NEWS", "LICENSE", "AUTHORS", "THANKS", "TODO", "CHANGES", "changelog")
EXTS = (".txt", ".md", ".rst", ".gz", ".pod", ".html")


def _files(roots, exts):
    for root in roots:
        for folder, dirs, files in os.walk(root):
            dirs.sort()
            for name in sorted(files):
                if name.endswith(exts) or name in NAMES:
                    yield os.path.join(folder, name)


def _read(path: str) -> str | None:
    try:
        with (gzip.open(path) if path.endswith(".gz") else open(path, "rb")) as f:
            data = f.read(4_000_001)
        return None if len(data) > 4_000_000 else data.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
        return None


def _blocks(text: str):
    """Blank-line blocks, a long block cut at line ends into ~3,000-character pieces."""
    for block in text.split("\n\n"):
        if len(block) <= 6000:
            yield block
            continue
        acc, size = [], 0
        for line in block.split("\n"):
            acc.append(line)
            size += len(line)
            if size > 3000:
                yield "\n".join(acc)
                acc, size = [], 0
        if acc:
            yield "\n".join(acc)


def _documents(paths, limit: int, seen: set):
    n = 0
    for path in paths:
        text = _read(path)
        if not text or not text.strip():
            continue
        cur, size, per_file = [], 0, 0
        for block in list(_blocks(text)) + [None]:
            if block is not None:
                cur.append(block)
                size += len(block)
            if (block is None or size >= 2000) and cur:
                doc = "\n\n".join(cur).strip()
                cur, size = [], 0
                if doc and doc not in seen:
                    seen.add(doc)
                    yield path, doc
                    n, per_file = n + 1, per_file + 1
                    if n >= limit:
                        return
                if per_file >= 40:
                    break


def corpus(n: int, path: str) -> str:
    """Write (once) N documents as JSON lines: 70% from package docs, the rest from Python sources."""
    if os.path.exists(path):
        return path
    seen: set = set()
    prose = list(_documents(_files(PROSE_ROOTS, EXTS), int(n * 0.7), seen))
    code = list(_documents(_files(CODE_ROOTS, EXTS + (".py",)), n - len(prose), seen))
    with open(path + ".tmp", "w") as f:
        for src, doc in prose + code:
            f.write(json.dumps({"source": src, "text": doc}) + "\n")
    os.replace(path + ".tmp", path)
    return path


DATATROVE_CHILD = r"""
import json, sys, time
from datatrove.data import Document
from datatrove.pipeline.filters import (GopherQualityFilter, GopherRepetitionFilter, C4QualityFilter,
                                        FineWebQualityFilter)
path, lo, hi = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
docs = [json.loads(l)["text"] for i, l in enumerate(open(path)) if lo <= i < hi]
steps = [("gopher-quality", GopherQualityFilter()), ("gopher-repetition", GopherRepetitionFilter()),
         ("c4", C4QualityFilter()), ("fineweb", FineWebQualityFilter())]
def run(text):
    doc = Document(text=text, id="x")
    for name, f in steps:
        try:
            r = f.filter(doc)
        except Exception as e:
            return f"{name}:error:{type(e).__name__}"
        if r is not True and (r is False or not r[0]):
            return f"{name}:{r[1] if isinstance(r, tuple) else ''}"
    return "keep"
for t in docs[:200]: run(t)  # warm-up: spaCy's model and caches
t0 = time.process_time()
out = [run(t) for t in docs]
print(json.dumps({"cpu": time.process_time() - t0, "out": out}))
"""

SHARDKIT_CHILD = r"""
import json, sys, time
from shardkit.stages.filters import Curation
path, lo, hi = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
docs = [json.loads(l)["text"] for i, l in enumerate(open(path)) if lo <= i < hi]
cur = Curation.from_options("gopher-quality,gopher-repetition,c4,fineweb")
def run(text):
    _, rejected = cur.apply(text, {})
    return "keep" if rejected is None else f"{rejected[0]}:{rejected[1]}"
for t in docs[:200]: run(t)
t0 = time.process_time()
out = [run(t) for t in docs]
print(json.dumps({"cpu": time.process_time() - t0, "out": out}))
"""

# datatrove's reason for each rule -> shardkit's rule name
RULES = {"gopher_short_doc": "short_doc", "gopher_long_doc": "long_doc", "gopher_below_avg_threshold": "short_words",
         "gopher_above_avg_threshold": "long_words", "gopher_too_many_hashes": "hashes",
         "gopher_too_many_ellipsis": "ellipses", "gopher_too_many_bullets": "bullet_lines",
         "gopher_too_many_end_ellipsis": "ellipsis_lines", "gopher_below_alpha_threshold": "alpha_words",
         "gopher_enough_stop_words": "stop_words"}
RULES.update({f"duplicated_{n}_n_grams": f"dup_{n}_gram" for n in range(5, 11)})


def _normal(outcome: str) -> str:
    if outcome == "keep":
        return outcome
    name, _, rule = outcome.partition(":")
    return f"{name}:{RULES.get(rule, rule)}"


def _child(python: str, code: str, path: str, lo: int, hi: int, env=None) -> dict:
    # cwd outside any checkout: `python -c` puts the cwd first on sys.path, ahead of PYTHONPATH
    got = subprocess.run([python, "-c", code, path, str(lo), str(hi)], capture_output=True, text=True, env=env,
                         cwd=os.path.dirname(os.path.abspath(path)))
    if got.returncode:
        sys.exit(f"child failed ({python}):\n{got.stderr[-3000:]}")
    return json.loads(got.stdout.strip().splitlines()[-1])


def filters(path: str, n: int, dt_python: str, chunks: int, baseline: str | None = None) -> dict:
    """Both sides over the same documents, chunk by chunk, alternating which runs first; with a
    baseline (another shardkit checkout), its filters too, interleaved the same way."""
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ours, theirs, cpu = [], [], {"shardkit": 0.0, "datatrove": 0.0}
    base_out: list = []
    bounds = [n * i // chunks for i in range(chunks + 1)]
    for i, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        order = [("datatrove", dt_python, DATATROVE_CHILD, None), ("shardkit", sys.executable, SHARDKIT_CHILD, env)]
        if baseline:
            order.insert(1, ("baseline", sys.executable, SHARDKIT_CHILD, dict(os.environ, PYTHONPATH=baseline)))
            cpu.setdefault("baseline", 0.0)
        got = {}
        for side, python, code, e in (order if i % 2 == 0 else order[::-1]):
            got[side] = _child(python, code, path, lo, hi, e)
            cpu[side] += got[side]["cpu"]
        errors = Counter(o for o in got["datatrove"]["out"] if ":error:" in o)
        if sum(errors.values()) > 0.01 * (hi - lo):  # a missing extra (spaCy) fails every call: not a decision
            raise SystemExit(f"datatrove failed on {sum(errors.values())} of {hi - lo} documents ({dict(errors)}): "
                             f"its venv lacks what the filters need; `{dt_python} -m pip install 'datatrove[processing]' "
                             "spacy`, then run again")
        theirs += [_normal(o) for o in got["datatrove"]["out"]]
        ours += got["shardkit"]["out"]
        base_out += got.get("baseline", {}).get("out", [])
        print(f"  chunk {i + 1}/{chunks}: {hi - lo} docs, " + ", ".join(
            f"{side} {got[side]['cpu']:.1f} s" for side, *_ in order) + " CPU", flush=True)
    same = sum((a == "keep") == (b == "keep") for a, b in zip(ours, theirs))
    same_rule = sum(a == b for a, b in zip(ours, theirs))
    classes = Counter((b, a) for a, b in zip(ours, theirs) if (a == "keep") != (b == "keep"))
    examples = {}
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if (a == "keep") != (b == "keep"):
            examples.setdefault(f"{b} | {a}", i)
    return {"documents": n, "kept_datatrove": theirs.count("keep"), "kept_shardkit": ours.count("keep"),
            "same_decision": same / n, "same_rule": same_rule / n,
            "disagreements": {f"datatrove {b} / shardkit {a}": c for (b, a), c in classes.most_common()},
            "example_rows": examples, "cpu_seconds": cpu,
            "docs_per_cpu_second": {k: n / v for k, v in cpu.items()}, "speedup": cpu["datatrove"] / cpu["shardkit"],
            **({"speedup_baseline": cpu["datatrove"] / cpu["baseline"],
                "baseline_same_decisions": sum(a == b for a, b in zip(ours, base_out)) / n} if baseline else {}),
            "rules_datatrove": dict(Counter(theirs).most_common()), "rules_shardkit": dict(Counter(ours).most_common())}


def _iso(folder: str) -> str:
    return folder.split("@")[0].split("_")[0].split(".")[0]


def language_set(per_language: int = 300, messages: int = 8, min_docs: int = 50) -> list[tuple[str, str]]:
    """(language, text) from the machine's compiled message catalogs."""
    from shardkit.stages.filters.lang import known_languages

    known, by_lang = set(known_languages()), {}
    root = "/usr/share/locale"
    for folder in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        lang = _iso(folder)
        msgs_dir = os.path.join(root, folder, "LC_MESSAGES")
        if lang not in known or not os.path.isdir(msgs_dir) or lang == "en":
            continue
        docs = by_lang.setdefault(lang, [])
        for name in sorted(os.listdir(msgs_dir)):
            try:
                with open(os.path.join(msgs_dir, name), "rb") as f:
                    catalog = gettext.GNUTranslations(f)._catalog
            except (OSError, UnicodeDecodeError, ValueError, IndexError):  # a catalog Python's gettext cannot read
                continue
            # A message left untranslated (its msgstr a copy of the English msgid) carries no label.
            texts = [v for k, v in sorted(catalog.items(), key=lambda kv: str(kv[0]))
                     if k and isinstance(v, str) and v and v != (k[0] if isinstance(k, tuple) else k)]
            for i in range(0, len(texts) - messages + 1, messages):
                doc = "\n".join(texts[i:i + messages])
                if len(doc) >= 80 and len(docs) < per_language:
                    docs.append(doc)
    return [(lang, d) for lang, docs in sorted(by_lang.items()) if len(docs) >= min_docs for d in docs]


def language_id(threshold: float = 0.65) -> dict:
    from shardkit.stages.filters.lang import Lang, identifier

    labelled = language_set()
    f = Lang(threshold=threshold)
    identifier()
    t0 = time.process_time()
    got = [f.score(text)["lang"] for _, text in labelled]
    cpu = time.process_time() - t0
    right = sum(g == lang for g, (lang, _) in zip(got, labelled))
    per = Counter(lang for lang, _ in labelled)
    wrong = Counter(lang for g, (lang, _) in zip(got, labelled) if g != lang)
    chars = sum(len(t) for _, t in labelled)
    return {"documents": len(labelled), "languages": len(per), "accuracy": right / len(labelled),
            "worst_languages_accuracy": dict(sorted(((k, round(1 - v / per[k], 3)) for k, v in wrong.items()),
                                                    key=lambda kv: kv[1])[:8]),
            "docs_per_cpu_second": len(labelled) / cpu, "chars_per_cpu_second": chars / cpu}


CANDIDATES_CHILD = r"""
import json, sys, time
data = json.load(open(sys.argv[1]))
out = {}
try:
    import pycld2
    def cld2(t):
        try:
            ok, _, details = pycld2.detect(t)
        except pycld2.error:  # control characters it refuses
            return "un"
        return details[0][1] if ok else "un"
    out["pycld2"] = cld2
except ImportError:
    pass
try:
    from langdetect import DetectorFactory, detect
    DetectorFactory.seed = 0
    def ld(t):
        try:
            return detect(t).split("-")[0]
        except Exception:
            return "un"
    out["langdetect"] = ld
except ImportError:
    pass
res = {}
for name, fn in out.items():
    fn(data[0][1])
    t0 = time.process_time()
    got = [fn(t) for _, t in data]
    cpu = time.process_time() - t0
    # only the languages this candidate can name count against it (the others are left out)
    names = set(got)
    scored = [(g, lang) for g, (lang, _) in zip(got, data) if lang in names]
    res[name] = {"accuracy_on_languages_it_names": sum(g == l for g, l in scored) / max(1, len(scored)),
                 "documents": len(scored), "docs_per_cpu_second": len(data) / cpu}
print(json.dumps(res))
"""


def candidates(python: str, cache: str) -> dict:
    """Other packaged language-ID models on the same set, in the bench venv (where installed)."""
    path = os.path.join(cache, "lang-set.json")
    with open(path, "w") as f:
        json.dump(language_set(), f)
    got = subprocess.run([python, "-c", CANDIDATES_CHILD, path], capture_output=True, text=True)
    return json.loads(got.stdout.strip().splitlines()[-1]) if got.returncode == 0 else {"error": got.stderr[-500:]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=60_000)
    ap.add_argument("--chunks", type=int, default=6)
    ap.add_argument("--datatrove-python", default="/work/dt-venv/bin/python")
    ap.add_argument("--cache", default="/tmp/shardkit-curation-bench")
    ap.add_argument("--out", default=None, help="write the figures here as JSON")
    ap.add_argument("--baseline", default=None, help="another shardkit checkout: its filters run too, interleaved")
    ap.add_argument("--skip-lang", action="store_true", help="the filters only (no language-ID part)")
    args = ap.parse_args()
    os.makedirs(args.cache, exist_ok=True)
    path = corpus(args.docs, os.path.join(args.cache, f"docs-{args.docs}.jsonl"))
    n = sum(1 for _ in open(path))
    print(f"{n} documents in {path} (load: {os.getloadavg()[0]:.1f})", flush=True)
    result = {} if args.skip_lang else {"lang": language_id(),
                                        "lang_candidates": candidates(args.datatrove_python, args.cache)}
    print(json.dumps(result, indent=1), flush=True)
    result["filters"] = filters(path, n, args.datatrove_python, args.chunks, args.baseline)
    result["load"] = os.getloadavg()
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
