"""where=: the expression language (parsed with ast, whitelisted, evaluated with pyarrow.compute) and
the per-shard masks that map kept ranks to stored rows."""

import numpy as np
import pyarrow as pa
import pytest

from shardkit.errors import ConfigError
from shardkit.reader.masks import AllRows, BitRows, DroppedRows, KeptRows, make_mask
from shardkit.reader.where import Where

TYPES = {"lang": "string", "lang_score": "float32", "gopher_quality": "bool", "chars": "int64",
         "near_dup_cluster": "int64"}


@pytest.fixture(scope="module")
def table():
    rng = np.random.default_rng(0)
    n = 500
    lang = rng.choice(["en", "de", "fr", None], n).tolist()
    score = [None if i % 17 == 0 else float(v) for i, v in enumerate(rng.random(n).round(3))]
    quality = [None if i % 23 == 0 else bool(v) for i, v in enumerate(rng.random(n) < 0.6)]
    chars = rng.integers(-5, 400, n).tolist()
    cluster = [None if v % 3 else int(v) for v in rng.integers(0, 40, n)]
    return pa.table({"lang": pa.array(lang, pa.string()), "lang_score": pa.array(score, pa.float32()),
                     "gopher_quality": pa.array(quality, pa.bool_()), "chars": pa.array(chars, pa.int64()),
                     "near_dup_cluster": pa.array(cluster, pa.int64())})


def rows(table):
    return table.to_pylist()


def f32(x):
    return None if x is None else float(np.float32(x))


# (expression, the same predicate in Python over one row: a comparison with None is False, and so is its negation)
CASES = [
    ("lang == 'en' and gopher_quality", lambda r: r["lang"] == "en" and r["gopher_quality"] is True),
    ("lang in ['en', 'de'] and lang_score >= 0.65",
     lambda r: r["lang"] in ("en", "de") and r["lang_score"] is not None and r["lang_score"] >= f32(0.65)),
    ("not gopher_quality", lambda r: r["gopher_quality"] is False),
    ("lang not in ('en',)", lambda r: r["lang"] is not None and r["lang"] != "en"),
    ("0 < chars <= 200", lambda r: 0 < r["chars"] <= 200),
    ("chars > -1 or lang == 'fr'", lambda r: r["chars"] > -1 or r["lang"] == "fr"),
    ("(lang == 'de' or lang == 'fr') and not (chars < 100)", lambda r: r["lang"] in ("de", "fr") and r["chars"] >= 100),
    ("near_dup_cluster == None", lambda r: r["near_dup_cluster"] is None),
    ("near_dup_cluster is not None and near_dup_cluster != 7", lambda r: r["near_dup_cluster"] not in (None, 7)),
    ("gopher_quality == False", lambda r: r["gopher_quality"] is False),
    ("lang >= 'en'", lambda r: r["lang"] is not None and r["lang"] >= "en"),
    ("chars in [1, 2, 3.0]", lambda r: r["chars"] in (1, 2, 3)),
    ("True", lambda r: True),
    ("lang in []", lambda r: False),
]


@pytest.mark.parametrize("expression, reference", CASES, ids=[c[0] for c in CASES])
def test_expressions_match_a_python_reference(table, expression, reference):
    got = Where(expression, TYPES).mask(table)
    assert got.dtype == bool and got.tolist() == [bool(reference(r)) for r in rows(table)]


def test_canonical_text_and_columns():
    w = Where("  lang=='en'   and(gopher_quality)", TYPES)
    assert w.text == "lang == 'en' and gopher_quality" and w.columns == ["lang", "gopher_quality"]
    assert Where('lang == "en" and gopher_quality', TYPES).text == w.text


@pytest.mark.parametrize("expression, says", [
    ("lang == 'en' and gopher", "no attribute column 'gopher'"),
    ("lang ==", "is not an expression shardkit reads"),
    ("__import__('os').system('true')", "is not allowed"),
    ("lang.upper() == 'EN'", "is not allowed"),
    ("chars + 1 > 2", "is not allowed"),
    ("chars", "is not a condition"),
    ("lang == 1", "compares a string with a number"),
    ("gopher_quality < True", "bools compare only with == and !="),
    ("chars in [1, 'a']", "literals of one kind"),
    ("chars in lang", "`in` takes a column on its left"),
    ("chars < None", "None is tested with"),
    ("[1] == chars", "a list goes only after `in`"),
    ("lambda: 1", "is not allowed"),
    ("", "expected a non-empty string"),
])
def test_bad_expressions_are_one_line_config_errors_naming_the_columns(expression, says):
    with pytest.raises(ConfigError) as e:
        Where(expression, TYPES)
    message = str(e.value)
    assert says in message and "\n" not in message
    assert "available columns: chars (int64), gopher_quality (bool), lang (string)" in message


def test_no_attributes_at_all_says_how_to_add_them():
    with pytest.raises(ConfigError, match=r"available columns: none \(add some with `shardkit annotate"):
        Where("lang == 'en'", {})


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 63, 64, 65, 1000, 4099, 65536, 65537, 70001])
@pytest.mark.parametrize("share", [0.0, 0.03, 0.45, 0.5, 0.55, 0.97, 1.0])
def test_masks_map_kept_ranks_to_rows_and_back(n, share):
    keep = np.random.default_rng(n).random(n) < share
    mask = make_mask(keep)
    rows = np.flatnonzero(keep)
    expected = (AllRows if len(rows) == n else BitRows if n > 65536 else KeptRows if 2 * len(rows) <= n
                else DroppedRows)
    assert type(mask) is expected and mask.kept == len(rows) and mask.size == n
    if len(rows):
        ranks = np.random.default_rng(1).permutation(len(rows))  # any order, as a shuffled batch asks
        assert np.array_equal(np.asarray(mask.rows(ranks), np.int64), rows[ranks])
    check = range(n) if n < 5000 else np.random.default_rng(2).integers(0, n, 300).tolist()
    for row in check:
        assert mask.rank(row) == (int(np.searchsorted(rows, row)) if keep[row] else None)


@pytest.mark.parametrize("share", [0.01, 0.2, 0.5, 0.8, 0.99])
@pytest.mark.parametrize("n", [10_000, 100_000])
def test_a_mask_takes_at_most_a_byte_per_row(n, share):
    mask = make_mask(np.random.default_rng(0).random(n) < share)
    assert mask.nbytes / n <= 1.0
    assert mask.nbytes / n <= (0.625 if n > 65536 else 2 * min(share, 1 - share) + 0.01)


def test_conditions_and_how_many_rows_pass_each(table):
    w = Where("(lang == 'en' or not gopher_quality) and chars > 100 and gopher_quality", TYPES)
    assert w.conditions() == ["lang == 'en'", "gopher_quality", "chars > 100"]
    got = w.passing(table)
    assert got == {"lang == 'en'": sum(r["lang"] == "en" for r in rows(table)),
                   "gopher_quality": sum(r["gopher_quality"] is True for r in rows(table)),
                   "chars > 100": sum(r["chars"] > 100 for r in rows(table))}
