"""Every citation of the behaviour specification resolves in ``docs/spec.md``.

The code's docstrings and comments, the docs and the README cite the specification by
section: ``SPEC B.3 row 10``, ``SPEC D.1 step 6.3``, ``SPEC F.25``, ``F61``, ``C.10``,
``G8``, ``S12``, ``SPEC sections A-D, F, G``. This module finds every such citation in the
scanned files (``.py`` under spec/, models/, impl/, gpu/, engines/ and tests/; ``.md`` under
docs/ except ``docs/spec.md`` itself and the generated ``docs/api/``; README.md and
Makefile) and checks two things:

(a) each cited section, item, step or B.3 row exists in ``docs/spec.md`` (a heading or a
    bolded item whose text starts with the label; a B.3 row is a numbered row of the table
    under the ``B.3`` heading);
(b) no file cites a document outside the checkout (the design notes ``SCENARIOS.md``,
    ``ARCHITECTURE``, ``CHECKING.md``, ``STYLE.md``, ``SPEC.md``, ``shared/design``): a reader
    of a clone cannot follow those. :func:`rewrite` gives each such citation its form in
    this project's specification.

Forms are matched only where they are citations: a label must stand alone (not inside an
identifier, a hex string or a path), ``C``/``F`` items may be written with or without the
dot (``C.10`` is ``C10``, ``F61`` is ``F.61``), and a citation wrapped over two lines (``SPEC
B.3`` at the end of one, ``row 21`` at the start of the next) is read as one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC_DOC = ROOT / "docs" / "spec.md"
SOURCE_DIRS = ("spec", "models", "impl", "gpu", "engines", "tests")
TOP_FILES = ("README.md", "Makefile")

# --------------------------------------------------------------------------------------
# The grammar of a citation
# --------------------------------------------------------------------------------------

_NUM = r"\d+(?:\.\d+)?"
_SEP = r"\s*(?:,|-|–|and|through|to)\s*"
_NUMS = rf"{_NUM}(?:{_SEP}{_NUM})*"
#: A top-level section letter standing alone ("SPEC C", "section G", "SPEC D."), not the
#: start of "A.1" or of an identifier.
_LETTER = r"[A-HS](?!\w)(?!\.\d)"
_LETTERS = rf"(?:{_LETTER})(?:\s*(?:-|–|,|and|/)\s*(?:{_LETTER}))*"
_DOTTED = r"[A-H]\.\d{1,2}"
_ITEM = r"[CFGS]\.?\d{1,2}"

_OUTSIDE = (
    r"(?:(?<![\w/])(?:shared/)?design/)?(?:SCENARIOS|ARCHITECTURE|CHECKING|STYLE|SPEC)\.md\b"
    r"|(?<![\w/])shared/design\b/?"
    r"|\bSCENARIOS\b|\bARCHITECTURE\b|\bCHECKING\b"
)
_OUTSIDE_LOCATOR = (
    r"\s+(?:layers?\s+\d+(?:\s*-\s*\d+)?|sections?\s+\d+(?:\.\d+)*|\d+(?:\.\d+)+"
    r"|S\d+(?:\s*-\s*S\d+)?)"
)

_CITATION = re.compile(
    rf"""
    (?P<out>{_OUTSIDE})(?P<outloc>{_OUTSIDE_LOCATOR})?
  | \bSPEC\s+rows?\s+(?P<specrows>{_NUMS})
  | \bSPEC\s+(?:sections?\s+)?(?P<letters>{_LETTERS})
  | (?<![\w.])[Ss]ections?\s+(?P<bare_letters>{_LETTERS})
  | (?:\bSPEC\s+)?(?<![\w.])(?P<range_a>{_DOTTED})\s*[-–]\s*(?P<range_b>{_DOTTED})
        (?!\w)(?!\.\w)
  | (?:\bSPEC\s+)?(?<![\w.])(?P<sec>{_DOTTED})(?!\w)(?!\.\w)
        (?:\s+(?:(?P<kind>rows?|steps?)\s+|(?P<r>r)(?=\d))(?P<nums>{_NUMS}))?
  | (?:\bSPEC\s+)?(?<![\w.,\[/])(?P<item_a>{_ITEM})\s*[-–]\s*(?P<item_b>{_ITEM})
        (?!\w)(?!\.\w)
  | (?:\bSPEC\s+)?(?<![\w.,\[/])(?P<item>[CFGS]\d{{1,2}})(?!\w)(?!\.\w)
    """,
    re.VERBOSE,
)

_SECTION_LETTERS = "ABCDEFGH"


@dataclass(frozen=True)
class Citation:
    """One citation found in a text: where, as written, and what it names.

    ``labels`` are the labels of docs/spec.md it needs (``"B.3"``, ``"C.10"``, ``"G8"``,
    ``"D.1 step 6.3"``); ``rows`` the B.3 rows; ``outside`` the outside document named
    (empty when it cites this project's specification)."""

    path: str
    line: int
    text: str
    labels: tuple[str, ...] = ()
    rows: tuple[int, ...] = ()
    outside: str = ""

    def where(self) -> str:
        return f"{self.path}:{self.line}: {self.text}"


def normalize(label: str) -> str:
    """A label as docs/spec.md spells it: ``C10`` -> ``C.10``, ``F61`` -> ``F.61``, ``G.8``
    -> ``G8``; everything else unchanged."""
    m = re.fullmatch(r"([A-HS])\.?(\d+)(.*)", label)
    if m is None:
        return label
    letter, number, rest = m.groups()
    number = str(int(number))
    if letter in "GS":
        return f"{letter}{number}{rest}"
    return f"{letter}.{number}{rest}"


def _numbers(text: str) -> list[str]:
    """``"3, 6, 9-11"`` -> ``["3", "6", "9", "10", "11"]``; dotted numbers kept as written
    (a range between dotted numbers gives its two ends)."""
    out: list[str] = []
    parts = re.split(r"\s*(?:,|and)\s*", text.strip())
    for part in parts:
        ends = re.split(r"\s*(?:-|–|through|to)\s*", part)
        if len(ends) == 2 and all(e.isdigit() for e in ends) and int(ends[0]) <= int(ends[1]):
            out += [str(n) for n in range(int(ends[0]), int(ends[1]) + 1)]
        else:
            out += [e for e in ends if e]
    return out


def _letters(text: str) -> list[str]:
    out: list[str] = []
    for part in re.split(r"\s*(?:,|and|/)\s*", text.strip()):
        ends = re.split(r"\s*[-–]\s*", part)
        if len(ends) == 2 and all(e in _SECTION_LETTERS for e in ends):
            a, b = (_SECTION_LETTERS.index(e) for e in ends)
            out += list(_SECTION_LETTERS[a : b + 1])
        else:
            out += [e for e in ends if e]
    return out


def _item_range(a: str, b: str) -> list[str]:
    la, na = a[0], int(a.lstrip("CFGS."))
    lb, nb = b[0], int(b.lstrip("CFGS."))
    if la != lb or na > nb:
        return [normalize(a), normalize(b)]
    return [normalize(f"{la}{n}") for n in range(na, nb + 1)]


def _joined(text: str, *, strip_comments: bool) -> tuple[str, list[int]]:
    """The text with every line's indentation (and, in code, its comment marker) removed
    and the lines joined by one space, so a citation wrapped over two lines reads as one;
    and the offset at which each line starts."""
    parts: list[str] = []
    starts: list[int] = []
    offset = 0
    for line in text.splitlines():
        content = line.strip()
        if strip_comments:
            content = re.sub(r"^#+:?\s*", "", content)
        starts.append(offset)
        parts.append(content)
        offset += len(content) + 1
    return " ".join(parts), starts


def _line_of(starts: list[int], offset: int) -> int:
    lo, hi = 0, len(starts)
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        if starts[mid] <= offset:
            lo = mid
        else:
            hi = mid
    return lo + 1


def citations(text: str, path: str = "<text>", *, code: bool | None = None) -> list[Citation]:
    """Every citation in ``text``, in order. ``code``: strip ``#`` comment markers from the
    start of lines (default: when ``path`` is not a Markdown file)."""
    if code is None:
        code = not path.endswith(".md")
    joined, starts = _joined(text, strip_comments=code)
    out: list[Citation] = []
    for m in _CITATION.finditer(joined):
        g = m.groupdict()
        written = re.sub(r"\s+", " ", m.group(0)).strip()
        line = _line_of(starts, m.start())
        if g["out"]:
            out.append(Citation(path, line, written, outside=g["out"].rstrip("/")))
        elif g["specrows"]:
            rows = tuple(int(n) for n in _numbers(g["specrows"]) if n.isdigit())
            out.append(Citation(path, line, written, labels=("B.3",), rows=rows))
        elif g["letters"] or g["bare_letters"]:
            letters = _letters(g["letters"] or g["bare_letters"])
            out.append(Citation(path, line, written, labels=tuple(letters)))
        elif g["range_a"]:
            a, b = normalize(g["range_a"]), normalize(g["range_b"])
            labels: list[str] = [a, b]
            if a[0] == b[0]:
                na, nb = int(a.split(".")[1]), int(b.split(".")[1])
                labels = [f"{a[0]}.{n}" for n in range(na, nb + 1)] or labels
            out.append(Citation(path, line, written, labels=tuple(labels)))
        elif g["sec"]:
            sec = normalize(g["sec"])
            kind = "row" if g["r"] else (g["kind"] or "").rstrip("s")
            if not kind:
                out.append(Citation(path, line, written, labels=(sec,)))
            elif kind == "row" and sec == "B.3":
                rows = tuple(int(n) for n in _numbers(g["nums"]) if n.isdigit())
                out.append(Citation(path, line, written, labels=(sec,), rows=rows))
            else:
                labels = [f"{sec} {kind} {n}" for n in _numbers(g["nums"])]
                out.append(Citation(path, line, written, labels=(sec, *labels)))
        elif g["item_a"]:
            out.append(
                Citation(path, line, written, labels=tuple(_item_range(g["item_a"], g["item_b"])))
            )
        elif g["item"]:
            out.append(Citation(path, line, written, labels=(normalize(g["item"]),)))
    return out


# --------------------------------------------------------------------------------------
# What docs/spec.md defines
# --------------------------------------------------------------------------------------

#: A numbered label: ``B.3``, ``D.1 step 6.3``, ``F.25``, ``C10``, ``G8``, ``S12``.
_LABEL = r"[A-H]\.\d+(?:\s+step\s+\d+(?:\.\d+)?)?|[CFGS]\.?\d+"
#: A heading starting with a label, or a top-level one starting ``X.`` (``## A. The pool``).
_HEADING = re.compile(
    rf"^(?P<level>#{{1,6}})\s+(?P<label>(?:{_LABEL})(?=[\s.:)]|$)|[A-HS](?=\.\s))"
)
#: A bolded item (alone or as a list item) starting with a numbered label.
_BOLD = re.compile(rf"^\s*(?:[-*+]\s+|\d+\.\s+)?\*\*(?P<label>{_LABEL})(?=[\s.:*)]|$)")
_TABLE_ROW = re.compile(r"^\|\s*(\d+)\s*\|")


@dataclass
class SpecIndex:
    """The labels docs/spec.md defines, and the numbered rows of its B.3 table."""

    labels: set[str] = field(default_factory=set)
    b3_rows: dict[int, str] = field(default_factory=dict)


def spec_index(text: str) -> SpecIndex:
    """Parse docs/spec.md: every heading or bolded item whose text starts with a label,
    and the rows ``| N | ...`` of the table under the ``B.3`` heading."""
    index = SpecIndex()
    in_b3: int | None = None  # the B.3 heading's level while inside it
    for line in text.splitlines():
        heading = _HEADING.match(line)
        any_heading = re.match(r"^(#{1,6})\s", line)
        if any_heading and in_b3 is not None and len(any_heading.group(1)) <= in_b3:
            in_b3 = None
        if heading:
            label = normalize(re.sub(r"\s+", " ", heading.group("label")))
            index.labels.add(label)
            if label == "B.3":
                in_b3 = len(heading.group("level"))
            continue
        bold = _BOLD.match(line)
        if bold:
            index.labels.add(normalize(re.sub(r"\s+", " ", bold.group("label"))))
        row = _TABLE_ROW.match(line)
        if row and in_b3 is not None:
            index.b3_rows[int(row.group(1))] = line
    return index


# --------------------------------------------------------------------------------------
# The check
# --------------------------------------------------------------------------------------


def scanned_files(root: Path = ROOT) -> list[Path]:
    """The files whose citations must resolve (this checker itself excepted: it spells out
    the forms it rejects)."""
    out: list[Path] = []
    for d in SOURCE_DIRS:
        base = root / d
        if base.is_dir():
            out += sorted(p for p in base.rglob("*.py") if "__pycache__" not in p.parts)
    docs = root / "docs"
    if docs.is_dir():
        for p in sorted(docs.rglob("*.md")):
            rel = p.relative_to(docs)
            if rel == Path("spec.md") or rel.parts[0] in ("api", "spec"):
                continue
            out.append(p)
    out += [root / name for name in TOP_FILES if (root / name).is_file()]
    this = Path(__file__).resolve()
    return [p for p in out if p.resolve() != this]


def unresolved(cites: Iterable[Citation], index: SpecIndex) -> list[str]:
    """Part (a): ``path:line: text`` for every citation naming what docs/spec.md lacks."""
    out = []
    for c in cites:
        if c.outside:
            continue
        missing = [label for label in c.labels if label not in index.labels]
        missing += [f"B.3 row {n}" for n in c.rows if n not in index.b3_rows]
        if missing:
            out.append(f"{c.where()}  [not in docs/spec.md: {', '.join(missing)}]")
    return out


def outside(cites: Iterable[Citation]) -> list[str]:
    """Part (b): ``path:line: text`` for every citation of a document outside the checkout,
    with its rewrite."""
    return [
        f"{c.where()}  [cites {c.outside}; write {rewrite(c.text)!r}]" for c in cites if c.outside
    ]


#: How a citation of the design notes is written against docs/spec.md (part (b)).
#: ``CHECKING.md`` sections: 1.4 (Hypothesis settings profiles) is H.5, 2 (CrossHair) is
#: H.6, 3.6 (trace validation) is H.8.
_CHECKING_SECTIONS = {"1.4": "H.5", "2": "H.6", "3.6": "H.8"}


def rewrite(text: str) -> str:
    """The form a citation of an outside document takes in this project.

    ``SCENARIOS S5`` -> ``SPEC S5``; ``SCENARIOS.md S1-S16`` -> ``SPEC S1-S16``;
    ``SCENARIOS.md`` -> ``SPEC section S``; ``ARCHITECTURE layer 3`` -> ``SPEC H.3``;
    ``CHECKING.md section 3.6`` / ``CHECKING.md 1.4`` / ``design/CHECKING.md section 2``
    -> ``SPEC H.8`` / ``SPEC H.5`` / ``SPEC H.6``; ``shared/design`` -> ``docs/spec.md``.
    Anything else is returned unchanged (a rule is missing: the test then fails)."""
    t = re.sub(r"\s+", " ", text.strip())
    m = re.fullmatch(r"SCENARIOS(?:\.md)? (S\d+(?: ?- ?S\d+)?)", t)
    if m:
        return f"SPEC {m.group(1)}"
    if re.fullmatch(r"SCENARIOS(?:\.md)?", t):
        return "SPEC section S"
    m = re.fullmatch(r"ARCHITECTURE(?:\.md)? layers? (\d+)(?: ?- ?(\d+))?", t)
    if m:
        return f"SPEC H.{m.group(1)}" + (f"-H.{m.group(2)}" if m.group(2) else "")
    m = re.fullmatch(r"(?:(?:shared/)?design/)?CHECKING\.md (?:sections? )?(\d+(?:\.\d+)*)", t)
    if m and m.group(1) in _CHECKING_SECTIONS:
        return f"SPEC {_CHECKING_SECTIONS[m.group(1)]}"
    if t.rstrip("/") in ("shared/design", "design"):
        return "docs/spec.md"
    return text


def _scan(files: Iterable[Path]) -> Iterator[Citation]:
    for p in files:
        text = p.read_text(encoding="utf-8")
        yield from citations(text, str(p.relative_to(ROOT)))


def _index() -> SpecIndex:
    return spec_index(SPEC_DOC.read_text(encoding="utf-8"))


def test_every_cited_section_exists_in_docs_spec() -> None:
    """(a): every section, item, step and B.3 row the project cites is in docs/spec.md."""
    bad = unresolved(_scan(scanned_files()), _index())
    assert not bad, "citations docs/spec.md does not resolve:\n" + "\n".join(bad)


def test_no_citation_of_a_document_outside_the_checkout() -> None:
    """(b): nothing cites the design notes that live outside the checkout."""
    bad = outside(_scan(scanned_files()))
    assert not bad, "citations of documents outside the checkout:\n" + "\n".join(bad)


def test_docs_spec_cites_only_itself() -> None:
    """docs/spec.md's own cross-references resolve, and it cites no outside document."""
    text = SPEC_DOC.read_text(encoding="utf-8")
    cites = citations(text, "docs/spec.md")
    bad = unresolved(cites, spec_index(text)) + outside(cites)
    assert not bad, "\n".join(bad)


def test_every_outside_citation_has_a_home_in_docs_spec() -> None:
    """The rewrite of each outside citation (part (b)) names a section docs/spec.md has, so
    rewriting them keeps part (a) green."""
    index = _index()
    problems = []
    for c in _scan(scanned_files()):
        if not c.outside:
            continue
        new = rewrite(c.text)
        if new == c.text:
            problems.append(f"{c.where()}  [no rewrite rule]")
            continue
        if new == "docs/spec.md":
            continue
        problems += unresolved(citations(new, c.path), index)
    assert not problems, "\n".join(problems)


def test_the_checker_reports_a_missing_section_and_an_outside_document() -> None:
    text = (
        "Release once (SPEC B.3 row 9, G3).\n"
        "See SPEC B.3\n"
        "    row 99 and SPEC D.1 step 6.7, and G12.\n"
        "# A scenario (SCENARIOS.md S3).\n"
    )
    index = spec_index(
        "### B.3 Transition table\n\n| # | event |\n|---|---|\n| 9 | release |\n\n"
        "### D.1 The pass\n\n#### D.1 step 6 Drain\n\n- **D.1 step 6.3** scratch\n\n"
        "### G3 Single-use leases\n\n## S. Failure scenarios\n\n### S3 Preemption\n"
    )
    cites = citations(text, "example.py")
    bad = unresolved(cites, index)
    assert any(b.startswith("example.py:2: SPEC B.3 row 99") for b in bad), bad
    assert any("D.1 step 6.7" in b and b.startswith("example.py:3:") for b in bad), bad
    assert any(b.startswith("example.py:3: G12") for b in bad), bad
    assert not any(b.startswith("example.py:1:") for b in bad), bad  # row 9 and G3 exist
    out = outside(cites)
    assert len(out) == 1 and out[0].startswith("example.py:4: SCENARIOS.md S3"), out
    assert "'SPEC S3'" in out[0]
    assert unresolved(citations(rewrite("SCENARIOS.md S3"), "x"), index) == []


def test_citation_forms_and_false_positives() -> None:
    """The forms the project writes are read as citations; identifiers, hex strings, paths
    and metavars are not."""

    def labels(text: str) -> list[str]:
        return [lab for c in citations(text, "x.py") for lab in c.labels]

    assert labels("SPEC B.4; B.3 rows 15-17") == ["B.4", "B.3"]
    assert [c.rows for c in citations("SPEC B.3 rows 3, 6, 9", "x.py")] == [(3, 6, 9)]
    assert [c.rows for c in citations("(B.3 r6, S11)", "x.py")] == [(6,), ()]
    assert labels("SPEC D.1 steps 9, 10, G5") == ["D.1", "D.1 step 9", "D.1 step 10", "G5"]
    assert labels("D.1 step 6.3: counted") == ["D.1", "D.1 step 6.3"]
    assert labels("SPEC sections A-D, F, G") == ["A", "B", "C", "D", "F", "G"]
    assert labels("SPEC E.4, F57-F60, F63") == ["E.4", "F.57", "F.58", "F.59", "F.60", "F.63"]
    assert labels("SPEC F.47 / C.10 and C13") == ["F.47", "C.10", "C.13"]
    assert labels("SPEC A.2-A.4, G9") == ["A.2", "A.3", "A.4", "G9"]
    assert labels("(SPEC C).") == ["C"] and labels("SPEC D with G1") == ["D", "G1"]
    assert labels("section G's improvements") == ["G"]
    assert labels('metavar="G[,G2,...]"') == []
    assert labels("0xG8 abcS12 x_G8 F8b path/S5.py v1.2 TYPE_CHECKING") == []
    assert [c.rows for c in citations("(SPEC row 22)", "x.py")] == [(22,)]
    out = [c.text for c in citations("CHECKING.md section 3.6; ARCHITECTURE layer 3", "x")]
    assert out == ["CHECKING.md section 3.6", "ARCHITECTURE layer 3"]
    assert [c.outside for c in citations("if TYPE_CHECKING:", "x.py")] == []
    assert rewrite("ARCHITECTURE layer 3") == "SPEC H.3"
    assert rewrite("design/CHECKING.md section 2") == "SPEC H.6"
    assert rewrite("SCENARIOS S5") == "SPEC S5"


def _tables_notes() -> dict[int, set[tuple[str, int]]]:
    """``{B.3 row: {(machine, row index)}}`` from the notes of spec/tables.py."""
    from pagedstate.spec.tables import TABLES

    out: dict[int, set[tuple[str, int]]] = {}
    for machine, table in TABLES.items():
        for i, row in enumerate(table.rows):
            for c in citations(row.note, "tables.py"):
                for n in c.rows:
                    out.setdefault(n, set()).add((machine, i))
    return out


def test_b3_rows_name_the_table_rows_that_cite_them() -> None:
    """Each B.3 row of docs/spec.md lists (as ``machine #i``) exactly the rows of
    spec/tables.py whose note cites it, so the two numberings stay tied."""
    index = _index()
    notes = _tables_notes()
    problems = []
    for n, line in sorted(index.b3_rows.items()):
        listed = set()
        for machine, ids in re.findall(r"`?(\w+)((?:\s*#\d+,?)+)`?", line):
            for i in re.findall(r"#(\d+)", ids):
                listed.add((machine, int(i)))
        if listed != notes.get(n, set()):
            problems.append(
                f"B.3 row {n}: docs/spec.md lists {sorted(listed)},"
                f" spec/tables.py notes cite it from {sorted(notes.get(n, set()))}"
            )
    for n in sorted(set(notes) - set(index.b3_rows)):
        problems.append(f"spec/tables.py cites B.3 row {n}, which docs/spec.md lacks")
    assert not problems, "\n".join(problems)
