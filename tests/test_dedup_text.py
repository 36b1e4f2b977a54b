"""Text dedup core: normalisation, shingles, datasketch-equal MinHash, LSH, union-find, planted pairs."""

import functools

import numpy as np
import pytest
from datasketch import LeanMinHash, MinHash

from shardkit.config import DedupConfig
from shardkit.contract import decode_text
from shardkit.jobs.dedup_tasks import find_duplicates
from shardkit.sample import Sample
from shardkit.duplicates.links import band_candidates, exact_links
from shardkit.duplicates.lsh import band_keys, candidate_pairs, detection_probability, optimal_params
from shardkit.duplicates.minhash import MinHasher, estimate_jaccard
from shardkit.duplicates.text import (content_digests, distinct_counts, normalise, shingle_hash, shingle_hashes,
                                        shingles, token_hash, token_hashes, tokens, words)
from shardkit.duplicates.unionfind import components, linked_components

LETTERS = list("abcdefghijklmnopqrstuvwxyz")


def vocabulary(rng, n=30000):
    """Random 7-letter words: unrelated documents share no 5-word shingle."""
    codes = rng.integers(0, 26, size=(n, 7))
    return np.array(["".join(LETTERS[c] for c in row) for row in codes])


def test_normalise_folds_case_width_punctuation_and_space():
    assert normalise("  Hello,\tWORLD!!  it's\u00a0ok_now ") == "hello world it s ok now"
    assert normalise("ｆｕｌｌ width — Ünïcode") == "full width ünïcode"
    assert normalise("...!?") == ""
    docs = ["Hello,  World! A b_c", "ｆｕｌｌ — Ünïcode x\x1cy", "", "   "]
    assert [b" ".join(words(d)).decode() for d in docs] == [normalise(d) for d in docs]


def test_decode_text_replaces_and_counts_bad_bytes():
    assert decode_text(b"ok \xff\xfe done") == ("ok \ufffd\ufffd done", 2)
    assert decode_text("already text") == ("already text", 0)


def test_shingles_short_documents_become_one_shingle():
    assert shingles("a b c", 5) == ["a b c"]
    assert shingles("a b c d e f", 5) == ["a b c d e", "b c d e f"]
    assert shingles("", 5) == []


@pytest.mark.parametrize("ngram", [1, 3, 5])
def test_vectorised_shingle_hashes_equal_the_scalar_hash(ngram):
    rng = np.random.default_rng(ngram)
    vocab = vocabulary(rng, 200)
    docs = [" ".join(rng.choice(vocab, int(rng.integers(0, 40)))) for _ in range(50)] + ["Ünïcode ｆｕｌｌ"]
    hashes, offsets = shingle_hashes(docs, ngram)
    for i, d in enumerate(docs):
        expected = [shingle_hash(s) for s in shingles(normalise(d), ngram)]
        assert hashes[offsets[i]:offsets[i + 1]].tolist() == expected


# Prose, case, punctuation runs, every ASCII whitespace, NUL, non-ASCII (NFKC), mostly symbols
# (ASCII and not), empty, blank, repetitive, shorter than n: each path of the batch tokeniser.
ODD_DOCS = ["Hello,  World! A b_c", "ｆｕｌｌ — Ünïcode x\x1cy", "", "   ", "a\x00 b\tc\nd\re\x0bf\x0cg",
            "### *** ---- !!! ab", "ÀB ### *** !!!! ---", "ha " * 40, "x", "a b c d", "|--|--|\n|x|\x00|",
            "The Quick brown FOX jumps over the lazy dog, again and AGAIN.", "日本語のテキスト 123"]


@pytest.mark.parametrize("ngram", [1, 3, 5])
def test_batch_tokens_and_shingles_equal_the_scalar_reference_on_every_path(ngram, monkeypatch):
    from shardkit.duplicates import text

    monkeypatch.setattr(text, "CHUNK_BYTES", 64)  # many chunks, and texts longer than a chunk
    rng = np.random.default_rng(ngram)
    docs = ODD_DOCS + [" ".join(rng.choice(["alpha", "Beta", "gam-ma", "dé", "x", "!!"], int(rng.integers(0, 30))))
                       for _ in range(100)]
    tok, counts, symbolic = token_hashes(docs)
    assert tok.tolist() == [token_hash(t) for d in docs for t in tokens(d)[0]]
    assert counts.tolist() == [len(tokens(d)[0]) for d in docs]
    assert symbolic.tolist() == [tokens(d)[1] for d in docs]
    hashes, offsets = shingle_hashes(docs, ngram)
    for i, d in enumerate(docs):
        expected = [shingle_hash(s) for s in shingles(b" ".join(tokens(d)[0]).decode(), ngram)]
        assert hashes[offsets[i]:offsets[i + 1]].tolist() == expected, d


def test_content_digests_equal_exactly_for_equal_token_sequences():
    docs = ["Same text, here.", "same TEXT here", "same text here!", "here same text", "same text",
            "### same text ###", "x", "y", ""]
    tok, counts, symbolic = token_hashes(docs)
    d = [tuple(row) for row in content_digests(tok, counts, symbolic).tolist()]
    assert d[0] == d[1] == d[2]
    assert len({d[0], d[3], d[4], d[6], d[7]}) == 5  # order, length and each token count
    assert d[6][0] != d[6][1]  # two independent 64-bit lanes, even for one token


def test_texts_that_swap_words_along_thue_morse_signs_are_not_exact_duplicates(tmp_path):
    # 2048 words alpha/beta in Thue-Morse order, four distinct filler words after each; the other
    # text swaps alpha and beta. No 5-gram is shared, yet a digest linear in the token hashes was
    # equal (the signed sum of K^j over those signs is 0 mod 2^64), and one was removed as "exact".
    signs = [bin(i).count("1") % 2 for i in range(2048)]
    a, b = (" ".join(f"{('alpha', 'beta')[s ^ flip]} f{i}a f{i}b f{i}c f{i}d" for i, s in enumerate(signs))
            for flip in (0, 1))
    tok, counts, symbolic = token_hashes([a, b])
    digests = content_digests(tok, counts, symbolic)
    assert (digests[0] != digests[1]).all()
    result = find_duplicates([Sample("a", {"txt": a}), Sample("b", {"txt": b})], DedupConfig(progress=False),
                             None, str(tmp_path))
    assert result.kept == 2 and not len(result.removed_ids)


@pytest.mark.parametrize("scheme", ["affine32", "legacy"])
def test_signatures_equal_datasketch_minhash_and_lean_jaccard_agrees(scheme):
    rng = np.random.default_rng(7)
    vocab = vocabulary(rng, 300)
    docs = [" ".join(rng.choice(vocab, int(rng.integers(1, 600)))) for _ in range(25)]
    docs += ["a b", docs[0] + " tail words here"]
    hasher = MinHasher(num_perm=64, seed=42, scheme=scheme)
    hashes, offsets = shingle_hashes(docs, 5)
    sig = hasher.signatures(hashes, offsets)
    reference = []
    for i, d in enumerate(docs):
        m = MinHash(num_perm=64, seed=42, hashfunc=shingle_hash, scheme=scheme)
        m.update_batch(shingles(normalise(d), 5))
        assert np.array_equal(m.hashvalues, sig[i]), f"document {i} differs from datasketch"
        reference.append(LeanMinHash(m))
    for i, j in [(0, len(docs) - 1), (1, 2), (3, 3)]:
        lean = hasher.lean(sig[i])
        assert lean.jaccard(reference[j]) == reference[i].jaccard(reference[j])
        assert lean.jaccard(hasher.lean(sig[j])) == estimate_jaccard(sig[i], sig[j])


def test_large_document_is_reduced_in_slices_identically():
    rng = np.random.default_rng(3)
    doc = " ".join(rng.choice(vocabulary(rng, 5000), 40000))
    hashes, offsets = shingle_hashes([doc, "small doc"], 5)
    sig = MinHasher(num_perm=32).signatures(hashes, offsets)
    m = MinHash(num_perm=32, hashfunc=shingle_hash)
    m.update_batch(shingles(normalise(doc), 5))
    assert np.array_equal(sig[0], m.hashvalues)


def test_empty_document_gets_the_empty_minhash():
    hashes, offsets = shingle_hashes(["", "x y z"], 5)
    sig = MinHasher(num_perm=16).signatures(hashes, offsets)
    assert np.array_equal(sig[0], MinHash(num_perm=16).hashvalues)


def test_optimal_params_report_their_detection_probability():
    bands, rows = optimal_params(0.8, 128)
    assert bands * rows <= 128
    # Tuned for recall: a pair at J = threshold + 0.05 must be found almost always.
    assert detection_probability(0.85, bands, rows) >= 0.97
    assert detection_probability(0.5, bands, rows) < 0.05
    assert optimal_params(0.8, 128, (0.5, 0.5)) == (9, 13)  # datasketch's MinHashLSH default


@pytest.mark.parametrize("weights", [(0.5, 0.5), (0.1, 0.9), (0.9, 0.1)])
def test_optimal_params_agree_with_datasketchs_own_search(weights):
    """shardkit computes (bands, rows) itself (config.optimal_lsh_params); datasketch's private
    `_optimal_param` is the reference MinHashLSH uses: both must pick the same pair, so that the
    dedup figures measured against datasketch hold."""
    from datasketch.lsh import _optimal_param

    for threshold in (0.1, 0.3, 0.5, 0.7, 0.8, 0.85, 0.9, 0.95):
        for num_perm in (16, 64, 128, 256):
            assert optimal_params(threshold, num_perm, weights) == _optimal_param(threshold, num_perm, *weights), \
                (threshold, num_perm)


def test_candidate_pairs_join_rows_sharing_any_band():
    sig = np.array([[1, 2, 3, 4], [1, 2, 9, 9], [7, 7, 3, 4], [5, 6, 7, 8], [1, 2, 0, 0]], np.uint32)
    pairs = candidate_pairs(band_keys(sig, bands=2, rows=2))
    assert pairs.tolist() == [[0, 1], [0, 2], [0, 4], [1, 4]]
    with pytest.raises(ValueError, match="exceeds num_perm"):
        band_keys(sig, bands=3, rows=2)


def test_union_find_labels_by_smallest_member_whatever_the_link_order():
    links = np.array([[5, 6], [2, 5], [3, 4], [6, 1]])
    assert components(7, links).tolist() == [0, 1, 1, 3, 3, 1, 1]
    assert components(7, links[::-1]).tolist() == [0, 1, 1, 3, 3, 1, 1]
    assert components(3, np.empty((0, 2))).tolist() == [0, 1, 2]


def test_union_find_on_linked_ids_only_handles_long_chains():
    chain = np.stack([np.arange(10**6, 10**6 + 5000), np.arange(10**6 + 1, 10**6 + 5001)], axis=1)[::-1]
    nodes, labels = linked_components(chain)
    assert len(nodes) == 5001 and (labels == 10**6).all()
    assert linked_components(np.empty((0, 2)))[0].tolist() == []


def test_exact_links_star_to_the_smallest_id_of_each_digest():
    h = np.array([7, 3, 7, 3, 9], np.uint64)
    x = np.array([1, 5, 1, 6, 0], np.uint64)  # ids 1 and 3 share h but not x: not equal
    assert sorted(exact_links(h, x, np.array([40, 11, 2, 13, 5])).tolist()) == [[2, 40]]


def test_band_candidates_star_big_buckets_and_pair_small_ones():
    h = np.array([1] * 5 + [2] * 3, np.uint64)
    ids = np.array([9, 4, 7, 30, 5, 8, 6, 3])
    assert band_candidates(h, ids, max_pairs=3).tolist() == [[3, 6], [3, 8], [4, 5], [4, 7], [4, 9], [4, 30], [6, 8]]


def test_distinct_counts_count_repeated_shingles_once():
    hashes, offsets = shingle_hashes(["ha " * 40, "a b c d e f g", "", "x"], 5)
    assert distinct_counts(hashes, offsets).tolist() == [1, 3, 0, 1]


@functools.lru_cache(maxsize=1)
def planted_corpus(seed=0, length=200, ngram=5, per_level=30, unrelated=1500, threshold=0.8):
    """Pairs (a, b) whose shingle sets have a chosen exact Jaccard, plus unrelated documents."""
    rng = np.random.default_rng(seed)
    vocab = vocabulary(rng)
    docs, pairs = {}, []
    size = length - ngram + 1
    for level in np.round(np.arange(0.3, 1.0001, 0.05), 2):
        for r in range(per_level):
            a = list(rng.choice(vocab, length))
            shared = 2 * size * level / (1 + level)
            # Round toward the level's side of the threshold so that a level's label is honest.
            shared = int(np.ceil(shared)) if level >= threshold else int(np.floor(shared))
            b = a[:shared + ngram - 1] + list(rng.choice(vocab, length - shared - ngram + 1))
            ka, kb = f"p{level:.2f}-{r:03d}-a", f"p{level:.2f}-{r:03d}-b"
            docs[ka], docs[kb] = " ".join(a), " ".join(b)
            sa, sb = set(shingles(docs[ka], ngram)), set(shingles(docs[kb], ngram))
            pairs.append((ka, kb, len(sa & sb) / len(sa | sb)))
    for i in range(unrelated):
        docs[f"u{i:05d}"] = " ".join(rng.choice(vocab, length))
    return docs, pairs


def _run_planted(verify: bool, tmp_path):
    docs, pairs = planted_corpus()
    samples = [Sample(k, {"txt": docs[k]}) for k in sorted(docs)]
    result = find_duplicates(samples, DedupConfig(verify=verify, progress=False), None, str(tmp_path))
    label = {r["key"]: r["duplicate_of"] for r in result.rows if not r["kept"]}
    found = np.array([label.get(b) == a for a, b, _ in pairs])
    jac = np.array([j for *_, j in pairs])
    planted = {k for a, b, _ in pairs for k in (a, b)}
    assert set(label) <= planted, "an unrelated document was removed"
    return found, jac


def test_planted_pairs_recall_and_precision_at_the_default_threshold(tmp_path):
    found, jac = _run_planted(False, tmp_path)
    assert found[jac >= 0.85].mean() >= 0.95
    assert (jac[found] >= 0.8).mean() >= 0.95
    assert not found[jac < 0.7].any()


def test_planted_pairs_with_verify_have_precision_one(tmp_path):
    found, jac = _run_planted(True, tmp_path)
    assert found[jac >= 0.85].mean() >= 0.95
    assert (jac[found] >= 0.8).all()
