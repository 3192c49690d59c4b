"""Readers of the official record formats of 2WikiMultihopQA, MuSiQue and NQ-open, into `searchr1.data.Question`.

Validation is as strict as HotpotQA's (searchr1/data.py): a malformed record raises `DataError` naming the file,
the record (and line) and the field; nothing is dropped silently.
- 2WikiMultihopQA (Ho et al., 2020): `_id`, `type`, `question`, `answer`, `context` = [[title, [sentence, ...]],
  ...], `supporting_facts` = [[title, sent_id], ...], `evidences` = [[subject, relation, object], ...].
- MuSiQue-Ans (Trivedi et al., 2022): `id`, `question`, `answer`, `answer_aliases` = [str], `answerable` (must be
  true: the -Ans sets hold answerable questions only), `paragraphs` = [{idx, title, paragraph_text,
  is_supporting}], `question_decomposition` = [{...}]. The type is the id's hop prefix ("2hop", "3hop1", ...).
- NQ-open with its gold passage (lost-in-the-middle's `nq-open-oracle`): `question`, `answers` = [str],
  `ctxs` = [{title, text, ...}] (one gold passage). The records carry no id: the id is `nq_<line>`, the
  0-based line in that file.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

from searchr1.data import DataError, Question, _context, _field, _supporting, read_records


def _str_list(rec: dict, name: str, where: str, nonempty: bool = False) -> tuple[str, ...]:
    value = _field(rec, name, list, where)
    if not all(isinstance(v, str) for v in value):
        raise DataError(f"{where}: field '{name}' holds a non-string entry")
    if nonempty and not value:
        raise DataError(f"{where}: field '{name}' is empty")
    return tuple(value)


def _question(rec: dict, where: str) -> str:
    q = _field(rec, "question", str, where)
    if not q.strip():
        raise DataError(f"{where}: field 'question' is empty")
    return q


def parse_2wiki(rec: dict, where: str, index: int = 0) -> Question:
    qid = _field(rec, "_id", str, where)
    question, answer = _question(rec, where), _field(rec, "answer", str, where)
    evidences = _field(rec, "evidences", list, where)
    for j, ev in enumerate(evidences):
        if not (isinstance(ev, list) and len(ev) == 3 and all(isinstance(x, str) for x in ev)):
            raise DataError(f"{where}: field 'evidences' entry {j} is not [subject, relation, object]")
    context = _context(rec, where)
    facts = _supporting(rec, where)
    titles = {t for t, _ in context}
    lost = [t for t, _ in facts if t not in titles]
    if lost:
        raise DataError(f"{where}: field 'supporting_facts' names {lost[0]!r}, which is not in 'context'")
    return Question(qid=qid, question=question, answers=(answer,), type=_field(rec, "type", str, where), level="",
                    supporting_facts=facts, context=context, source=where)


def parse_musique(rec: dict, where: str, index: int = 0) -> Question:
    qid = _field(rec, "id", str, where)
    question, answer = _question(rec, where), _field(rec, "answer", str, where)
    aliases = _str_list(rec, "answer_aliases", where)
    if _field(rec, "answerable", bool, where) is not True:
        raise DataError(f"{where}: field 'answerable' is false (MuSiQue-Ans questions are all answerable)")
    _field(rec, "question_decomposition", list, where)
    context, facts = [], []
    for j, p in enumerate(_field(rec, "paragraphs", list, where)):
        at = f"{where}: field 'paragraphs' entry {j}"
        title, text = _field(p, "title", str, at), _field(p, "paragraph_text", str, at)
        if _field(p, "is_supporting", bool, at):
            facts.append((title, 0))
        context.append((title, (text,)))
    if not facts:
        raise DataError(f"{where}: field 'paragraphs' marks no paragraph as supporting")
    return Question(qid=qid, question=question, answers=(answer, *aliases), type=qid.split("__")[0], level="",
                    supporting_facts=tuple(facts), context=tuple(context), source=where)


def parse_nq(rec: dict, where: str, index: int) -> Question:
    question, answers = _question(rec, where), _str_list(rec, "answers", where, nonempty=True)
    ctxs = _field(rec, "ctxs", list, where)
    if not ctxs:
        raise DataError(f"{where}: field 'ctxs' is empty (each question needs its gold passage)")
    context = []
    for j, c in enumerate(ctxs):
        at = f"{where}: field 'ctxs' entry {j}"
        context.append((_field(c, "title", str, at), (_field(c, "text", str, at),)))
    return Question(qid=f"nq_{index}", question=question, answers=answers, type="single-hop", level="",
                    supporting_facts=((context[0][0], 0),), context=tuple(context), source=where)


def read_2wiki(path: str | Path) -> list[Question]:
    return read_records(Path(path), parse_2wiki)


def read_musique(path: str | Path) -> list[Question]:
    return read_records(Path(path), parse_musique)


def read_nq(path: str | Path) -> list[Question]:
    """JSON lines, gzip-compressed when the name ends in .gz."""
    path = Path(path)
    if path.suffix != ".gz":
        return read_records(path, parse_nq)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    out = []
    try:
        lines = gzip.open(path, "rt", encoding="utf-8").read().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: cannot read: {err}") from err
    for i, line in enumerate(lines):
        where = f"{path}: record {i} (line {i + 1})"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{where}: not valid JSON: {err.msg}") from err
        out.append(parse_nq(rec, where, i))
    if not out:
        raise DataError(f"{path}: holds no records")
    return out
