"""The viewer page's skeleton and stylesheet; `viewer.py` fills `@@TITLE@@`, `@@STYLE@@`,
`@@SCRIPT@@` (from `viewer_script.py`) and `@@DATA@@` in one pass."""

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none';
  script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:">
<title>@@TITLE@@</title>
<style>@@STYLE@@</style>
</head>
<body>
<header>
  <h1 id="title"></h1>
  <p id="subtitle"></p>
  <p id="summary"></p>
</header>
<main>
  <section class="card" id="heads-card" aria-labelledby="heads-heading">
    <div class="card-head">
      <h2 id="heads-heading">Heads</h2>
      <label class="control" for="statistic">Colour by <select id="statistic"></select></label>
    </div>
    <div id="legend" aria-live="polite"></div>
    <div id="grid-wrap"><div id="grid"></div></div>
    <p class="hint">Click a head, or focus one and move with the arrow keys.</p>
  </section>
  <section class="card" id="pattern-card" aria-labelledby="pattern-heading">
    <div class="card-head">
      <h2 id="pattern-heading">Attention pattern</h2>
      <label class="control" for="scale">Colour scale <select id="scale">
        <option value="one">0 to 1</option>
        <option value="max">0 to head max</option>
      </select></label>
    </div>
    <div id="example-control">
      <label for="example">Example</label>
      <input type="range" id="example" min="0" max="0" step="1" value="0">
      <span id="example-label"></span>
    </div>
    <div id="head-info"></div>
    <div id="pattern"></div>
  </section>
</main>
<div id="tooltip" role="tooltip" hidden></div>
<script type="application/json" id="viewer-data">@@DATA@@</script>
<script>@@SCRIPT@@</script>
</body>
</html>
"""

STYLE = """
:root {
  --ink: #1f2937; --muted: #6b7280; --line: #e5e7eb; --bg: #f5f6f8; --card: #ffffff;
  --accent: #e8590c; --cell: 44px;
  --mono: ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", monospace;
}
* { box-sizing: border-box; }
body {
  margin: 0; background: var(--bg); color: var(--ink); line-height: 1.45;
  font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial,
    sans-serif;
}
header { padding: 22px 28px 6px; }
h1 { margin: 0; font-size: 22px; font-weight: 650; letter-spacing: -0.01em; }
h2 { margin: 0; font-size: 15px; font-weight: 650; }
#subtitle { margin: 4px 0 0; color: var(--ink); }
#subtitle:empty { display: none; }
#summary { margin: 4px 0 0; color: var(--muted); font-size: 13px; }
main {
  display: grid; grid-template-columns: minmax(300px, max-content) minmax(420px, 1fr);
  gap: 18px; padding: 14px 28px 28px; align-items: start;
}
@media (max-width: 980px) { main { grid-template-columns: 1fr; } }
.card {
  background: var(--card); border: 1px solid var(--line); border-radius: 10px;
  padding: 16px 18px 18px; box-shadow: 0 1px 2px rgba(16, 24, 40, 0.04); min-width: 0;
}
.card-head {
  display: flex; align-items: center; justify-content: space-between; gap: 14px;
  flex-wrap: wrap; margin-bottom: 12px;
}
.control { font-size: 13px; color: var(--muted); display: inline-flex; gap: 6px;
  align-items: center; }
select {
  font: inherit; font-size: 13px; color: var(--ink); padding: 4px 8px; border-radius: 6px;
  border: 1px solid #d1d5db; background: #fff;
}
select:focus-visible, input:focus-visible, .head-cell:focus-visible {
  outline: 2px solid var(--accent); outline-offset: 2px;
}
.hint { margin: 10px 0 0; font-size: 12px; color: var(--muted); }
#legend { display: flex; align-items: center; gap: 8px; font-size: 12px; color: var(--muted);
  margin-bottom: 14px; flex-wrap: wrap; }
.ramp { width: 160px; height: 10px; border-radius: 3px; }
.legend-value { font-variant-numeric: tabular-nums; color: var(--ink); }
.key { white-space: nowrap; }
.swatch { display: inline-block; width: 14px; height: 14px; border-radius: 3px;
  vertical-align: -3px; margin: 0 4px 0 10px; border: 1px solid #d1d5db; }
#grid-wrap { overflow-x: auto; padding: 4px; }
#grid { display: grid; gap: 3px; align-items: center; }
.col-head { text-align: center; font-size: 11px; color: var(--muted);
  font-variant-numeric: tabular-nums; }
.row-head { font: 12px var(--mono); color: var(--ink); padding-right: 10px; white-space: nowrap;
  text-align: right; }
.head-cell {
  width: var(--cell); height: calc(var(--cell) * 0.78); border: 0; border-radius: 5px;
  padding: 0; cursor: pointer; font: 600 11px/1 system-ui, sans-serif;
  font-variant-numeric: tabular-nums; transition: transform 0.08s;
}
.head-cell:hover { transform: scale(1.08); }
.head-cell.selected { box-shadow: 0 0 0 2px #fff, 0 0 0 4px var(--ink); }
.head-cell.pruned, .swatch.pruned {
  background: repeating-linear-gradient(135deg, #e5e7eb 0 3px, #f9fafb 3px 7px) !important;
  color: #6b7280 !important; font-size: 15px; font-weight: 500;
}
.head-cell.missing, .swatch.missing { background: #f3f4f6; color: #9ca3af; }
.no-cell { width: var(--cell); }
#example-control { display: flex; align-items: center; gap: 10px; font-size: 13px;
  color: var(--muted); margin-bottom: 12px; }
#example-control[hidden] { display: none; }
#example { width: 180px; accent-color: var(--ink); }
#example-label { color: var(--ink); font-weight: 550; }
#head-info { margin-bottom: 12px; }
.head-title { font-size: 15px; margin-bottom: 8px; }
.head-title .site { font-family: var(--mono); font-size: 14px; }
.badge { display: inline-block; margin-left: 8px; padding: 1px 8px; border-radius: 999px;
  background: #fef3c7; color: #92400e; font-size: 12px; font-weight: 600; }
table.stats { border-collapse: collapse; font-size: 13px; }
table.stats td { padding: 3px 14px 3px 0; }
table.stats td.value { font-variant-numeric: tabular-nums; text-align: right; font-weight: 600; }
table.stats tr.current td { color: var(--accent); }
.bar { width: 90px; height: 6px; background: #eef0f3; border-radius: 3px; position: relative; }
.bar span { position: absolute; top: -2px; width: 3px; height: 10px; border-radius: 1px;
  background: var(--ink); }
.note { margin: 10px 0; padding: 10px 12px; border-radius: 8px; background: #f3f4f6;
  color: var(--ink); font-size: 14px; }
.note.pruned { background: #fff7ed; border: 1px solid #fed7aa; }
#pattern { overflow-x: auto; }
#pattern svg { display: block; }
#pattern text { font-family: var(--mono); fill: #374151; }
#pattern text.axis { font-family: system-ui, sans-serif; fill: var(--muted); }
#pattern text.active { fill: var(--accent); font-weight: 700; }
.pattern-scale { display: flex; align-items: center; gap: 8px; font-size: 12px;
  color: var(--muted); margin-top: 8px; }
#tooltip {
  position: fixed; z-index: 10; pointer-events: none; max-width: 420px;
  background: #111827; color: #f9fafb; font: 12px/1.35 var(--mono); padding: 6px 9px;
  border-radius: 6px; box-shadow: 0 4px 14px rgba(0, 0, 0, 0.18); white-space: pre-wrap;
}
"""
