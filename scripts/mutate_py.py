"""Python mutants through cosmic-ray: which operators, stable ids, the session.

cosmic-ray finds the mutation sites (its ``init`` walk over the module's
syntax tree) and applies one (``mutating.mutate_code``); its session
database (a SQLite file per module, see ``session``) keeps each result
between runs. Its full operator set replaces every binary operator by
each of eleven others; here each site gets the one replacement that tests
the boundary or the direction (``<`` -> ``<=``, ``+`` -> ``-``, ...), which
keeps the count near one mutant per site.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from pathlib import Path

import cosmic_ray.plugins
from cosmic_ray.commands.init import _all_work_items
from cosmic_ray.mutating import mutate_code
from cosmic_ray.work_db import WorkDB
from cosmic_ray.work_item import WorkItem, WorkResult

OPERATORS = frozenset(
    "core/" + name
    for name in (
        "ReplaceComparisonOperator_Eq_NotEq ReplaceComparisonOperator_NotEq_Eq "
        "ReplaceComparisonOperator_Lt_LtE ReplaceComparisonOperator_LtE_Lt "
        "ReplaceComparisonOperator_Gt_GtE ReplaceComparisonOperator_GtE_Gt "
        "ReplaceComparisonOperator_Is_IsNot ReplaceComparisonOperator_IsNot_Is "
        "ReplaceBinaryOperator_Add_Sub ReplaceBinaryOperator_Sub_Add "
        "ReplaceBinaryOperator_Mul_Div ReplaceBinaryOperator_Div_Mul "
        "ReplaceBinaryOperator_FloorDiv_Mul ReplaceBinaryOperator_Mod_FloorDiv "
        "ReplaceBinaryOperator_LShift_RShift ReplaceBinaryOperator_RShift_LShift "
        "ReplaceBinaryOperator_BitAnd_BitOr ReplaceBinaryOperator_BitOr_BitAnd "
        "ReplaceBinaryOperator_BitXor_BitOr ReplaceBinaryOperator_Pow_Mul "
        "ReplaceUnaryOperator_USub_UAdd ReplaceUnaryOperator_Delete_Not "
        "ReplaceUnaryOperator_Invert_UAdd "
        "NumberReplacer AddNot ReplaceAndWithOr ReplaceOrWithAnd "
        "ReplaceTrueWithFalse ReplaceFalseWithTrue ZeroIterationForLoop "
        "ReplaceBreakWithContinue ReplaceContinueWithBreak ExceptionReplacer"
    ).split()
)


@dataclass(frozen=True)
class PyMutant:
    id: str
    path: str  # relative to the repository root
    line: int
    operator: str
    item: WorkItem  # cosmic-ray's work item (its job id keys the session)

    def apply(self, text: str) -> str:
        """The module's text with this mutant applied (cosmic-ray's rewrite)."""
        spec = self.item.mutations[0]
        operator = cosmic_ray.plugins.get_operator(spec.operator_name)(**spec.operator_args)
        mutated = mutate_code(text, operator, spec.occurrence)
        if mutated is None:
            raise ValueError(f"{self.id}: cosmic-ray found no such mutation")
        return mutated


def session(path: Path, module: str, repo: Path) -> WorkDB:
    """The module's cosmic-ray session at ``path``, made (cosmic-ray's init
    walk, our operator set) when it does not exist yet. Its work items name
    the module relative to the repository, so any scratch copy can use it."""
    fresh = not path.exists()
    db = WorkDB(str(path), WorkDB.Mode.create)
    if fresh or db.num_work_items == 0:
        items = []
        for item in _all_work_items([repo / module], {}):
            spec = item.mutations[0]
            if spec.operator_name not in OPERATORS:
                continue
            spec = type(spec)(
                module_path=module,
                operator_name=spec.operator_name,
                occurrence=spec.occurrence,
                start_pos=spec.start_pos,
                end_pos=spec.end_pos,
                operator_args=spec.operator_args,
                definition_name=spec.definition_name,
            )
            items.append(WorkItem.single(job_id=uuid.uuid4().hex, mutation=spec))
        db.add_work_items(items)
    return db


def mutants(db: WorkDB, module: str, text: str) -> list[PyMutant]:
    """The session's mutants with ids made from what they change (operator,
    the line's text, the column in it), not from their order."""
    lines = text.split("\n")
    seen: dict[str, int] = {}
    result = []
    # By the mutation itself, never by the work item's random job id: two
    # mutants of one operator at one position (NumberReplacer's +1 and -1)
    # get #1 and #2 in cosmic-ray's occurrence order, the same every run, so
    # an id listed as equivalent always names the same mutant.
    items = sorted(
        db.work_items,
        key=lambda w: (
            w.mutations[0].start_pos,
            w.mutations[0].operator_name,
            w.mutations[0].occurrence,
        ),
    )
    for item in items:
        spec = item.mutations[0]
        row, col = spec.start_pos
        line = lines[row - 1] if 0 < row <= len(lines) else ""
        indent = len(line) - len(line.lstrip())
        line_hash = hashlib.sha1(line.strip().encode()).hexdigest()[:8]
        op = spec.operator_name.removeprefix("core/")
        key = f"{module}:{op}:{line_hash}:{col - indent}"
        seen[key] = seen.get(key, 0) + 1
        mid = key if seen[key] == 1 else f"{key}#{seen[key]}"
        result.append(PyMutant(mid, module, row, op, item))
    return result


def record(db: WorkDB, mutant: PyMutant, result: WorkResult) -> None:
    db.set_result(mutant.item.job_id, result)


def results(db: WorkDB) -> dict[str, WorkResult]:
    """job id -> result, for the items the session has run."""
    return {item.job_id: result for item, result in db.completed_work_items}
