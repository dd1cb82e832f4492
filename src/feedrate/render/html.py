"""A tuning result as one self-contained HTML page: inline style, the plot embedded as a data URI,
no scripts, fonts or links to anything outside the file. Renders plain data; measures nothing.
Every piece of text from the result is escaped."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

from feedrate.render.plot import consumer_rate, png_bytes
from feedrate.render.text import noise_of, rate, size
from feedrate.results.findings import SEVERITY_ORDER, Finding
from feedrate.results.trial import Trial
from feedrate.results.tune import TuneResult
from feedrate.search.bottleneck import LABELS
from feedrate.units import counted

MiB = 1024 * 1024
SEVERITY_TITLES = {"error": "Errors", "warning": "Warnings", "info": "Notes"}

_STYLE = """
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1f2328;
  background: #f6f8fa; margin: 0; }
main { max-width: 1080px; margin: 0 auto; padding: 24px 32px 48px; background: #fff; }
h1 { font-size: 22px; margin: 0 0 4px; } h3 { font-size: 15px; margin: 16px 0 4px; }
h2 { font-size: 18px; margin: 32px 0 8px; border-bottom: 1px solid #d0d7de; padding-bottom: 4px; }
.meta { color: #59636e; font-size: 13px; margin: 0; }
.banner { padding: 8px 12px; border-radius: 6px; margin: 12px 0; }
.partial { background: #fff8c5; border: 1px solid #d4a72c; }
.cache { background: #ddf4ff; border: 1px solid #54aeff; }
.reco { background: #f0fff4; border: 1px solid #4ac26b; border-radius: 8px; padding: 4px 16px; }
.big { font-size: 19px; margin: 8px 0; }
pre { background: #f6f8fa; border: 1px solid #d0d7de; border-radius: 6px; padding: 10px 12px;
  overflow-x: auto; } code, pre { font: 13px ui-monospace, SFMono-Regular, Menlo, monospace; }
img { max-width: 100%; height: auto; display: block; margin: 8px auto; }
table { border-collapse: collapse; font-size: 13px; width: 100%; }
th, td { padding: 4px 8px; border-bottom: 1px solid #eaeef2; text-align: left;
  vertical-align: top; }
th { background: #f6f8fa; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
tr.best { background: #fff8c5; } tr.yours { background: #f3f0ff; }
table.kv { width: auto; } table.kv th { background: none; font-weight: 600; }
ul.findings { list-style: none; padding: 0; margin: 0; }
ul.findings li { border-left: 4px solid; padding: 4px 12px; margin: 6px 0; background: #f6f8fa; }
li.error { border-color: #cf222e; } li.warning { border-color: #d4a72c; }
li.info { border-color: #0969da; }
.id { font: 12px ui-monospace, monospace; color: #59636e; margin-right: 6px; }
.fix { font-size: 13px; color: #59636e; }
.tag { font-size: 11px; border-radius: 8px; padding: 0 6px; margin-left: 4px; background: #eaeef2; }
"""


def render_html(result: TuneResult) -> str:
    """The whole report as one HTML document (UTF-8 text)."""
    sections = (
        _header(result),
        _banners(result),
        _recommendation(result),
        _plot(result),
        _persistent(result),
        _findings(result.findings),
        _trials(result),
        _kv_section("Machine", result.machine),
    )
    body = "\n".join(s for s in sections if s)
    title = _e(f"feedrate tune {result.target or ''}".strip())
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{title}</title>\n<style>{_STYLE}</style>\n</head>\n"
        f"<body>\n<main>\n{body}\n</main>\n</body>\n</html>\n"
    )


def write_html(result: TuneResult, path: str | Path) -> Path:
    """Write ``render_html(result)`` to ``path`` and return the path."""
    out = Path(path)
    out.write_text(render_html(result), encoding="utf-8")
    return out


def _e(value: object) -> str:
    return html.escape(str(value))


def _header(result: TuneResult) -> str:
    meta = f"{counted(len(result.trials), 'trial')} in {result.search_seconds:.0f} s"
    if result.feedrate_version:
        meta += f" · feedrate {result.feedrate_version}"
    target = _e(result.target or "(loader)")
    return f'<h1>feedrate tune <code>{target}</code></h1>\n<p class="meta">{_e(meta)}</p>'


def _banners(result: TuneResult) -> str:
    out = []
    if result.partial:
        why = f": {result.partial_reason}" if result.partial_reason else ""
        out.append(
            f'<div class="banner partial"><strong>partial result</strong>{_e(why)}. '
            "The search stopped early; the best shown is the best of what was tried.</div>"
        )
    if result.from_cache:
        out.append(
            '<div class="banner cache"><strong>from cache</strong>: '
            "this result was measured earlier and not measured again.</div>"
        )
    return "\n".join(out)


def _recommendation(result: TuneResult) -> str:
    best = result.best
    lines = [
        '<section class="reco">',
        f'<p class="big">Use <strong>{_e(best.config.label())}</strong>: '
        f"{_e(rate(best.median))} samples/s {noise_of(best)}{_best_restart(result)}</p>",
        _versus(result),
        f"<p>{_e(result.reason)}</p>",
    ]
    need = consumer_rate(result)
    if need:
        lines.append(f"<p>The consumer needs {_e(rate(need))} samples/s.</p>")
    if result.bottleneck:
        lines.append(f"<p>Bottleneck: {_e(LABELS.get(result.bottleneck, result.bottleneck))}</p>")
    lines += [f"<pre><code>{_e(result.code)}</code></pre>", "</section>"]
    return "<h2>Recommendation</h2>\n" + "\n".join(lines)


def _best_restart(result: TuneResult) -> str:
    if rate(result.best_rate) == rate(result.best.median):
        return ""
    return (
        f", {_e(rate(result.best_rate))} counting its {result.best_restart_s:.2f} s restart "
        "every epoch"
    )


def _versus(result: TuneResult) -> str:
    yours = result.baseline
    if yours.config == result.best.config:
        return "<p>Your settings are already the best found.</p>"
    shown = rate(result.baseline_rate) != rate(yours.median)  # the restart changes the figure
    counted = f", counting its {result.baseline_restart_s:.2f} s restart every epoch"
    counted = counted if shown else ""
    return (
        f"<p>{result.speedup:.2f}× your settings ({_e(yours.config.label())}: "
        f"{_e(rate(result.baseline_rate))} samples/s{counted}).</p>"
    )


def _plot(result: TuneResult) -> str:
    data = base64.b64encode(png_bytes(result)).decode("ascii")
    alt = "samples/s against num_workers for every configuration tried"
    return f'<h2>Plot</h2>\n<img src="data:image/png;base64,{data}" alt="{alt}">'


def _persistent(result: TuneResult) -> str:
    return _kv_section("Persistent workers", result.persistent) if result.persistent else ""


def _findings(findings: list[Finding]) -> str:
    if not findings:
        return "<h2>Findings</h2>\n<p>No findings.</p>"
    parts = ["<h2>Findings</h2>"]
    for severity in sorted({f.severity for f in findings}, key=lambda s: SEVERITY_ORDER.get(s, 9)):
        group = [f for f in findings if f.severity == severity]
        parts.append(f"<h3>{_e(SEVERITY_TITLES.get(severity, severity))} ({len(group)})</h3>")
        parts.append('<ul class="findings">')
        parts += [
            f'<li class="{_e(f.severity)}"><span class="id">{_e(f.id)}</span>{_e(f.message)}'
            f'<div class="fix">fix: <code>{_e(f.fix)}</code></div></li>'
            for f in group
        ]
        parts.append("</ul>")
    return "\n".join(parts)


def _trials(result: TuneResult) -> str:
    stall = any(t.stall_fraction is not None for t in result.trials)
    heads = ["config", "reason", "samples/s", "range", "start-up", "main CPU", "workers CPU"]
    heads += ["memory", *(["stall"] if stall else []), "outcome"]
    head = "".join(f"<th>{h}</th>" for h in heads)
    rows = "\n".join(_trial_row(t, result, stall) for t in result.trials)
    note = (
        "CPU: 100% is one core busy. Memory: PSS of the main process and workers "
        "(pages shared after fork counted once)."
    )
    return (
        f'<h2>Trials</h2>\n<table>\n<tr>{head}</tr>\n{rows}\n</table>\n<p class="meta">{note}</p>'
    )


def _trial_row(t: Trial, result: TuneResult, stall: bool) -> str:
    is_best, is_yours = t.config == result.best.config, t.config == result.baseline.config
    tags = ("best", is_best), ("yours", is_yours)
    label = _e(t.config.label()) + "".join(f'<span class="tag">{n}</span>' for n, on in tags if on)
    cells = [f"<td>{label}</td>", f"<td>{_e(t.reason)}</td>"]
    cells += [f'<td class="n">{_e(f)}</td>' for f in _figures(t, stall)]
    cells.append(f"<td>{_e(_outcome(t))}</td>")
    cls = ' class="best"' if is_best else ' class="yours"' if is_yours else ""
    return f"<tr{cls}>{''.join(cells)}</tr>"


def _figures(t: Trial, stall: bool) -> list[str]:
    """The numeric cells of a trial's row, dashes where it has no figures."""
    figures = ["–"] * 6
    if t.measured and t.spread is not None:
        s, mem = t.spread, t.memory_bytes
        figures = [rate(t.median), f"{rate(s.min)}–{rate(s.max)}", f"{t.startup_s:.2f} s"]
        figures += [f"{t.main_cpu * 100:.0f}%", f"{t.workers_cpu * 100:.0f}%"]
        figures += [f"{mem / MiB:,.0f} MiB" if mem else "–"]
    if stall:
        figures.append("–" if t.stall_fraction is None else f"{t.stall_fraction * 100:.0f}%")
    return figures


def _outcome(t: Trial) -> str:
    if t.skipped:
        return f"skipped: {t.skipped}"
    if t.error:
        return f"failed: {t.error}"
    return t.verdict


def _kv_section(title: str, data: dict[str, Any]) -> str:
    rows = "\n".join(
        f"<tr><th>{_e(_key(k))}</th><td>{_e(_value(k, v))}</td></tr>" for k, v in data.items()
    )
    return f'<h2>{_e(title)}</h2>\n<table class="kv">\n{rows}\n</table>'


def _key(key: str) -> str:
    """A fact's name for people: the unit suffix goes, since the value shows its unit."""
    for suffix in ("_bytes", "_s"):
        if key.endswith(suffix) and len(key) > len(suffix):
            key = key[: -len(suffix)]
    return key.replace("_", " ")


def _value(key: str, value: Any) -> str:
    """A fact as text, in the unit its key names (``*_bytes``, ``*_s``)."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float) and key.endswith("_bytes"):
        return size(value)
    if isinstance(value, int | float) and key.endswith("_s"):
        return f"{value:.2f} s"
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "none"
    if isinstance(value, list):
        return json.dumps(value)
    return str(value)
