"""Document scorers: each gives a document's signals and a keep/drop verdict. Registry: FILTERS.

A scorer built by `FILTERS[name](**options)` has `name`, `columns` ({column: pyarrow type}: its
signals and, for a filter, one bool verdict column), `score(text) -> {column: value}` (pure and
deterministic: the same text gives the same values in any process) and `keep(scores) -> (bool,
rule or None)`; optionally `edit(text)`, the text the next scorer sees. A bool column `score` leaves
out is the verdict, `keep`'s answer. `build --filter` drops what `keep` refuses; `build --annotate`
and `shardkit annotate` store the values as attribute columns, so `where=` can choose at training time.
"""

from __future__ import annotations

from shardkit.stages.filters.length import TextLength

FILTERS = {"text-length": TextLength}
