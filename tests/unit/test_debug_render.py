"""The debug view's tables: changed cells, added and removed rows and columns marked in HTML (inline
styles, so an untrusted notebook keeps them) and in text; long values clipped, never wrapped."""

from __future__ import annotations

import html
import re

import pyarrow as pa

from streamling.notebook import render

BEFORE = pa.table({"id": [1, 2, 3], "customer": ["al", "bo", "cy"], "amount": [10, 20, 30], "note": ["a", "b", "c"]})
#: id 2 dropped, id 1's customer and id 3's amount changed, id 9 added; column note removed, twice added.
AFTER = pa.table({"id": [3, 1, 9], "customer": ["cy", "AL", "di"], "amount": [31, 10, 5], "twice": [62, 20, 10]})


def _panel(page: str, title: str) -> str:
    """The HTML of the panel titled ``title``."""
    start = page.index(f"<b>{title}</b>")
    return page[start:page.index("</table>", start)]


def _cells(panel: str, mark: str) -> list[str]:
    """The texts of the ``td`` cells of ``panel`` with the given mark."""
    return re.findall(rf'<td style="[^"]*" class="sl-{mark}"[^>]*>([^<]*)</td>', panel)


def test_cells_are_matched_by_key_and_exactly_the_changed_ones_are_marked() -> None:
    view = render.debug_view("summary", {}, BEFORE, AFTER, key=["id"])
    now = _panel(str(view.html), "output now")
    assert _cells(now, "changed") == ["31", "AL"]  # rows in AFTER's order: id 3, then id 1
    assert 'class="sl-changed" title="before the edit: 30">31</td>' in now
    assert 'class="sl-changed" title="before the edit: al">AL</td>' in now
    assert render.MARK_STYLES["changed"] in now  # inline: survives a sanitized (untrusted) output
    # The added row (id 9) is marked as a whole, the added column's header and cells too.
    assert '<tr class="sl-added"><td style="white-space:nowrap;' in now
    assert '<th style="white-space:nowrap;' + render.MARK_STYLES["added"] + '" class="sl-added" ' in now
    assert _cells(now, "added") == ["62", "20", "9", "di", "5", "10"]


def test_removed_rows_and_columns_are_struck_through_in_the_before_panel() -> None:
    before = _panel(str(render.debug_view("s", {}, BEFORE, AFTER, key=["id"]).html), "output before the edit")
    assert "line-through" in render.MARK_STYLES["removed"]
    assert '<tr class="sl-removed">' in before and before.count('<tr class="sl-removed">') == 1
    assert _cells(before, "removed") == ["a", "2", "bo", "20", "b", "c"]  # note's cells, and the row of id 2
    assert 'class="sl-removed" title="column removed">-note</th>' in before
    assert "sl-changed" not in before and "sl-added" not in before


def test_without_a_key_rows_are_matched_by_position() -> None:
    before = pa.table({"v": [1, 2, 3], "s": ["a", "b", "c"]})
    after = pa.table({"v": [1, 5, 3, 4], "s": ["a", "b", "C", "d"]})
    diff = render.diff_tables(before, after)
    assert diff.matches == [0, 1, 2, None] and diff.removed_rows == []
    assert diff.changed == {(1, "v"): 2, (2, "s"): "c"}
    now = _panel(str(render.debug_view("s", {}, before, after).html), "output now")
    assert _cells(now, "changed") == ["5", "C"] and _cells(now, "added") == ["4", "d"]


def test_without_a_key_a_dropped_row_is_removed_not_every_later_row_changed() -> None:
    before = pa.table({"v": [1, 2, 3, 4]})
    diff = render.diff_tables(before, pa.table({"v": [1, 3, 4]}))
    assert diff.matches == [0, 2, 3] and diff.removed_rows == [1] and diff.changed == {}


def test_a_key_missing_from_either_side_falls_back_to_position() -> None:
    diff = render.diff_tables(pa.table({"k": [1, 2], "v": [1, 2]}), pa.table({"v": [1, 7]}), key=["k"])
    assert diff.key == [] and diff.changed == {(1, "v"): 2} and diff.columns_removed == ["k"]


def test_repeated_keys_pair_up_in_order_and_nan_stays_unchanged() -> None:
    before = pa.table({"k": [1, 1], "x": [float("nan"), 1.0]})
    diff = render.diff_tables(before, pa.table({"k": [1, 1], "x": [float("nan"), 2.0]}), key=["k"])
    assert diff.matches == [0, 1] and diff.changed == {(1, "x"): 1.0}


def test_long_values_do_not_wrap_and_are_clipped_with_the_whole_value_in_the_title() -> None:
    long = "x" * 100
    page = render.side_by_side([("t", pa.table({"a": [long], "b": ["short"]}))])
    assert re.findall(r'<td style="([^"]*)"', page) == ["white-space:nowrap"] * 2
    assert re.findall(r'<th style="([^"]*)"', page) == ["white-space:nowrap"] * 2
    assert f'title="{long}">{"x" * (render.HTML_CLIP - 1)}…</td>' in page
    assert '<td style="white-space:nowrap">short</td>' in page  # a short value has no tooltip


def test_panels_scroll_on_their_own_and_wrap_instead_of_clipping_columns() -> None:
    page = render.side_by_side([("a", pa.table({"x": [1]})), ("b", None)])
    assert page.startswith('<div style="display:flex;flex-wrap:wrap;')
    panels = re.findall(r'<div style="(flex:[^"]*)">', page)
    assert len(panels) == 2 and all("overflow-x:auto" in p and "max-width:100%" in p for p in panels)
    assert not re.search(r"(?<![a-z-])width:", page)  # no fixed width to cut a panel off


def test_text_marks_changed_cells_added_and_removed_rows_and_columns() -> None:
    text = render.debug_view("'t' re-run", {"orders": BEFORE}, BEFORE, AFTER, key=["id"]).text
    lines = [line.rstrip() for line in text.splitlines()]  # columns are padded as in a preview
    assert lines[:4] == ["'t' re-run", "", "input: orders (3 rows)", "id  customer  amount  note"]
    assert lines[8:14] == ["output before the edit (3 rows)",
                           "  id  customer  amount  -note",
                           "  1   al        10      a",
                           "- 2   bo        20      b",
                           "  3   cy        30      c",
                           ""]
    assert lines[14:20] == ["output now (3 rows)",
                            "  id  customer  amount  +twice",
                            "  3   cy        31*     62",
                            "  1   AL*       10      20",
                            "+ 9   di        5       10",
                            ""]
    assert lines[20:] == ["changed cells:", "  id=3: amount 30 → 31", "  id=1: customer 'al' → 'AL'"]


def test_changes_beyond_the_shown_rows_are_counted() -> None:
    before = pa.table({"id": list(range(30)), "v": [0] * 30})
    after = pa.table({"id": list(range(1, 31)), "v": [0] * 28 + [1, 0]})
    view = render.debug_view("s", {}, before, after, key=["id"], max_rows=10)
    assert "… 20 more rows (1 added, 1 changed)" in view.text
    assert "… 20 more rows (1 added, 1 changed)" in str(view.html)


def test_an_unchanged_definition_shows_one_output_panel_without_marks() -> None:
    view = render.debug_view("s", {}, AFTER, AFTER, key=["id"])
    assert "output before the edit" not in view.text and "sl-" not in str(view.html).replace("sl-table", "")
    assert "changed cells" not in view.text


def test_the_summary_is_escaped() -> None:
    assert "<p>a &lt;b&gt;</p>" in str(render.debug_view("a <b>", {}, None, AFTER).html)


def test_schema_view_lists_columns_types_and_key_compactly() -> None:
    struct = "struct<" + ",".join(f"f{i}:string" for i in range(10)) + ">"
    view = render.schema_view("big", [("id", "bigint"), ("who", "string"), ("nested", struct)], ["id"])
    assert view.text == f"big → id: bigint, who: string,\n    nested: {struct} · key: id"  # breaks between columns
    page = str(view.html)
    assert '<u>id</u>: <span style="color:#777">bigint</span>' in page and "<u>who</u>" not in page
    clipped = html.escape(struct[:render.TYPE_CLIP - 1])
    assert f'<span style="color:#777" title="{html.escape(struct)}">{clipped}…</span>' in page
    assert page.count('<span style="white-space:nowrap">') == 3  # a column never breaks from its type


def test_every_row_of_a_sampled_batch_is_listed() -> None:
    before = pa.table({"id": list(range(20)), "v": [0] * 20})
    after = pa.table({"id": list(range(20)), "v": list(range(20))})
    view = render.debug_view("s", {"orders": before}, before, after, key=["id"])
    assert "more rows" not in view.text and "more changed cells" not in view.text
    assert view.text.count("  id=") == 19  # every changed cell named (id 0 kept its value)
