"""where=: a small, safe filter language over attribute columns, evaluated per shard with pyarrow.compute.

    lang == 'en' and gopher_quality
    lang in ['en', 'de'] and lang_score >= 0.65 and not exact_dup
    0.1 < text_chars / ... (no arithmetic: comparisons only), near_dup_cluster == None

Grammar: comparisons (== != < <= > >=, chained as in Python), `in` / `not in` a list of literals,
`and` / `or` / `not`, parentheses, a bool column alone, and literals (numbers, 'strings', True,
False, None; `== None` / `is None` test for a missing value). The text is parsed by Python's `ast`
and every node is checked against a whitelist: nothing is ever evaluated as Python. Column names and
types are checked against the dataset's attribute columns before anything is read.

A comparison with a missing value (null) is false, and so is its negation (SQL's rule): `not
gopher_quality` does not keep samples that have no score.
"""

from __future__ import annotations

import ast

from shardkit.errors import ConfigError

_COMPARE = {ast.Eq: "equal", ast.NotEq: "not_equal", ast.Lt: "less", ast.LtE: "less_equal",
            ast.Gt: "greater", ast.GtE: "greater_equal"}
_KIND = {"bool": "bool", "string": "string"}  # every other recorded type is a number
EXAMPLE = "e.g. \"lang == 'en' and gopher_quality\""


def kind_of(type_name: str) -> str:
    return _KIND.get(type_name, "number")


def _literal_kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    return "string" if isinstance(value, str) else "number"


class Where:
    """A parsed where= expression: `columns` it reads, `text` in canonical form, `mask(table)`.

    `types` is {column: recorded type name} of the dataset (manifest attributes); a name not among
    them, a comparison of a column with a literal of another kind, or anything outside the grammar
    is a one-line ConfigError that names the available columns.
    """

    def __init__(self, expression: str, types: dict):
        self.expression, self.types = expression, dict(types)
        if not isinstance(expression, str) or not expression.strip():
            self._fail("expected a non-empty string")
        try:
            tree = ast.parse(expression.strip(), mode="eval")
        except SyntaxError as e:
            self._fail(f"is not an expression shardkit reads ({e.msg}, column {e.offset})")
        self.columns: list[str] = []
        self._check(tree.body, want="bool")
        self.tree = tree.body
        self.text = ast.unparse(tree.body)  # canonical: spacing and quotes normalised

    def _fail(self, problem: str, grammar: bool = True):
        cols = ", ".join(f"{c} ({t})" for c, t in sorted(self.types.items())) or \
            "none (add some with `shardkit annotate DATASET --scorers ...`)"
        how = f"; write comparisons joined by and/or/not, {EXAMPLE}" if grammar else ""
        raise ConfigError(f"where={self.expression!r}: {problem}{how}; available columns: {cols}")

    def _check(self, node, want: str) -> str:
        """The kind of `node`'s value (bool, number, string, null, list), checked as it goes."""
        if isinstance(node, ast.BoolOp):
            for v in node.values:
                self._check(v, "bool")
            return "bool"
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            self._check(node.operand, "bool")
            return "bool"
        if isinstance(node, ast.Compare):
            self._compare(node)
            return "bool"
        kind = self._operand(node)
        if want == "bool" and kind != "bool":
            self._fail(f"{ast.unparse(node)!r} is not a condition (a {kind}): compare it, e.g. "
                       f"{ast.unparse(node)} == ...")
        return kind

    def _operand(self, node) -> str:
        if isinstance(node, ast.Name):
            if node.id not in self.types:
                self._fail(f"no attribute column {node.id!r}", grammar=False)
            if node.id not in self.columns:
                self.columns.append(node.id)
            return kind_of(self.types[node.id])
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)) and _number(node.operand):
            return "number"
        if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (bool, int, float, str))):
            return _literal_kind(node.value)
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            kinds = {self._operand(e) for e in node.elts}
            if not all(isinstance(e, ast.Constant) or _number(e) for e in node.elts) or len(kinds) > 1:
                self._fail(f"{ast.unparse(node)} must list literals of one kind (numbers, or strings, or bools)")
            return "list:" + (kinds.pop() if kinds else "empty")
        self._fail(f"{ast.unparse(node)!r} ({type(node).__name__}) is not allowed")

    def _compare(self, node: ast.Compare) -> None:
        operands = [node.left, *node.comparators]
        kinds = [self._operand(o) for o in operands]
        for op, (a, ka), (b, kb) in zip(node.ops, zip(operands, kinds), zip(operands[1:], kinds[1:])):
            text = ast.unparse(ast.Compare(left=a, ops=[op], comparators=[b]))
            if isinstance(op, (ast.In, ast.NotIn)):
                if not kb.startswith("list:") or kb[5:] not in (ka, "empty"):
                    self._fail(f"{text!r}: `in` takes a column on its left and a list of literals of its kind on "
                               "its right")
                continue
            if kb.startswith("list:") or ka.startswith("list:"):
                self._fail(f"{text!r}: a list goes only after `in`")
            if isinstance(op, (ast.Is, ast.IsNot)) or "null" in (ka, kb):
                if "null" not in (ka, kb) or not isinstance(op, (ast.Is, ast.IsNot, ast.Eq, ast.NotEq)):
                    self._fail(f"{text!r}: None is tested with == None, != None, is None or is not None")
                continue
            if type(op) not in _COMPARE:
                self._fail(f"{text!r}: operator not allowed")
            if ka != kb:
                self._fail(f"{text!r} compares a {ka} with a {kb}")
            if ka == "bool" and type(op) not in (ast.Eq, ast.NotEq):
                self._fail(f"{text!r}: bools compare only with == and !=")

    def mask(self, table):
        """The expression over an Arrow table holding its columns: a numpy bool array, null = False."""
        import pyarrow.compute as pc

        return pc.fill_null(_evaluate(self.tree, table), False).to_numpy(zero_copy_only=False)

    def conditions(self) -> list[str]:
        """The expression's comparisons and bare bool columns, in reading order (each once): what an
        empty selection is explained by."""
        out = []

        def visit(node) -> None:
            if isinstance(node, ast.BoolOp):
                for v in node.values:
                    visit(v)
            elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
                visit(node.operand)
            elif isinstance(node, (ast.Compare, ast.Name)) and ast.unparse(node) not in out:
                out.append(ast.unparse(node))

        visit(self.tree)
        return out

    def passing(self, table) -> dict:
        """{condition: rows of `table` it holds for (null = no)} for each of conditions()."""
        import pyarrow.compute as pc

        return {c: int(pc.sum(pc.fill_null(_evaluate(ast.parse(c, mode="eval").body, table), False)).as_py() or 0)
                for c in self.conditions()}

    def __repr__(self) -> str:
        return f"Where({self.text!r})"


def _number(node) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _number(node.operand)
    return isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool)


def _value(node, table):
    """An operand: a column of `table`, or a literal (a Python value; lists for `in`)."""
    if isinstance(node, ast.Name):
        return table.column(node.id)
    return ast.literal_eval(node)  # only literals reach here: _check refused everything else


def _evaluate(node, table):
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(node, ast.BoolOp):
        combine = pc.and_kleene if isinstance(node.op, ast.And) else pc.or_kleene
        out = _evaluate(node.values[0], table)
        for v in node.values[1:]:
            out = combine(out, _evaluate(v, table))
        return out
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return pc.invert(_evaluate(node.operand, table))
    if isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        out = None
        for op, a, b in zip(node.ops, operands, operands[1:]):
            part = _pair(op, _value(a, table), _value(b, table), table.num_rows)
            out = part if out is None else pc.and_kleene(out, part)
        return out
    value = _value(node, table)
    return value if not isinstance(value, bool) else pa.array([value] * table.num_rows, pa.bool_())


def _pair(op, a, b, n: int):
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(op, (ast.In, ast.NotIn)):
        values = pa.array(list(b)) if len(b) else pa.array([], a.type)  # is_in casts them to the column's type
        found = pc.is_in(a, value_set=values)
        found = pc.if_else(pc.is_valid(a), found, pa.scalar(None, pa.bool_()))  # null stays unknown
        return found if isinstance(op, ast.In) else pc.invert(found)
    if a is None or b is None:  # == None / is None and their negations
        column = b if a is None else a
        if not isinstance(column, (pa.ChunkedArray, pa.Array)):  # None == None, a literal against None
            same = column is None
            return pa.array([same == isinstance(op, (ast.Eq, ast.Is))] * n, pa.bool_())
        return pc.is_null(column) if isinstance(op, (ast.Eq, ast.Is)) else pc.is_valid(column)
    out = getattr(pc, _COMPARE[type(op)])(a, b)
    if isinstance(out, pa.Scalar):  # two literals
        return pa.array([out.as_py()] * n, pa.bool_())
    return out
