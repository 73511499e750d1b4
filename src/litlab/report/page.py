"""The self-contained HTML page: inline CSS, images as data URIs, nothing fetched when opened."""

from __future__ import annotations

import base64
from datetime import datetime
from html import escape
from pathlib import Path

from litlab.report.compare import Comparison, facts, numeric_params
from litlab.report.plots import curve_metrics, curve_plot, sweep_plot
from litlab.report.runs import RunFolder, folders_title

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;
  color:#1f2328;background:#fff;margin:0 auto;max-width:1500px;padding:1.5rem 2rem 3rem;
  line-height:1.45}
h1{font-size:1.6rem;margin:0 0 .2rem}
h2{font-size:1.2rem;margin:2.2rem 0 .8rem;padding-bottom:.3rem;border-bottom:1px solid #d0d7de}
.meta,.note{color:#59636e;font-size:.85rem}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:.3rem 1.2rem;margin:1rem 0}
dl.facts dt{font-weight:600;color:#59636e}
dl.facts dd{margin:0}
code{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:.8rem}
.table-wrap{max-height:75vh;overflow:auto;border:1px solid #d0d7de;border-radius:6px}
table{border-collapse:collapse;font-size:.85rem;width:100%}
th,td{padding:.4rem .65rem;text-align:left;vertical-align:top;border-bottom:1px solid #eaeef2}
th{position:sticky;top:0;z-index:1;background:#f6f8fa;white-space:nowrap;
  box-shadow:inset 0 -1px 0 #d0d7de}
tbody tr:nth-child(even){background:#f8f9fb}
tbody tr:hover{background:#eef4ff}
tbody tr.best{background:#fff8c5}
.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.ov code{display:inline-block;margin:0 .25rem .2rem 0;padding:0 .3rem;border-radius:4px;
  background:#f0f2f5;color:#59636e}
.ov code.varied{background:#ddf4ff;color:#0a3069;font-weight:600}
.badge{display:inline-block;margin-left:.4rem;padding:0 .45rem;border-radius:1rem;
  background:#bf8700;color:#fff;font-size:.72rem;font-weight:700;white-space:nowrap}
.status-completed{color:#1a7f37}
.status-failed,.status-unreadable{color:#cf222e}
.status-interrupted,.status-lost,.status-running{color:#9a6700}
td.ov{min-width:14rem;max-width:34rem}
td.ckpt code{word-break:break-all;color:#59636e}
.plots{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:1rem}
.plots figure,.samples figure{margin:0}
.plots img{width:100%;height:auto;border:1px solid #eaeef2;border-radius:6px}
.samples{display:flex;flex-wrap:wrap;gap:1.2rem;align-items:flex-start}
.samples figure{text-align:center;max-width:300px}
.samples img{width:280px;height:auto;image-rendering:pixelated;border:1px solid #d0d7de;
  border-radius:4px;background:#000}
.samples figcaption{font-size:.82rem;margin-top:.3rem;word-break:break-word}
"""


def data_uri(png: bytes) -> str:
    """PNG bytes as a data: URI, so the page needs no other file."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def img(png: bytes, alt: str) -> str:
    """An embedded image."""
    return f'<img src="{data_uri(png)}" alt="{escape(alt)}">'


def overrides_html(comparison: Comparison, run: RunFolder) -> str:
    """Each override as a chip; the ones that differ between runs highlighted."""
    varied = set(comparison.varied_overrides(run))
    chips = (
        f'<code class="varied">{escape(o)}</code>' if o in varied else f"<code>{escape(o)}</code>"
        for o in comparison.shown_overrides(run)
    )
    return "".join(chips)


def cell_html(comparison: Comparison, run: RunFolder, column: str, text: str) -> str:
    """One <td>: numbers right-aligned, runs, overrides, status and paths styled."""
    if column == "run":
        badge = '<span class="badge">★ best</span>' if run is comparison.best else ""
        return f"<td><strong>{escape(text)}</strong>{badge}</td>"
    if column == "overrides":
        return f'<td class="ov">{overrides_html(comparison, run)}</td>'
    if column == "status":
        title = f' title="{escape(run.error)}"' if run.error else ""
        return f'<td class="status-{escape(run.status)}"{title}>{escape(text)}</td>'
    if column == "best checkpoint":
        return f'<td class="ckpt"><code>{escape(text)}</code></td>' if text else "<td></td>"
    if column in comparison.numeric_columns:
        return f'<td class="num">{escape(text)}</td>'
    return f"<td>{escape(text)}</td>"


def table_html(comparison: Comparison) -> str:
    """The runs table, best first, the best row highlighted."""
    numeric = comparison.numeric_columns
    head = "".join(
        f'<th class="num">{escape(c)}</th>' if c in numeric else f"<th>{escape(c)}</th>"
        for c in comparison.columns
    )
    rows = []
    for rank, run in enumerate(comparison.runs, 1):
        cells = zip(comparison.columns, comparison.cells(rank, run), strict=True)
        tds = "".join(cell_html(comparison, run, column, text) for column, text in cells)
        css = "run best" if run is comparison.best else "run"
        rows.append(f'<tr class="{css}" data-run="{escape(run.name)}">{tds}</tr>')
    table = (
        f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n"
        + "\n".join(rows)
        + "\n</tbody></table>"
    )
    return f'<div class="table-wrap">{table}</div>'


def curves_html(comparison: Comparison) -> str:
    """Learning curves, one plot per metric, all runs on shared axes."""
    metrics = curve_metrics(comparison)
    if not metrics:
        return (
            '<p class="note">No run has csv/metrics.csv (runs with logger=none log no curves).</p>'
        )
    figures = (
        f"<figure>{img(curve_plot(comparison, m), f'{m} against epochs trained')}</figure>"
        for m in metrics
    )
    return f'<div class="plots">{"".join(figures)}</div>'


def sweep_html(comparison: Comparison) -> str:
    """The objective against each numeric swept parameter ('' when this is no sweep)."""
    figures = []
    for key in numeric_params(comparison.runs, comparison.varied):
        png = sweep_plot(comparison, key)
        if png is not None:
            figures.append(f"<figure>{img(png, f'{comparison.metric} vs {key}')}</figure>")
    if not figures:
        return ""
    heading = "<h2>Sweep: objective against each varied parameter</h2>"
    return f'{heading}\n<div class="plots">{"".join(figures)}</div>'


def samples_html(comparison: Comparison) -> str:
    """GAN sample grids side by side, each captioned with its run ('' without GAN runs)."""
    figures = []
    for run in (r for r in comparison.runs if r.is_gan):
        grid = run.sample_grid
        picture = img(grid.read_bytes(), f"samples of {run.name}") if grid else "<p>no grid</p>"
        varied = " ".join(comparison.varied_overrides(run))
        caption = f"{escape(run.name)} ({escape(run.sample_grid_of)})" if grid else escape(run.name)
        caption += f"<br><code>{escape(varied)}</code>" if varied else ""
        figures.append(f"<figure>{picture}<figcaption>{caption}</figcaption></figure>")
    if not figures:
        return ""
    return f'<h2>GAN samples</h2>\n<div class="samples">{"".join(figures)}</div>'


def render_html(comparison: Comparison, folders: list[Path]) -> str:
    """The whole page."""
    title = f"litlab report: {folders_title(folders)}"
    items = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in facts(comparison))
    sources = ", ".join(str(f) for f in folders)
    generated = datetime.now().isoformat(timespec="seconds")
    order = f"{comparison.metric} ({comparison.mode})" if comparison.metric else "discovery order"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title><style>{CSS}</style></head>
<body>
<h1>{escape(title)}</h1>
<p class="meta">{escape(sources)} · generated {generated}</p>
<dl class="facts">{items}</dl>
<h2>Runs</h2>
<p class="note">Sorted by {escape(order)}, the ranked runs numbered; runs measured otherwise
(each measure's best first), runs without a value, then failed runs, come last, unnumbered.
Highlighted overrides differ between runs; hover a status for the full error.</p>
{table_html(comparison)}
<h2>Learning curves</h2>
{curves_html(comparison)}
{sweep_html(comparison)}
{samples_html(comparison)}
</body></html>
"""
