"""English word and sentence splitting with the rules of spaCy's blank English tokenizer, which
datatrove's English quality filters count words with (no spaCy at run time).

A text is split on whitespace; each chunk then loses prefix and suffix punctuation one piece at a
time (quotes, brackets, commas, a sentence's final period unless the chunk is an abbreviation),
and what remains is cut at infixes (hyphens and slashes between letters, '...', a period between
a lower- and an upper-case letter). Contractions split as spaCy's exceptions split them
("don't" -> "do", "n't"); listed abbreviations ("e.g.", "Mr.", "a.m.") and URLs stay whole.
The sentence count follows spaCy's rule-based sentencizer: a sentence ends after a token that is
a sentence-final mark, at the next token that is not punctuation.
"""

from __future__ import annotations

import re
import unicodedata

# Single characters stripped from either end of a chunk (spaCy's punctuation, quote, currency lists).
_PUNCT = "…,:;!?¿؟¡()[]{}<>_#*&。？！，、；：～·।،۔؛٪"
_QUOTES = "'\"”“`‘´’‚,„»«「」『』（）〔〕【】《》〈〉〈〉⟦⟧"
_CURRENCY = "$£€¥฿₽﷼₴₠₡₢₣₤₥₦₧₨₩₪₫₭₮₯₰₱₲₳₵₶₷₸₹₺₻₼₾₿"
_PREFIX_CHARS = frozenset("§%=—–" + _PUNCT + _QUOTES + _CURRENCY)
_SUFFIX_CHARS = frozenset(_PUNCT + _QUOTES + "—–")
# Before a final period that splits off: spaCy's class is built by joining its punctuation list
# with '|' inside [...], so '|', '(', '?', ':' and ')' count too.
_BEFORE_PERIOD = frozenset("%²-+|" + _PUNCT + _QUOTES + "(?:)")
_UNITS = ("km km² km³ m m² m³ dm dm² dm³ cm cm² cm³ mm mm² mm³ ha µm nm yd in ft kg g mg µg t lb oz m/s km/h "
          "kmh mph hPa Pa mbar mb MB kb KB gb GB tb TB T G M K %").split()
_AFTER_NUMBER = re.compile(r"(?<=[0-9])(?:%s)$" % "|".join(
    sorted((re.escape(u) for u in _UNITS + list(_CURRENCY)), key=len, reverse=True)))
_UNIT_MAX = max(map(len, _UNITS + list(_CURRENCY)))  # a unit ends the chunk: search only its tail

# Scripts without case count as both lower and upper case in spaCy's classes (a period after a
# Hangul or CJK character splits off as after a lowercase one).
_UNCASED = ("\u0591-\u05F4\uFB1D-\uFB4F\u0620-\u064A\u066E-\u06D5\u06E5-\u06FF\u0750-\u077F\u08A0-\u08BD"
            "\uFB50-\uFBB1\uFBD3-\uFD3D\uFD50-\uFDC7\uFDF0-\uFDFB\uFE70-\uFEFC\u0900-\u097F\u0980-\u09FF"
            "\u0B80-\u0BFF\u0C00-\u0C7F\u0C80-\u0CFF\u0D80-\u0DFF\u1200-\u137F\u1100-\u11FF\uAC00-\uD7AF"
            "\u3040-\u309F\u30A0-\u30FFー\u3400-\u4DBF\u4E00-\u9FFF")
_LOWER = "a-zß-öø-ÿα-ωа-яё" + _UNCASED
_UPPER = "A-ZÀ-ÖØ-ÞΑ-ΩА-ЯЁ" + _UNCASED
_LOWERISH = re.compile(f"[{_LOWER}]")
# spaCy's letters also take in CJK symbols and punctuation ('、', '。' among them) and compatibility blocks.
_ALPHA = r"(?:[^\W\d_]|[\u2E80-\u2EFF\u2F00-\u2FDF\u2FF0-\u2FFF\u3000-\u303F\u31C0-\u31EF\u3200-\u33FF\uF900-\uFAFF\uFE30-\uFE4F])"
_ALNUM = r"(?:[^\W_]|[\u2E80-\u2EFF\u2F00-\u2FDF\u2FF0-\u2FFF\u3000-\u303F\u31C0-\u31EF\u3200-\u33FF\uF900-\uFAFF\uFE30-\uFE4F])"
_QUOTE_CLASS = re.escape(_QUOTES)


def _icon_class() -> str:
    """A regex class of the 'other symbol' characters (emoji, arrows, box drawing, the degree sign)."""
    ranges, start, prev = [], None, None
    for cp in range(0x80, 0x1FB00):
        if unicodedata.category(chr(cp)) == "So":
            if start is None:
                start = cp
            elif cp != prev + 1:
                ranges.append((start, prev))
                start = cp
            prev = cp
    ranges.append((start, prev))
    return "".join(re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in ranges)


_INFIX = re.compile(
    rf"\.\.+|…|[{_icon_class()}]"
    r"|(?<=[0-9])[+\-*^](?=[0-9-])"
    rf"|(?<=[{_LOWER}{_QUOTE_CLASS}])\.(?=[{_UPPER}{_QUOTE_CLASS}])"
    rf"|(?<={_ALPHA}),(?={_ALPHA})"
    rf"|(?<={_ALNUM})(?:---|--|——|-|–|—|~)(?={_ALPHA})"
    rf"|(?<={_ALNUM})[:<>=/](?={_ALPHA})")
_URL = re.compile(
    r"^(?:[\w+\-.]{2,}://)?(?:\S+(?::\S*)?@)?"
    r"(?:(?!(?:10|127)(?:\.\d{1,3}){3})(?!(?:169\.254|192\.168)(?:\.\d{1,3}){2})"
    r"(?!172\.(?:1[6-9]|2\d|3[0-1])(?:\.\d{1,3}){2})(?:[1-9]\d?|1\d\d|2[01]\d|22[0-3])(?:\.(?:1?\d{1,2}|2[0-4]\d|25[0-5])){3}"
    r"|(?:(?:[A-Za-z0-9\u00a1-\uffff][A-Za-z0-9\u00a1-\uffff_-]{0,62})?[A-Za-z0-9\u00a1-\uffff]\.)+"
    rf"[{_LOWER}]{{2,63}})(?::\d{{2,5}})?(?:[/?#]\S*)?$")

# Chunks kept whole (abbreviations, emoticons), and contractions split as spaCy's exceptions do.
_WHOLE = set(
    "Adm. Ak. Ala. Apr. Ariz. Ark. Aug. Bros. Calif. Co. Colo. Conn. Corp. D.C. Dec. Del. Dr. E.G. E.g. Feb. "
    "Fla. Ga. Gen. Gov. I.E. I.e. Ia. Id. Ill. Inc. Ind. Jan. Jr. Jul. Jun. Kan. Kans. Ky. La. Ltd. Mar. Mass. "
    "Md. Messrs. Mich. Minn. Miss. Mo. Mont. Mr. Mrs. Ms. Mt. N.C. N.D. N.H. N.J. N.M. N.Y. Neb. Nebr. Nev. "
    "Nov. Oct. Okla. Ore. Pa. Ph.D. Prof. Rep. Rev. S.C. Sen. Sep. Sept. St. Tenn. Va. Wash. Wis. a.m. p.m. "
    "co. e.g. i.e. v.s. vs. ä. ö. ü. °C. °F. °K. °c. °f. °k. and/or w/o C++ ' '' 'em 'll 'nuff 're 've 'd "
    # emoticons
    "(*_*) (-8 (-: (-; (-_-) (: (; (= (>_<) (^_^) (o: (¬_¬) (ಠ_ಠ) )-: ): -_- -__- 0_0 0_o 8) 8-) 8-D 8D "
    ":( :(( :((( :() :) :)) :))) :* :-( :-(( :-((( :-) :-)) :-))) :-* :-/ :-0 :-3 :-> :-D :-O :-P :-X :-] "
    ":-o :-p :-x :-| :-} :/ :0 :1 :3 :> :D :O :P :X :] :o :o) :p :x :| :} ;) ;-) ;-D ;D ;_; </3 <3 <33 <333 "
    "=( =) =/ =3 =D =[ =] =| >:( >:o ><(((*> @_@ O_O O_o V_V XD XDD [-: [: [= \\\") ]= ^_^ ^__^ ^___^ o_0 "
    "o_O o_o v_v xD xDD ¯\\(ツ)/¯ ಠ_ಠ ಠ︵ಠ (._.) ._. 0.0 0.o <.< >.< >.> O.O O.o o.0 o.O o.o V.V v.v "
    ":'( :') :'-( :'-) :’( :’) :’-( :’-) <space> ‘s ‘S".split())
_WHOLE |= {c + "." for c in "abcdefghijklmnopqrstuvwxyz"}
_SPLIT = {f"{h}{m}": (str(h), m) for h in range(1, 13) for m in ("a.m.", "p.m.", "am", "pm")}
_SPLIT |= {"cannot": ("can", "not"), "gonna": ("gon", "na"), "gotta": ("got", "ta"), "'s": ("'s",)}
for _w in ("aint arent cant couldnt darent didnt doesnt dont hadnt hasnt havent isnt mightnt mustnt neednt "
           "shant shouldnt wasnt werent wont wouldnt").split():
    _SPLIT[_w] = (_w[:-2], "nt")
for _w, _cut in (("im", 1), ("ive", 1), ("youre", 3), ("youve", 3), ("youll", 3), ("youd", 3), ("theyre", 4),
                 ("theyve", 4), ("theyll", 4), ("theyd", 4), ("thats", 4), ("whats", 4), ("whos", 3), ("hes", 2),
                 ("shes", 3), ("wheres", 5), ("theres", 5), ("weve", 2), ("itll", 2), ("itd", 2), ("shouldve", 6),
                 ("couldve", 5), ("wouldve", 5), ("mustve", 4), ("mightve", 5), ("id", 1), ("wed", 2), ("hed", 2),
                 ("yall", 1)):
    _SPLIT[_w] = (_w[:_cut], _w[_cut:])
_SPLIT["ima"] = ("i", "m", "a")
_SPLIT.update({w[0].upper() + w[1:]: (p[0][0].upper() + p[0][1:],) + p[1:] for w, p in list(_SPLIT.items())
               if w[0].isalpha()})
_CONTRACTION = re.compile(r"^([A-Za-z]+?)(n['’]t)?(['’](?:re|ve|ll|d|m|s|S))?$")
_PRONOUN_SUFFIX = frozenset("i you he she it we they there here that this these those what who where when why "
                            "how let could should would might must may need ought".split())

# Marks that end a sentence (spaCy's sentencizer defaults).
SENTENCE_END = frozenset(
    "!.?։؟۔܀܁܂߹।॥၊။።፧፨᙮᜵᜶᠃᠉᥄᥅᪨᪩᪪᪫᭚᭛᭞᭟᰻᰼᱾᱿‼‽⁇⁈⁉⸮⸼꓿꘎꘏꛳꛷꡶꡷꣎꣏꤯꧈꧉꩝꩞꩟꫰꫱꯫﹒﹖﹗！．？"
    "𐩖𐩗𑁇𑁈𑂾𑂿𑃀𑃁𑅁𑅂𑅃𑇅𑇆𑇍𑇞𑇟𑈸𑈹𑈻𑈼𑊩𑑋𑑌𑗂𑗃𑗉𑗊𑗋𑗌𑗍𑗎𑗏𑗐𑗑𑗒𑗓𑗔𑗕𑗖𑗗𑙁𑙂𑜼𑜽𑜾𑩂𑩃𑪛𑪜𑱁𑱂𖩮𖩯𖫵𖬷𖬸𖭄𛲟𝪈｡。")

# Longer chunks are never taken for URLs: the URL expression backtracks in time that grows faster
# than the chunk (1.5 s at 16,000 characters of "ab:c"), and no real URL is this long.
URL_MAX = 1000
_CACHE_LIMIT = 1 << 18  # chunks remembered per process (words repeat: most lookups hit)


def _icon(ch: str) -> bool:
    return ch > "\x7f" and unicodedata.category(ch) == "So"  # no ASCII character is a symbol ('So')


def _prefix(s: str) -> int:
    """Length of the prefix spaCy's English tokenizer strips from the front of s (0: none)."""
    c = s[0]
    if c == "." and s.startswith(".."):
        return len(s) - len(s.lstrip("."))
    if c in _PREFIX_CHARS or _icon(c):
        return 1
    if c == "+" and not (len(s) > 1 and s[1].isdigit()):
        return 1
    if c in "UCA":
        for cur in ("US$", "C$", "A$"):
            if s.startswith(cur):
                return len(cur)
    return 0


def _suffix(s: str) -> int:
    """Length of the suffix stripped from the end of s: the leftmost-starting rule that reaches the end."""
    c, n = s[-1], len(s)
    if c == ".":
        dots = n - len(s.rstrip("."))
        if dots >= 2:
            return dots
        if n >= 2:
            b = s[-2]
            if b.isdigit() or b.islower() or b in _BEFORE_PERIOD or _LOWERISH.match(b):
                return 1
            if n >= 3 and b.isupper() and s[-3].isupper():
                return 1
            if n >= 3 and b in "FfCcKk" and s[-3] == "°":
                return 1
        return 0
    best = 0
    if n >= 2 and s[-2:] in ("'s", "'S", "’s", "’S", "……"):
        best = 2
    m = _AFTER_NUMBER.search(s, max(0, n - _UNIT_MAX))
    if m:
        best = max(best, n - m.start())
    if c in _SUFFIX_CHARS or _icon(c) or (c == "+" and n >= 2 and s[-2].isdigit()):
        best = max(best, 1)
    return best


def _special(s: str, use: bool = True) -> tuple[str, ...] | None:
    if not use:
        return None
    if s in _WHOLE:
        return (s,)
    if s in _SPLIT:
        return _SPLIT[s]
    m = _CONTRACTION.match(s) if ("'" in s or "’" in s) else None
    if m and (m.group(2) or m.group(3)):
        base, neg, tail = m.groups()
        if tail and not neg and tail[1:] in ("s", "S"):
            return None  # 's is a suffix rule, not an exception
        if tail and not neg and base.lower() not in _PRONOUN_SUFFIX:
            return None
        return tuple(p for p in (base, neg, tail) if p)
    return None


# Every infix starts with one of these characters (or a non-ASCII one: an icon, '…', a dash): a chunk
# without any is one piece, found by one scan instead of _INFIX's alternatives at every position.
_MAYBE_INFIX = re.compile(r"[.+\-*^,~:<>=/]|[^\x00-\x7f]")


def _infixes(s: str) -> list[str]:
    """s cut at its infixes: what _INFIX.finditer gives, tried only where an infix can start (its
    alternatives and lookbehinds at every position are most of a novel chunk's cost)."""
    maybe = _MAYBE_INFIX.search(s, 1)  # an infix at 0 is skipped below
    if not maybe:
        return [s]
    out, start = [], 0
    m = _INFIX.match(s)  # at 0: consumed, not cut, as finditer does
    pos = m.end() if m else 1
    while True:
        maybe = _MAYBE_INFIX.search(s, pos)
        if maybe is None:
            break
        m = _INFIX.match(s, maybe.start())  # lookbehinds still see what precedes the position
        if m is None:
            pos = maybe.start() + 1
            continue
        a, b = m.span()
        if a != start:
            out.append(s[start:a])
        out.append(s[a:b])
        start = pos = b
    if start < len(s):
        out.append(s[start:])
    return out


def _split_chunk(s: str, use: bool = True) -> tuple[str, ...]:
    """One whitespace-free chunk -> its tokens (`use`: with the exceptions)."""
    prefixes, suffixes = [], []
    special = _special(s, use) if s else None  # the exception s is, once per value of s
    last = -1
    while s and special is None and len(s) != last:
        last = len(s)
        p = _prefix(s)
        if p:
            special = _special(s[p:], use)
            if special is not None:
                prefixes.append(s[:p])
                s = s[p:]
                break
        q = _suffix(s[p:]) if len(s) > p else 0
        if q:
            special = _special(s[:-q], use)
            if special is not None:
                suffixes.append(s[-q:])
                s = s[:-q]
                break
        if p and q and p + q <= len(s):
            prefixes.append(s[:p])
            suffixes.append(s[-q:])
            s = s[p:-q]
        elif p:
            prefixes.append(s[:p])
            s = s[p:]
        elif q:
            suffixes.append(s[-q:])
            s = s[:-q]
        if len(s) != last:
            special = _special(s, use)
    return tuple(prefixes) + tuple(_middle(s, special)) + tuple(reversed(suffixes))


def _middle(s: str, special: tuple | None) -> tuple | list:
    """The tokens of what the affix rules left: an exception, a URL, or its infix pieces."""
    if not s:
        return ()
    if special is not None:
        return special
    if "." in s and len(s) <= URL_MAX and _URL.match(s):  # a URL's host has a dot
        return (s,)
    return _infixes(s)


def _merges() -> dict[tuple[str, ...], int]:
    """Exceptions that the affix rules would cut (emoticons, "'s", "''"): their pieces, to be joined
    again wherever they follow each other inside a chunk, as spaCy's matcher over special cases does."""
    out = {}
    for special in _WHOLE | {"'s", "'S", "'d", "'cos", "'cause"}:
        pieces = _split_chunk(special, use=False)
        if len(pieces) > 1:
            out[pieces] = len(pieces)
    return out


_MERGE = _merges()
_MERGE_FIRST = {pieces[0] for pieces in _MERGE}
_MERGE_MAX = max(map(len, _MERGE))


def _merge(tokens: tuple[str, ...]) -> tuple[str, ...]:
    """Join runs of tokens that spell an exception, longest first, left to right."""
    out, i, n = [], 0, len(tokens)
    while i < n:
        if tokens[i] in _MERGE_FIRST:
            for size in range(min(_MERGE_MAX, n - i), 1, -1):
                if tokens[i:i + size] in _MERGE:
                    out.append("".join(tokens[i:i + size]))
                    i += size
                    break
            else:
                out.append(tokens[i])
                i += 1
        else:
            out.append(tokens[i])
            i += 1
    return tuple(out)


# Words of ASCII letters (and inner underscores) joined by single hyphens, with at most one closing
# mark, and runs of digits and colons: what the affix rules make of them is known without running
# them (the mark splits off, a period only after a lowercase letter; a hyphen between letters is an
# infix; a word alone may be a contraction), and such chunks are most of those not seen before.
_SIMPLE = re.compile(r"([A-Za-z](?:[A-Za-z_]*[A-Za-z])?(?:-[A-Za-z](?:[A-Za-z_]*[A-Za-z])?)*)([,;:)!?.]?)"
                     r"|[0-9](?:[0-9:]*[0-9])?")
_HYPHEN = re.compile("(-)")


def _simple(chunk: str) -> tuple[str, ...] | None:
    m = _SIMPLE.fullmatch(chunk)
    if m is None or chunk in _WHOLE or chunk in _SPLIT:
        return None
    core, mark = m.groups()
    if core is None:  # digits and colons: no affix, no infix ('12:30:45')
        return (chunk,)
    if mark == "." and not core[-1].islower():
        return None
    pieces = tuple(_HYPHEN.split(core)) if "-" in core else _SPLIT.get(core, (core,)) if mark else (core,)
    return pieces + (mark,) if mark else pieces


class _Chunks(dict):
    """chunk -> its tokens, split on the first lookup (a miss calls __missing__; a hit stays in C).

    Two generations of at most _CACHE_LIMIT / 2 chunks each: when this one fills, it becomes the
    old one and a lookup that misses here takes the old answer, so the words that keep coming
    (most lookups) survive the flush and only chunks unseen for a whole generation are split again."""

    def __init__(self):
        super().__init__()
        self.old: dict = {}

    def __missing__(self, chunk: str) -> tuple[str, ...]:
        if len(self) >= _CACHE_LIMIT // 2:
            self.old = dict(self)
            self.clear()
        got = self.old.get(chunk)
        if got is None:
            got = _simple(chunk) or _split_chunk(chunk)
            if len(got) > 1 and not _MERGE_FIRST.isdisjoint(got):
                got = _merge(got)
        self[chunk] = got
        return got


_CACHE = _Chunks()


def chunk_tokens(chunk: str) -> tuple[str, ...]:
    """The tokens of one whitespace-free chunk (remembered: chunks repeat across documents)."""
    return _CACHE[chunk]


# The last text split and its tokens: the filters of one build split the same text in turn (both
# Gopher filters), so the second split is a lookup. One (text, tokens) pair, read and replaced whole:
# threads of one worker share it, and a pair is never half another text's.
_LAST: list = [("", [])]


def words(text: str) -> list[str]:
    """Every token of the text, punctuation included, as spaCy's English tokenizer gives them (a list
    the caller reads, never changes: the next call with an equal text returns it again)."""
    last, tokens = _LAST[0]
    if text == last:
        return tokens
    out: list[str] = []
    extend = out.extend
    for got in map(_CACHE.__getitem__, text.split()):  # a hit never leaves C; a miss splits the chunk
        extend(got)
    _LAST[0] = (text, out)
    return out


def _is_punct(token: str) -> bool:
    return all(unicodedata.category(ch).startswith("P") for ch in token)


def sentences(text: str) -> int:
    """How many sentences the rule-based sentencizer finds in a text (1 for any non-empty text)."""
    toks = words(text)
    if not toks:
        return 0
    count, seen_end = 1, False
    for tok in toks:
        ends = tok in SENTENCE_END
        if seen_end and not ends and not _is_punct(tok):
            count += 1
            seen_end = False
        elif ends:
            seen_end = True
    return count
