"""Synthetic document pages with known answers: forms, tables, bar charts, counting, multi-page files.

Built for a demo model of a few million parameters that sees each page as one small tile (64 or 128 px;
`tile_size`): glyphs are large and high-contrast, vocabularies are small, and every page is square so
the processor makes exactly one tile of it. Reading families (`doc_total`, `doc_name`, `doc_layout`,
`doc_table`, `doc_multipage`) can only be answered by reading digits or words from the pixels: labels
sit in random order and at random offsets, and each page carries a distractor field of the same kind.
Layout follows DocVQA / ChartQA question styles at toy scale (docs/eval_scoring.md §2).

Each generator is `gen(seed, index, *, tile_size=128, ...) -> Sample` and pure (see common.py).
"""

from __future__ import annotations

from PIL import Image, ImageDraw

from vl.errors import ConfigError

from .common import (
    COLOURS,
    GREY,
    INK,
    Sample,
    balanced_class,
    check_tile_size,
    draw_shape,
    draw_text,
    hairline,
    new_page,
    pick,
    rng_for,
    sample_id,
    text_size,
)

WORDS = ("RED", "BLUE", "CAT", "DOG", "SUN", "MOON", "TREE", "FISH")  # doc_name answers
HEADERS = ("RECEIPT", "INVOICE", "BILL", "ORDER")
TOTAL_DISTRACTORS = ("TAX", "ITEM", "FEE")
NAME_DISTRACTORS = ("CITY", "PET", "TEAM")
LAYOUT_LABELS = ("NAME", "DATE", "TOTAL", "CITY")
ROWS, COLS = ("A", "B"), ("X", "Y")
BAR_LABELS = ("A", "B", "C", "D")
FILLER_TITLES = ("NOTES", "DRAFT", "MEMO", "INDEX")
TOTALS = tuple(str(v) for v in range(10, 100))  # two-digit totals: 90 classes
TABLE_TEXT = 0.17  # doc_table's digit and label size, a fraction of the page


def _sample(family, seed, index, question, answer, reasoning, n_classes, cls, pages, **meta) -> Sample:
    meta.update(family=family, seed=seed, index=index, class_index=cls, n_classes=n_classes)
    return Sample(
        id=sample_id(family, seed, index),
        family=family,
        kind="document",
        question=question,
        answer=answer,
        reasoning=reasoning,
        chance=1.0 / n_classes,
        media=pages,
        metadata=meta,
    )


def _form_page(rng, S: int, fields, value_frac: float, header: bool = True):
    """A receipt-like page: optional coloured title, then `label  value` lines at a jittered origin.

    Returns the page and, per field, the value's ink box (so tests can re-read it from pixels).
    """
    page = new_page(S, rng)
    draw = ImageDraw.Draw(page)
    top = 0.06 * S
    if header:
        title = pick(rng, HEADERS)
        colour = COLOURS[pick(rng, tuple(COLOURS))]
        x = int(0.06 * S + rng.integers(0, int(0.1 * S) + 1))
        draw_text(draw, (x, int(top)), title, int(0.1 * S), colour, page=S)
        draw.line([(0.04 * S, 0.2 * S), (0.96 * S, 0.2 * S)], fill=GREY, width=hairline(S))
        top = 0.26 * S
    label_size, value_size = int(0.12 * S), int(value_frac * S)
    line_h = (0.97 * S - top) / len(fields)
    x0 = int(0.04 * S + rng.integers(0, int(0.06 * S) + 1))
    value_x = x0 + int(0.47 * S)  # clear of the widest label, TOTAL
    boxes = []
    for row, (label, value) in enumerate(fields):
        y = int(top + row * line_h + rng.integers(0, max(1, int(line_h - 0.2 * S))))
        _, vh = text_size(value, value_size)
        _, lh = text_size(label, label_size)
        draw_text(draw, (x0, y + max(0, vh - lh) // 2), label, label_size, INK, page=S)
        boxes.append(draw_text(draw, (value_x, y), value, value_size, INK, page=S))
    return page, boxes


def _receipt(rng, S: int, total: str):
    """The page that carries `TOTAL <total>` plus one distractor amount; shared with doc_multipage."""
    other_label = pick(rng, TOTAL_DISTRACTORS)
    other = pick(rng, TOTALS, exclude=(total,))
    fields = [("TOTAL", total), (other_label, other)]
    if rng.integers(2):
        fields.reverse()
    page, boxes = _form_page(rng, S, fields, 0.22)
    return page, [{"label": l, "value": v, "box": b} for (l, v), b in zip(fields, boxes)]


def doc_total(seed: int, index: int, *, tile_size: int = 128) -> Sample:
    """Read a two-digit amount: "What is the total?" on a receipt with a distractor amount."""
    S, fam = check_tile_size(tile_size), "doc_total"
    rng = rng_for(seed, fam, index)
    cls = balanced_class(seed, fam, index, len(TOTALS))
    total = TOTALS[cls]
    page, fields = _receipt(rng, S, total)
    return _sample(fam, seed, index, "What is the total?", total, f"the TOTAL line reads {total}",
                   len(TOTALS), cls, [page], fields=fields)


def doc_name(seed: int, index: int, *, tile_size: int = 128) -> Sample:
    """Read a word from an 8-word vocabulary: "What is the name?" next to a distractor word field."""
    S, fam = check_tile_size(tile_size), "doc_name"
    rng = rng_for(seed, fam, index)
    cls = balanced_class(seed, fam, index, len(WORDS))
    name = WORDS[cls]
    fields = [("NAME", name), (pick(rng, NAME_DISTRACTORS), pick(rng, WORDS, exclude=(name,)))]
    if rng.integers(2):
        fields.reverse()
    page, boxes = _form_page(rng, S, fields, 0.18)
    meta = [{"label": l, "value": v, "box": b} for (l, v), b in zip(fields, boxes)]
    return _sample(fam, seed, index, "What is the name?", name, f"the NAME field reads {name}",
                   len(WORDS), cls, [page], fields=meta)


def doc_layout(seed: int, index: int, *, tile_size: int = 128) -> Sample:
    """Layout: three labelled fields stacked; "Which field is at the top?" answers the first label."""
    S, fam = check_tile_size(tile_size), "doc_layout"
    rng = rng_for(seed, fam, index)
    cls = balanced_class(seed, fam, index, len(LAYOUT_LABELS))
    top_label = LAYOUT_LABELS[cls]
    labels = [top_label] + pick(rng, LAYOUT_LABELS, k=2, exclude=(top_label,))
    values = {
        "NAME": pick(rng, WORDS), "CITY": pick(rng, WORDS),
        "DATE": f"{int(rng.integers(1, 13)):02d}/{int(rng.integers(1, 29)):02d}", "TOTAL": pick(rng, TOTALS),
    }
    fields = [(l, values[l]) for l in labels]
    page, boxes = _form_page(rng, S, fields, 0.15, header=False)
    meta = [{"label": l, "value": v, "box": b} for (l, v), b in zip(fields, boxes)]
    return _sample(fam, seed, index, "Which field is at the top?", top_label,
                   "top to bottom: " + ", ".join(labels), len(LAYOUT_LABELS), cls, [page], fields=meta)


def doc_table(seed: int, index: int, *, tile_size: int = 128) -> Sample:
    """A 2x2 table of digits with row labels A/B and column labels X/Y; ask one cell."""
    S, fam = check_tile_size(tile_size), "doc_table"
    rng = rng_for(seed, fam, index)
    cls = balanced_class(seed, fam, index, 10)
    r, c = int(rng.integers(2)), int(rng.integers(2))
    cells = [[int(v) for v in rng.integers(0, 10, size=2)] for _ in range(2)]
    cells[r][c] = cls
    page = new_page(S, rng)
    draw = ImageDraw.Draw(page)
    cell = int(0.29 * S)
    ox = int(0.03 * S + rng.integers(0, int(0.1 * S) + 1))
    oy = int(0.03 * S + rng.integers(0, int(0.1 * S) + 1))
    draw.rectangle([ox, oy, ox + 3 * cell, oy + cell], fill=(225, 225, 225))
    draw.rectangle([ox, oy, ox + cell, oy + 3 * cell], fill=(225, 225, 225))
    width = hairline(S)
    for k in range(4):
        draw.line([(ox, oy + k * cell), (ox + 3 * cell, oy + k * cell)], fill=INK, width=width)
        draw.line([(ox + k * cell, oy), (ox + k * cell, oy + 3 * cell)], fill=INK, width=width)
    size = int(TABLE_TEXT * S)
    boxes = {}

    def put(col: int, row: int, text: str):
        w, h = text_size(text, size)
        xy = (ox + col * cell + (cell - w) // 2, oy + row * cell + (cell - h) // 2)
        return draw_text(draw, xy, text, size, page=S)

    for j, name in enumerate(COLS):
        put(j + 1, 0, name)
    for i, name in enumerate(ROWS):
        put(0, i + 1, name)
        for j in range(2):
            boxes[f"{name}{COLS[j]}"] = put(j + 1, i + 1, str(cells[i][j]))
    q = f"What is the value in row {ROWS[r]}, column {COLS[c]}?"
    # The trace reads the whole table in order before naming the cell (as doc_layout's lists every field):
    # a cell token holds only its digit, so finding "row B, column Y" means locating it by position, and the
    # answer-only trace "row B, column Y holds 2" left the demo model picking any cell's digit (28%).
    read = "; ".join(f"row {name}: " + ", ".join(f"{COLS[j]} {cells[i][j]}" for j in range(2))
                     for i, name in enumerate(ROWS))
    return _sample(fam, seed, index, q, str(cls), f"{read}; row {ROWS[r]}, column {COLS[c]} holds {cls}", 10, cls,
                   [page], cells=cells, row=ROWS[r], col=COLS[c], boxes=boxes)


def _bars(rng, S: int, heights_px, draw_axis_values: bool = False, step: float = 0.0):
    """Bar chart with labelled bars on a baseline; returns the page and each bar's box."""
    page = new_page(S, rng)
    draw = ImageDraw.Draw(page)
    base = int(0.84 * S)
    left = int(0.16 * S) if draw_axis_values else int(0.06 * S)
    n = len(heights_px)
    slot = (0.97 * S - left) / n
    bar_w = int(slot * 0.62)
    if draw_axis_values:
        for v in range(1, 6):
            y = int(base - v * step)
            draw.line([(left, y), (int(0.97 * S), y)], fill=(200, 200, 200), width=hairline(S))
            draw_text(draw, (int(0.03 * S), y - int(0.05 * S)), str(v), int(0.1 * S), INK, page=S)
    boxes = []
    colour_names = pick(rng, tuple(COLOURS), k=n) if n <= len(COLOURS) else None
    for k, h in enumerate(heights_px):
        x = int(left + k * slot + (slot - bar_w) / 2)
        box = (x, int(base - h), x + bar_w, base)
        draw.rectangle(box, fill=COLOURS[colour_names[k]])
        boxes.append(box)
        lw, _ = text_size(BAR_LABELS[k], int(0.11 * S))
        draw_text(draw, (x + (bar_w - lw) // 2, base + int(0.03 * S)), BAR_LABELS[k], int(0.11 * S), INK, page=S)
    draw.line([(left, base), (int(0.97 * S), base)], fill=INK, width=hairline(S))
    return page, boxes


def doc_chart_tallest(seed: int, index: int, *, tile_size: int = 128) -> Sample:
    """Four labelled bars; the tallest exceeds every other by at least 15% of the plot height."""
    S, fam = check_tile_size(tile_size), "doc_chart_tallest"
    rng = rng_for(seed, fam, index)
    cls = balanced_class(seed, fam, index, len(BAR_LABELS))
    top = float(rng.uniform(0.75, 1.0))
    fracs = [float(rng.uniform(0.15, top - 0.15)) for _ in BAR_LABELS]
    fracs[cls] = top
    page, boxes = _bars(rng, S, [f * 0.66 * S for f in fracs])
    label = BAR_LABELS[cls]
    return _sample(fam, seed, index, "Which bar is the tallest?", label, f"bar {label} rises highest",
                   len(BAR_LABELS), cls, [page], heights=fracs, boxes=boxes)


def doc_chart_value(seed: int, index: int, *, tile_size: int = 128) -> Sample:
    """Three bars over gridlines labelled 1..5; read the (integer) value of one named bar."""
    S, fam = check_tile_size(tile_size), "doc_chart_value"
    rng = rng_for(seed, fam, index)
    cls = balanced_class(seed, fam, index, 5)
    values = [int(v) for v in rng.integers(1, 6, size=3)]
    which = int(rng.integers(3))
    values[which] = cls + 1
    step = 0.13 * S
    page, boxes = _bars(rng, S, [v * step for v in values], draw_axis_values=True, step=step)
    label = BAR_LABELS[which]
    return _sample(fam, seed, index, f"What is the value of bar {label}?", str(cls + 1),
                   f"bar {label} reaches the {cls + 1} line", 5, cls, [page], values=values, boxes=boxes)


def doc_count(seed: int, index: int, *, tile_size: int = 128) -> Sample:
    """Count stars (or boxes) among up to three shapes of the other kind, one shape per grid cell."""
    S, fam = check_tile_size(tile_size), "doc_count"
    rng = rng_for(seed, fam, index)
    cls = balanced_class(seed, fam, index, 5)
    count = cls + 1
    target = "star" if rng.integers(2) else "box"
    other = "box" if target == "star" else "star"
    n_other = int(rng.integers(0, min(3, 9 - count) + 1))
    cells = [int(c) for c in rng.permutation(9)[: count + n_other]]
    kinds = [target] * count + [other] * n_other
    page = new_page(S, rng)
    draw = ImageDraw.Draw(page)
    cell = S / 3
    shapes = []
    for c, kind in zip(cells, kinds):
        r = float(rng.uniform(0.09, 0.12)) * S
        jx, jy = (float(v) for v in rng.uniform(-0.03, 0.03, size=2) * S)
        cx, cy = (c % 3 + 0.5) * cell + jx, (c // 3 + 0.5) * cell + jy
        draw_shape(draw, kind, cx, cy, r * (1.0 if kind == "star" else 0.8), COLOURS[pick(rng, tuple(COLOURS))])
        shapes.append({"kind": kind, "cell": c, "center": (cx, cy), "r": r})
    plural = "stars" if target == "star" else "boxes"
    counted = f"{count} {plural if count > 1 else target}"
    return _sample(fam, seed, index, f"How many {plural} are there?", str(count),
                   f"{counted} and {n_other} other shapes", 5, cls, [page], target=target, shapes=shapes)


def _filler_page(rng, S: int) -> Image.Image:
    """A mostly empty page: maybe a title, a few grey bars standing in for body text, or nothing."""
    page = new_page(S, rng)
    draw = ImageDraw.Draw(page)
    style = int(rng.integers(3))  # 0: blank, 1: bars, 2: title + bars
    if style == 2:
        draw_text(draw, (int(0.08 * S), int(0.06 * S)), pick(rng, FILLER_TITLES), int(0.1 * S), INK, page=S)
    if style >= 1:
        for k in range(int(rng.integers(2, 6))):
            y = int((0.25 + 0.13 * k) * S)
            draw.rectangle([int(0.08 * S), y, int((0.3 + 0.6 * rng.random()) * S), y + max(2, S // 40)],
                           fill=(205, 205, 205))
    return page


def doc_multipage(seed: int, index: int, *, tile_size: int = 128, min_pages: int = 2,
                  max_pages: int = 10) -> Sample:
    """`doc_total` spread over 2-10 pages: one receipt page, the rest filler or blank. The question
    never names the page, so long-document token reduction must keep the page that matters."""
    S, fam = check_tile_size(tile_size), "doc_multipage"
    if not 1 <= min_pages <= max_pages <= 10:
        raise ConfigError(f"need 1 <= min_pages <= max_pages <= 10; found {min_pages}, {max_pages}")
    rng = rng_for(seed, fam, index)
    cls = balanced_class(seed, fam, index, len(TOTALS))
    total = TOTALS[cls]
    n_pages = int(rng.integers(min_pages, max_pages + 1))
    answer_page = int(rng.integers(n_pages))
    pages = []
    for p in range(n_pages):
        if p == answer_page:
            page, fields = _receipt(rng, S, total)
        else:
            page = _filler_page(rng, S)
        pages.append(page)
    return _sample(fam, seed, index, "What is the total?", total,
                   f"page {answer_page + 1} of {n_pages} has TOTAL {total}", len(TOTALS), cls, pages,
                   answer_page=answer_page, fields=fields)


# name -> (generator, answer classes given options, options it takes beyond tile_size)
DOC_FAMILIES = {
    "doc_total": (doc_total, lambda **o: list(TOTALS), ()),
    "doc_name": (doc_name, lambda **o: list(WORDS), ()),
    "doc_layout": (doc_layout, lambda **o: list(LAYOUT_LABELS), ()),
    "doc_table": (doc_table, lambda **o: [str(d) for d in range(10)], ()),
    "doc_chart_tallest": (doc_chart_tallest, lambda **o: list(BAR_LABELS), ()),
    "doc_chart_value": (doc_chart_value, lambda **o: [str(v) for v in range(1, 6)], ()),
    "doc_count": (doc_count, lambda **o: [str(v) for v in range(1, 6)], ()),
    "doc_multipage": (doc_multipage, lambda **o: list(TOTALS), ("min_pages", "max_pages")),
}
