"""The word splitter's short paths give the tokens its full rules give."""

import random

from shardkit.stages.filters import words as W


def _full(chunk):
    got = W._split_chunk(chunk)
    return W._merge(got) if len(got) > 1 and not W._MERGE_FIRST.isdisjoint(got) else got


EDGES = ["Mr.", "dont", "dont,", "Dont.", "cannot!", "A.", "AB.", "ab.", "well-known.", "x-ray", "a-b-c)", "e.g.",
         "U.S.", "5km", "12:30:45", "1:0", "12am", "a_b", "a_b_", "_a", "snake_case,", "im", "Im.", "vs.", "co.",
         "x.", "xD", "XD", "o_O", "and/or", "12", "0", "a", "Hello;", "world?", "end:", "wont)", "ima!"]


def test_short_paths_match_the_full_rules():
    rng = random.Random(0)
    alphabet = "abcXYZ_-.,;:)!?('\"0129/@#"
    chunks = EDGES + ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 7))) for _ in range(20_000)]
    taken = 0
    for chunk in chunks:
        fast = W._simple(chunk)
        if fast is not None:
            taken += 1
            got = W._merge(fast) if len(fast) > 1 and not W._MERGE_FIRST.isdisjoint(fast) else fast
            assert got == _full(chunk), chunk
        assert W.chunk_tokens(chunk) == _full(chunk), chunk
    assert taken > 500  # the short paths were exercised


def test_infix_and_url_prechecks_keep_the_tokens():
    for chunk in ["a.B", "foo--bar", "x…y", "3+4", "a,b", "http://example.com/x", "www.example.org", "a:b", "ab",
                  ".a", "--a"]:
        W._CACHE.pop(chunk, None)
        assert W.chunk_tokens(chunk) == _full(chunk)


def test_last_text_memo_gives_each_text_its_own_words():
    a, b = "Don't stop. Go on!", "Mr. Smith, e.g. here."
    assert W.words(a) == ["Do", "n't", "stop", ".", "Go", "on", "!"]
    assert W.words(b) == ["Mr.", "Smith", ",", "e.g.", "here", "."]
    assert W.words(a) == ["Do", "n't", "stop", ".", "Go", "on", "!"]
    assert W.words("") == []


def _infixes_reference(s):
    """The plain scan words._infixes stands for: _INFIX.finditer over the whole chunk."""
    out, start = [], 0
    for m in W._INFIX.finditer(s):
        a, b = m.span()
        if a == 0:
            continue
        if a != start:
            out.append(s[start:a])
        out.append(s[a:b])
        start = b
    if start < len(s):
        out.append(s[start:])
    return out


def test_infix_scan_at_candidate_positions_cuts_where_the_full_scan_cuts():
    rng = random.Random(1)
    alphabet = "aZé9.+-*^,~:<>=/…—–'\"_(😀"
    chunks = ["a.B", "..a", "a..b", "a-b-c", "3+-4", "x/y.z", "a—b", "...", ".a.B", "a.'B", "9-9-9", "a:b:c"]
    chunks += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 9))) for _ in range(50_000)]
    cut = 0
    for chunk in chunks:
        got = W._infixes(chunk)
        assert got == _infixes_reference(chunk), chunk
        cut += len(got) > 1
    assert cut > 10_000  # most chunks had infixes to cut


def test_unit_suffix_is_found_from_the_chunks_tail(monkeypatch):
    chunks = ["5km", "10km/h", "3mbar", "12$", "x5kg", "5kgs", "a" * 50 + "9mm", "99%", "9.5GB", "km", "9₿", "1m/s"]
    tail = [W._suffix(c) for c in chunks]
    monkeypatch.setattr(W, "_UNIT_MAX", 10_000)  # the search over the whole chunk
    assert tail == [W._suffix(c) for c in chunks]
    assert tail[:7] == [2, 4, 4, 1, 2, 0, 2]


def test_words_seen_often_survive_the_cache_flush(monkeypatch):
    monkeypatch.setattr(W, "_CACHE_LIMIT", 8)
    cache = W._Chunks()
    splits = []
    real = W._split_chunk
    monkeypatch.setattr(W, "_split_chunk", lambda s, use=True: splits.append(s) or real(s, use))
    for i in range(40):  # "(hot)" between novel chunks: split once, then taken from either generation
        assert cache["(hot)"] == ("(", "hot", ")")
        assert cache[f"(cold{i})"] == ("(", f"cold{i}", ")")
    assert splits.count("(hot)") == 1
    assert len(cache) + len(cache.old) <= 8
    assert len(splits) == 41
