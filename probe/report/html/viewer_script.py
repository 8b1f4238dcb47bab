"""The viewer page's script, plain JavaScript that `viewer.py` inlines.

It reads the JSON from `#viewer-data`, draws the layer x head grid (`.head-cell` buttons with
`data-layer` / `data-head`, coloured by the statistic chosen in `#statistic`), and for the
selected head the pattern heatmap in `#pattern`: SVG rects carrying `data-q`, `data-k`, `data-w`
up to RECT_LIMIT tokens, one pixel image beyond (hover reads the weights either way). Colours come
from a polynomial fit of matplotlib's viridis, computed in the page.
"""

SCRIPT = r"""
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("viewer-data").textContent);
  const RECT_LIMIT = 128;  // above: the heatmap is one image, hover still reads the weights
  const SVG = "http://www.w3.org/2000/svg";
  const $ = (id) => document.getElementById(id);
  const state = { stat: Object.keys(data.statistics)[0], layer: null, head: null, example: 0 };
  const pruned = new Set(data.pruned.map(([l, h]) => l + ":" + h));
  const isPruned = (l, h) => pruned.has(l + ":" + h);
  const cells = [];  // [layer][column] -> button or null

  // viridis, a 6th-degree polynomial fit of matplotlib's table (max error 5/255)
  const C = [[0.2777273272234177, 0.005407344544966578, 0.3340998053353061],
    [0.1050930431085774, 1.404613529898575, 1.384590162594685],
    [-0.3308618287255563, 0.214847559468213, 0.09509516302823659],
    [-4.634230498983486, -5.799100973351585, -19.33244095627987],
    [6.228269936347081, 14.17993336680509, 56.69055260068105],
    [4.776384997670288, -13.74514537774601, -65.35303263337234],
    [-5.435455855934631, 4.645852612178535, 26.3124352495832]];
  function viridis(t) {
    t = Math.min(1, Math.max(0, t));
    return [0, 1, 2].map((c) => {
      let v = C[6][c];
      for (let k = 5; k >= 0; k--) v = C[k][c] + t * v;
      return Math.round(255 * Math.min(1, Math.max(0, v)));
    });
  }
  const rgb = (c) => "rgb(" + c.join(",") + ")";
  const ramp = (n) => "linear-gradient(90deg," +
    Array.from({ length: n }, (_, i) => rgb(viridis(i / (n - 1)))).join(",") + ")";
  const MASKED = [238, 240, 243];

  function fmt(v) {
    if (v === null || v === undefined) return "–";
    const a = Math.abs(v);
    if (a !== 0 && (a < 0.001 || a >= 1e4)) return v.toExponential(1);
    return v.toFixed(a >= 100 ? 0 : a >= 10 ? 1 : a !== 0 && a < 0.01 ? 3 : 2);
  }
  const shown = (tok) => tok.replace(/\n/g, "↵").replace(/\t/g, "⇥").replace(/ /g, "·");
  const short = (tok) => { const s = shown(tok); return s.length > 12 ? s.slice(0, 11) + "…" : s; };
  function el(tag, props, children) {
    const node = document.createElement(tag);
    Object.assign(node, props || {});
    for (const child of children || []) node.append(child);
    return node;
  }
  function svg(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    return node;
  }
  const value = (name, l, h) => data.statistics[name].values[l][data.layers[l].heads.indexOf(h)];
  function range(name) {
    const vals = [];
    data.layers.forEach((layer, l) => layer.heads.forEach((h) => {
      const v = value(name, l, h);
      if (v !== null && !isPruned(l, h)) vals.push(v);
    }));
    return vals.length ? [Math.min(...vals), Math.max(...vals)] : [0, 1];
  }
  const unit = (v, [lo, hi]) => (hi > lo ? (v - lo) / (hi - lo) : 0.5);

  // ---- header and controls
  $("title").textContent = data.title;
  $("subtitle").textContent = data.subtitle;
  const nHeads = data.layers.reduce((n, layer) => n + layer.heads.length, 0);
  const plural = (n, word) => n + " " + word + (n === 1 ? "" : "s");
  $("summary").textContent = [plural(data.layers.length, "attention site"),
    plural(nHeads, "head"), data.pruned.length + " pruned",
    plural(data.examples.length, "example")].join(" · ");
  for (const [name, stat] of Object.entries(data.statistics)) {
    $("statistic").append(el("option", { value: name, textContent: stat.label }));
  }

  // ---- the layer x head grid
  const columns = [...new Set(data.layers.flatMap((layer) => layer.heads))].sort((a, b) => a - b);
  const grid = $("grid");
  const nc = columns.length, size = nc <= 8 ? 48 : nc <= 16 ? 40 : nc <= 32 ? 26 : 18;
  grid.style.setProperty("--cell", size + "px");
  grid.style.gridTemplateColumns = "max-content repeat(" + columns.length + ", var(--cell))";
  grid.append(el("div"));
  for (const h of columns) grid.append(el("div", { className: "col-head", textContent: "h" + h }));
  data.layers.forEach((layer, l) => {
    grid.append(el("div", { className: "row-head", textContent: layer.name }));
    cells.push(columns.map((h) => {
      if (!layer.heads.includes(h)) {
        grid.append(el("div", { className: "no-cell" }));
        return null;
      }
      const cell = el("button", { type: "button", className: "head-cell" });
      cell.dataset.layer = l;
      cell.dataset.head = h;
      if (isPruned(l, h)) cell.classList.add("pruned");
      cell.addEventListener("click", () => select(l, h));
      grid.append(cell);
      return cell;
    }));
  });
  grid.addEventListener("keydown", (event) => {
    const steps = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
    const cell = event.target.closest(".head-cell");
    if (!cell || !steps[event.key]) return;
    event.preventDefault();
    const [dl, dc] = steps[event.key];
    let l = Number(cell.dataset.layer), c = columns.indexOf(Number(cell.dataset.head));
    for (;;) {
      l += dl; c += dc;
      if (l < 0 || l >= cells.length || c < 0 || c >= columns.length) return;
      if (cells[l][c]) { cells[l][c].focus(); cells[l][c].click(); return; }
    }
  });

  function paintGrid() {
    const stat = data.statistics[state.stat];
    const span = range(state.stat);
    const showText = size >= 40;
    cells.forEach((row, l) => row.forEach((cell, c) => {
      if (!cell) return;
      const h = columns[c], v = value(state.stat, l, h), where = data.layers[l].name + " head " + h;
      cell.classList.toggle("missing", v === null && !isPruned(l, h));
      if (isPruned(l, h)) {
        cell.textContent = "×";
        cell.title = where + ": pruned (" + stat.label + " " + fmt(v) + ")";
      } else if (v === null) {
        cell.textContent = showText ? "–" : "";
        cell.style.background = "";
        cell.style.color = "";
        cell.title = where + ": no " + stat.label;
      } else {
        const t = unit(v, span);
        cell.style.background = rgb(viridis(t));
        cell.style.color = t > 0.62 ? "#111827" : "#ffffff";
        cell.textContent = showText ? fmt(v) : "";
        cell.title = where + ": " + stat.label + " " + fmt(v);
      }
      cell.setAttribute("aria-label", cell.title);
    }));
    const legend = $("legend");
    legend.replaceChildren(
      el("span", { textContent: stat.label }),
      el("span", { className: "legend-value", textContent: fmt(span[0]) }),
      el("span", { className: "ramp", style: "background:" + ramp(12) }),
      el("span", { className: "legend-value", textContent: fmt(span[1]) }),
      el("span", { className: "key" }, [el("span", { className: "swatch pruned" }), "pruned"]),
      el("span", { className: "key" }, [el("span", { className: "swatch missing" }), "no value"]));
  }

  // ---- selection, examples, head statistics
  function select(l, h) {
    state.layer = l;
    state.head = h;
    for (const cell of document.querySelectorAll(".head-cell")) {
      const on = Number(cell.dataset.layer) === l && Number(cell.dataset.head) === h;
      cell.classList.toggle("selected", on);
      cell.setAttribute("aria-pressed", on ? "true" : "false");
    }
    renderInfo();
    renderPattern();
  }

  const slider = $("example");
  slider.max = Math.max(0, data.examples.length - 1);
  $("example-control").hidden = data.examples.length === 0;
  slider.hidden = data.examples.length < 2;
  slider.addEventListener("input", () => { state.example = Number(slider.value); showExample(); });
  function showExample() {
    const ex = data.examples[state.example];
    if (!ex) return;
    const count = data.examples.length > 1 ? " (" + (state.example + 1) + " of " +
      data.examples.length + ")" : "";
    $("example-label").textContent = ex.label + " · " + plural(ex.tokens.length, "token") + count;
    renderPattern();
  }

  function renderInfo() {
    const box = $("head-info");
    const l = state.layer, h = state.head;
    const title = el("div", { className: "head-title" }, [
      el("span", { className: "site", textContent: data.layers[l].name }), " · head ",
      el("b", { textContent: String(h) })]);
    if (isPruned(l, h)) title.append(el("span", { className: "badge", textContent: "pruned" }));
    const table = el("table", { className: "stats" });
    for (const [name, stat] of Object.entries(data.statistics)) {
      const v = value(name, l, h), span = range(name);
      const bar = el("div", { className: "bar" });
      if (v !== null) {
        const mark = el("span");
        mark.style.left = "calc(" + (100 * Math.min(1, Math.max(0, unit(v, span)))) + "% - 1px)";
        bar.append(mark);
        bar.title = "within " + fmt(span[0]) + " to " + fmt(span[1]) + " over all heads";
      }
      const row = el("tr", { className: name === state.stat ? "current" : "" }, [
        el("td", { textContent: stat.label }),
        el("td", { className: "value", textContent: fmt(v) }), el("td", {}, [bar])]);
      table.append(row);
    }
    box.replaceChildren(title, table);
  }

  function note(text, kind) {
    $("pattern").append(el("p", { className: "note " + (kind || ""), textContent: text }));
  }
  function renderPattern() {
    const box = $("pattern");
    box.replaceChildren();
    hideTip();
    if (state.layer === null) { note("Click a head to see its attention pattern."); return; }
    const ex = data.examples[state.example];
    const l = state.layer, h = state.head, where = data.layers[l].name + " head " + h;
    if (isPruned(l, h)) note("This head is pruned: it was removed (or masked) from the model, " +
      "so it contributes nothing to the output.", "pruned");
    if (!ex) { note("No examples were recorded, so there is no pattern to show."); return; }
    const m = (ex.patterns[String(l)] || {})[String(h)];
    if (!m) {
      if (!isPruned(l, h)) note("No pattern was recorded for " + where + " on this example.");
      return;
    }
    box.append(heatmap(m, ex.tokens));
  }

  // ---- the heatmap: query rows x key columns
  const measure = document.createElement("canvas").getContext("2d");
  function heatmap(m, tokens) {
    const n = tokens.length;
    const causal = m.every((row, i) => row.every((w, j) => j <= i || w === 0));
    const top = Math.max(...m.map((row) => Math.max(...row)));
    const scaleMax = $("scale").value === "max" && top > 0 ? top : 1;
    const avail = Math.max(260, $("pattern").clientWidth - 8);
    let cell = Math.floor((avail - 110) / n);
    cell = Math.max(2, Math.min(32, cell));
    const font = Math.max(9, Math.min(12, cell - 1));
    const step = Math.max(1, Math.ceil((font + 2) / cell));
    measure.font = font + "px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace";
    const labels = tokens.map(short);
    const labelW = Math.ceil(Math.max(...labels.map((s) => measure.measureText(s).width)));
    const left = Math.max(labelW + 16, 64), topM = labelW + 14, side = n * cell;
    const root = svg("svg", { width: left + side + 10, height: topM + side + 6,
      role: "img", "aria-label": "attention pattern, " + n + " queries by " + n + " keys" });
    for (const [text, y] of [["key →", topM - 6], ["query ↓", topM - 22]]) {
      const axis = svg("text", { x: left - 8, y: y, "text-anchor": "end", class: "axis",
        "font-size": 11 });
      axis.textContent = text;
      root.append(axis);
    }
    const body = svg("g", { transform: "translate(" + left + "," + topM + ")" });
    root.append(body);
    const gap = cell >= 8 ? 1 : 0;
    const colour = (i, j) => (causal && j > i ? MASKED : viridis(m[i][j] / scaleMax));
    if (n <= RECT_LIMIT) {
      for (let i = 0; i < n; i++) {
        for (let j = 0; j < n; j++) {
          const r = svg("rect", { x: j * cell, y: i * cell, width: cell - gap, height: cell - gap,
            fill: rgb(colour(i, j)), "data-q": i, "data-k": j, "data-w": m[i][j] });
          r.classList.add("pattern-cell");
          body.append(r);
        }
      }
    } else {
      const canvas = document.createElement("canvas");
      canvas.width = n;
      canvas.height = n;
      const ctx = canvas.getContext("2d"), image = ctx.createImageData(n, n);
      for (let i = 0; i < n; i++) {
        for (let j = 0; j < n; j++) {
          image.data.set([...colour(i, j), 255], 4 * (i * n + j));
        }
      }
      ctx.putImageData(image, 0, 0);
      body.append(svg("image", { href: canvas.toDataURL(), width: side, height: side,
        preserveAspectRatio: "none", style: "image-rendering: pixelated" }));
    }
    const qLabels = [], kLabels = [];
    for (let i = 0; i < n; i += step) {
      const q = svg("text", { x: -6, y: i * cell + cell / 2, "text-anchor": "end",
        "dominant-baseline": "central", "font-size": font });
      q.textContent = labels[i];
      const k = svg("text", { transform: "translate(" + (i * cell + cell / 2) + ",-6) rotate(-90)",
        "dominant-baseline": "central", "font-size": font });
      k.textContent = labels[i];
      body.append(q, k);
      qLabels[i] = q;
      kLabels[i] = k;
    }
    const box = svg("rect", { width: cell, height: cell, fill: "none", stroke: "#e8590c",
      "stroke-width": 2, visibility: "hidden", "pointer-events": "none" });
    body.append(box);
    let active = [];
    root.addEventListener("mousemove", (event) => {
      const p = new DOMPoint(event.clientX, event.clientY).matrixTransform(
        body.getScreenCTM().inverse());
      const i = Math.floor(p.y / cell), j = Math.floor(p.x / cell);
      for (const label of active) label.classList.remove("active");
      if (i < 0 || j < 0 || i >= n || j >= n) { box.setAttribute("visibility", "hidden");
        hideTip(); return; }
      box.setAttribute("x", j * cell - 0.5);
      box.setAttribute("y", i * cell - 0.5);
      box.setAttribute("visibility", "visible");
      active = [qLabels[i], kLabels[j]].filter(Boolean);
      for (const label of active) label.classList.add("active");
      const masked = causal && j > i ? " (masked: a later position)" : "";
      showTip("query '" + tokens[i] + "' (" + i + ") -> key '" + tokens[j] + "' (" + j + "): " +
        m[i][j].toFixed(3) + masked, event);
    });
    root.addEventListener("mouseleave", () => {
      box.setAttribute("visibility", "hidden");
      for (const label of active) label.classList.remove("active");
      hideTip();
    });
    const scale = el("div", { className: "pattern-scale" }, [
      el("span", { textContent: "weight" }), el("span", { textContent: "0" }),
      el("span", { className: "ramp", style: "background:" + ramp(12) }),
      el("span", { textContent: fmt(scaleMax) })]);
    if (causal) {
      const swatch = el("span", { className: "swatch", style: "background:" + rgb(MASKED) });
      scale.append(el("span", { className: "key" }, [swatch, "masked (causal)"]));
    }
    return el("div", {}, [root, scale]);
  }

  const tip = $("tooltip");
  function showTip(text, event) {
    tip.textContent = text;
    tip.hidden = false;
    const x = Math.min(event.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
    const y = event.clientY + 18 + tip.offsetHeight > window.innerHeight ?
      event.clientY - tip.offsetHeight - 10 : event.clientY + 18;
    tip.style.left = Math.max(4, x) + "px";
    tip.style.top = Math.max(4, y) + "px";
  }
  function hideTip() { tip.hidden = true; }

  $("statistic").addEventListener("change", (event) => {
    state.stat = event.target.value;
    paintGrid();
    if (state.layer !== null) renderInfo();
  });
  $("scale").addEventListener("change", renderPattern);
  let resizing = 0;
  window.addEventListener("resize", () => {
    clearTimeout(resizing);
    resizing = setTimeout(renderPattern, 150);
  });

  paintGrid();
  showExample();
  const first = data.layers.flatMap((layer, l) => layer.heads.map((h) => [l, h]))
    .find(([l, h]) => !isPruned(l, h));
  if (first) select(first[0], first[1]); else renderPattern();
})();
"""
