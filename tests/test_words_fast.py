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
