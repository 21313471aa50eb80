"""The repo world's tasks: small Python packages with real test suites, and their solutions.

Each task is a package whose functions are stubs (their docstrings are the specification), a
test file of plain ``test_*`` functions with ``assert`` that agents read, and a reference
solution. The engine runs the tests once against the reference (:mod:`worlds.repo_checks`),
recording each call and its answer; a test run then judges agent code on those calls, so tests
may call only the package's public functions, with plain values, and assert on what they return
or raise. The test suite checks that every task is solvable and scored right.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Task:
    name: str
    summary: str  # one line an agent reads in every observation
    files: dict[str, str]  # editable path -> starting content
    tests: dict[str, str]  # test path -> content (restored before every run)
    solution: dict[str, str]  # editable path -> a correct content


_RAISES = """

def raises(kind, fn, *args):
    try:
        fn(*args)
    except kind:
        return True
    return False
"""

ROMAN = Task(
    name="roman",
    summary="roman numerals: implement to_roman and from_roman in roman/convert.py",
    files={
        "roman/__init__.py": "from roman.convert import from_roman, to_roman\n",
        "roman/convert.py": '''def to_roman(n):
    """The Roman numeral of n, for 1 <= n <= 3999 (e.g. 1994 -> 'MCMXCIV').
    Raise ValueError outside that range."""
    raise NotImplementedError


def from_roman(s):
    """The number a Roman numeral stands for ('MCMXCIV' -> 1994).
    Raise ValueError for an empty string or a character that is not a numeral."""
    raise NotImplementedError
''',
    },
    tests={
        "tests/test_convert.py": """from roman import from_roman, to_roman
"""
        + _RAISES
        + """

def test_small():
    assert [to_roman(n) for n in (1, 3, 4, 5, 9)] == ["I", "III", "IV", "V", "IX"]


def test_large():
    assert to_roman(1994) == "MCMXCIV"
    assert to_roman(3999) == "MMMCMXCIX"


def test_range():
    assert raises(ValueError, to_roman, 0)
    assert raises(ValueError, to_roman, 4000)


def test_parse():
    assert from_roman("XLII") == 42
    assert from_roman("MCMXCIV") == 1994


def test_parse_bad():
    assert raises(ValueError, from_roman, "")
    assert raises(ValueError, from_roman, "XQ")


def test_round_trip():
    assert all(from_roman(to_roman(n)) == n for n in range(1, 400))
""",
    },
    solution={
        "roman/convert.py": """VALUES = [
    (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"), (50, "L"),
    (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"),
]
DIGITS = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def to_roman(n):
    if not 1 <= n <= 3999:
        raise ValueError(n)
    out = ""
    for value, numeral in VALUES:
        while n >= value:
            out += numeral
            n -= value
    return out


def from_roman(s):
    if not s or any(c not in DIGITS for c in s):
        raise ValueError(s)
    total = 0
    for i, c in enumerate(s):
        v = DIGITS[c]
        total += -v if i + 1 < len(s) and DIGITS[s[i + 1]] > v else v
    return total
""",
    },
)

INTERVALS = Task(
    name="intervals",
    summary="intervals: implement merge, total and gaps in intervals/core.py",
    files={
        "intervals/__init__.py": "from intervals.core import gaps, merge, total\n",
        "intervals/core.py": '''def merge(intervals):
    """Merge overlapping or touching (start, end) pairs; return them sorted, as tuples.
    merge([(5, 7), (1, 3), (2, 4)]) -> [(1, 4), (5, 7)]. Raise ValueError if start > end."""
    raise NotImplementedError


def total(intervals):
    """The length covered by the intervals, counting overlaps once."""
    raise NotImplementedError


def gaps(intervals):
    """The uncovered (start, end) pairs between the merged intervals, in order."""
    raise NotImplementedError
''',
    },
    tests={
        "tests/test_core.py": """from intervals import gaps, merge, total
"""
        + _RAISES
        + """

def test_merge_overlapping():
    assert merge([(5, 7), (1, 3), (2, 4)]) == [(1, 4), (5, 7)]


def test_merge_touching():
    assert merge([(1, 2), (2, 3)]) == [(1, 3)]


def test_merge_empty_and_bad():
    assert merge([]) == []
    assert raises(ValueError, merge, [(3, 1)])


def test_total():
    assert total([(1, 3), (2, 5), (10, 11)]) == 5


def test_gaps():
    assert gaps([(1, 2), (4, 5), (3, 3.5)]) == [(2, 3), (3.5, 4)]


def test_gaps_none():
    assert gaps([(0, 10), (2, 3)]) == []
""",
    },
    solution={
        "intervals/core.py": """def merge(intervals):
    out = []
    for start, end in sorted(intervals):
        if start > end:
            raise ValueError((start, end))
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def total(intervals):
    return sum(end - start for start, end in merge(intervals))


def gaps(intervals):
    merged = merge(intervals)
    return [(a[1], b[0]) for a, b in zip(merged, merged[1:])]
""",
    },
)

TEXTSTATS = Task(
    name="textstats",
    summary="text statistics: implement words, top and sentences in textstats/stats.py",
    files={
        "textstats/__init__.py": "from textstats.stats import sentences, top, words\n",
        "textstats/stats.py": '''def words(text):
    """The words of text, lowercased, in order: runs of letters and apostrophes.
    words("It's a Test, a test!") -> ["it's", "a", "test", "a", "test"]"""
    raise NotImplementedError


def top(text, k):
    """The k most frequent words as (word, count) pairs: most frequent first, ties in
    alphabetical order."""
    raise NotImplementedError


def sentences(text):
    """How many sentences: runs of text ending in '.', '!' or '?' (or the end) that contain
    at least one letter."""
    raise NotImplementedError
''',
    },
    tests={
        "tests/test_stats.py": """from textstats import sentences, top, words


def test_words():
    assert words("It's a Test, a test!") == ["it's", "a", "test", "a", "test"]


def test_words_empty():
    assert words("  42 -- ") == []


def test_top():
    assert top("b a b c a b", 2) == [("b", 3), ("a", 2)]


def test_top_ties():
    assert top("z y x", 2) == [("x", 1), ("y", 1)]


def test_sentences():
    assert sentences("One. Two! Three? four") == 4


def test_sentences_empty():
    assert sentences("...!?") == 0
""",
    },
    solution={
        "textstats/stats.py": """import re
from collections import Counter


def words(text):
    return re.findall(r"[a-z']+", text.lower())


def top(text, k):
    return sorted(Counter(words(text)).items(), key=lambda wc: (-wc[1], wc[0]))[:k]


def sentences(text):
    return sum(1 for part in re.split(r"[.!?]", text) if re.search(r"[A-Za-z]", part))
""",
    },
)

RPN = Task(
    name="rpn",
    summary="a reverse Polish calculator: implement evaluate in rpn/calc.py",
    files={
        "rpn/__init__.py": "from rpn.calc import evaluate\n",
        "rpn/calc.py": '''def evaluate(expression):
    """Evaluate a reverse Polish expression of numbers and + - * / separated by spaces:
    evaluate("3 4 + 2 *") -> 14. Numbers may be negative or decimal; / is true division.
    Raise ValueError for an unknown token, too few operands, leftover operands or an
    empty expression, and ZeroDivisionError for division by zero."""
    raise NotImplementedError
''',
    },
    tests={
        "tests/test_calc.py": """from rpn import evaluate
"""
        + _RAISES
        + """

def test_add_mul():
    assert evaluate("3 4 + 2 *") == 14


def test_order():
    assert evaluate("10 4 -") == 6
    assert evaluate("1 2 /") == 0.5


def test_numbers():
    assert evaluate("-2 1.5 *") == -3


def test_errors():
    assert raises(ValueError, evaluate, "1 +")
    assert raises(ValueError, evaluate, "1 2")
    assert raises(ValueError, evaluate, "2 x +")
    assert raises(ValueError, evaluate, "")


def test_zero():
    assert raises(ZeroDivisionError, evaluate, "1 0 /")
""",
    },
    solution={
        "rpn/calc.py": """import operator

OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


def evaluate(expression):
    stack = []
    for token in expression.split():
        if token in OPS:
            if len(stack) < 2:
                raise ValueError("too few operands")
            b, a = stack.pop(), stack.pop()
            stack.append(OPS[token](a, b))
        else:
            try:
                stack.append(float(token))
            except ValueError:
                raise ValueError(f"unknown token {token}") from None
    if len(stack) != 1:
        raise ValueError("malformed expression")
    return stack[0]
""",
    },
)

TASKS: tuple[Task, ...] = (ROMAN, INTERVALS, TEXTSTATS, RPN)
