// qkv lab: what every page shares: the header, API calls, errors, and SVG drawing.
// The server computes; these functions only draw the numbers it sends.
"use strict";

const Lab = (() => {
  const PAGES = [
    ["explain", "Explain"], ["heatmap", "Heatmap"], ["positional", "Positional encodings"],
    ["complexity", "Complexity"], ["training", "Training"], ["model", "Model"],
  ];
  const SVG = "http://www.w3.org/2000/svg";
  let patterns = 0;

  function header(active) {
    const top = document.createElement("header");
    top.className = "top";
    const brand = document.createElement("div");
    brand.className = "brand";
    brand.innerHTML = "qkv <span>lab</span>";
    const nav = document.createElement("nav");
    for (const [name, title] of PAGES) {
      const a = document.createElement("a");
      a.href = "/" + name;
      a.textContent = title;
      if (name === active) a.className = "active";
      nav.appendChild(a);
    }
    top.append(brand, nav);
    document.body.prepend(top);
  }

  async function api(path, body, method) {
    const init = { method: method || (body === undefined ? "GET" : "POST"), headers: {} };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch("/api/" + path, init);
    const data = await response.json().catch(() => ({}));
    if (!response.ok) {
      const err = new Error(data.message || data.detail || response.statusText);
      err.status = response.status;
      throw err;
    }
    return data;
  }

  function showError(message) {
    const box = document.getElementById("error");
    box.textContent = message || "";
    box.classList.toggle("shown", Boolean(message));
  }

  function debounce(fn, ms) {
    let timer = null;
    return (...args) => { clearTimeout(timer); timer = setTimeout(() => fn(...args), ms); };
  }

  // Calls fn() again when any input inside root changes; only the latest answer is drawn.
  function live(root, fn, ms) {
    let ticket = 0;
    const run = debounce(async () => {
      const mine = ++ticket;
      try {
        const draw = await fn();
        if (mine === ticket && draw) { draw(); showError(""); }
      } catch (e) {
        if (mine === ticket) showError(e.message);
      }
    }, ms === undefined ? 60 : ms);
    root.addEventListener("input", run);
    root.addEventListener("change", run);
    return run;
  }

  function fmt(x, digits) {
    if (x === null || x === undefined) return "−∞";
    if (typeof x === "string") return x.replace("-inf", "−∞");
    const d = digits === undefined ? 4 : digits;
    if (x !== 0 && (Math.abs(x) < 1e-3 || Math.abs(x) >= 1e5)) return x.toExponential(2);
    return Number(x.toFixed(d)).toString();
  }

  function si(x, unit) {
    if (x === null || x === undefined) return "–";
    const steps = [[1e15, "P"], [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
    for (const [scale, prefix] of steps) {
      if (Math.abs(x) >= scale) return Number((x / scale).toPrecision(3)) + " " + prefix + unit;
    }
    return Number(x.toPrecision(3)) + " " + unit;
  }

  function el(tag, attrs, parent) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (parent) parent.appendChild(node);
    return node;
  }

  function mix(a, b, t) {
    return a.map((x, i) => Math.round(x + (b[i] - x) * t));
  }
  function ramp(stops, t) {
    const x = Math.min(1, Math.max(0, t)) * (stops.length - 1);
    const i = Math.min(stops.length - 2, Math.floor(x));
    const c = mix(stops[i], stops[i + 1], x - i);
    return `rgb(${c[0]},${c[1]},${c[2]})`;
  }
  const SEQUENTIAL = [[255, 255, 255], [205, 222, 245], [120, 165, 225], [40, 95, 190], [12, 38, 110]];
  const DIVERGING = [[28, 80, 160], [130, 170, 220], [247, 247, 247], [230, 140, 110], [170, 30, 40]];

  // A stable digest of the numbers drawn: tests compare it before and after a control moves.
  function digest(values) {
    let h = 2166136261;
    const text = JSON.stringify(values);
    for (let i = 0; i < text.length; i++) { h ^= text.charCodeAt(i); h = Math.imul(h, 16777619); }
    return (h >>> 0).toString(16);
  }

  // Heatmap of a matrix (rows × cols) as SVG rects. null cells (hidden keys, −∞) are hatched grey.
  // opts: {title, rowLabels, colLabels, diverging, min, max, cell, margin: [{label, values, max}], xLabel, yLabel}
  function heatmap(container, matrix, opts) {
    const o = opts || {};
    const rows = matrix.length, cols = rows ? matrix[0].length : 0;
    const flat = matrix.flat().filter((x) => x !== null);
    let lo = o.min, hi = o.max;
    if (lo === undefined) lo = Math.min(...flat);
    if (hi === undefined) hi = Math.max(...flat);
    if (o.diverging) { const m = Math.max(Math.abs(lo), Math.abs(hi)) || 1; lo = -m; hi = m; }
    const span = hi - lo || 1;
    const cell = o.cell || Math.max(3, Math.min(28, Math.floor((o.width || 520) / Math.max(rows, cols))));
    const left = o.rowLabels ? 34 : 8, top = (o.title ? 20 : 4) + (o.colLabels ? 16 : 0);
    const margins = o.margin || [];
    const marginW = margins.length * 62;
    const w = left + cols * cell + (margins.length ? 10 + marginW : 0) + 8;
    const h = top + rows * cell + (o.noScale ? 6 : 30);
    const svg = el("svg", { width: w, height: h, viewBox: `0 0 ${w} ${h}`, role: "img" });
    if (o.title) el("text", { x: left, y: 13, "font-size": 12, "font-weight": 600, fill: "#1d2430" }, svg).textContent = o.title;
    const defs = el("defs", {}, svg);
    const pat = el("pattern", { id: "hatch" + (++patterns), width: 4, height: 4, patternUnits: "userSpaceOnUse",
                                 patternTransform: "rotate(45)" }, defs);
    el("rect", { width: 4, height: 4, fill: "#e4e7ec" }, pat);
    el("line", { x1: 0, y1: 0, x2: 0, y2: 4, stroke: "#c3c8d1", "stroke-width": 1.5 }, pat);
    const hatch = `url(#${pat.id})`;
    const grid = el("g", { class: "cells" }, svg);
    for (let i = 0; i < rows; i++) {
      for (let j = 0; j < cols; j++) {
        const v = matrix[i][j];
        const r = el("rect", { x: left + j * cell, y: top + i * cell, width: cell, height: cell,
                               fill: v === null ? hatch : ramp(o.diverging ? DIVERGING : SEQUENTIAL, (v - lo) / span) }, grid);
        if (cell >= 10) el("title", {}, r).textContent = `[${i}, ${j}] = ${fmt(v)}`;
      }
    }
    el("rect", { x: left, y: top, width: cols * cell, height: rows * cell, fill: "none", stroke: "#9aa3b2" }, svg);
    const every = (n) => Math.max(1, Math.ceil(n / Math.max(1, Math.floor((n * cell) / 16))));
    if (o.rowLabels) {
      const k = every(rows);
      for (let i = 0; i < rows; i += k) {
        el("text", { x: left - 4, y: top + i * cell + cell / 2 + 4, "text-anchor": "end", "font-size": 10, fill: "#5d6878" }, svg)
          .textContent = o.rowLabels[i];
      }
    }
    if (o.colLabels) {
      const k = every(cols);
      for (let j = 0; j < cols; j += k) {
        el("text", { x: left + j * cell + cell / 2, y: top - 4, "text-anchor": "middle", "font-size": 10, fill: "#5d6878" }, svg)
          .textContent = o.colLabels[j];
      }
    }
    margins.forEach((m, idx) => {
      const x0 = left + cols * cell + 10 + idx * 62;
      el("text", { x: x0, y: top - 4, "font-size": 10, fill: "#5d6878" }, svg).textContent = m.label;
      const mmax = m.max || Math.max(1e-12, ...m.values.filter((x) => x !== null));
      m.values.forEach((v, i) => {
        const bw = v === null ? 0 : Math.max(0, (54 * v) / mmax);
        el("rect", { x: x0, y: top + i * cell + 1, width: bw, height: Math.max(1, cell - 2), fill: "#9db7e8" }, svg);
        if (cell >= 12) el("text", { x: x0 + 2, y: top + i * cell + cell / 2 + 4, "font-size": 9, fill: "#1d2430" }, svg)
          .textContent = fmt(v, 2);
      });
    });
    const ly = top + rows * cell + 8;
    const bar = el("g", { display: o.noScale ? "none" : "inline" }, svg);
    for (let s = 0; s < 40; s++) {
      el("rect", { x: left + s * 3, y: ly, width: 3, height: 8, fill: ramp(o.diverging ? DIVERGING : SEQUENTIAL, s / 39) }, bar);
    }
    if (!o.noScale) {
      el("text", { x: left, y: ly + 20, "font-size": 10, fill: "#5d6878" }, svg).textContent = fmt(lo, 3);
      el("text", { x: left + 120, y: ly + 20, "font-size": 10, fill: "#5d6878", "text-anchor": "end" }, svg).textContent = fmt(hi, 3);
    }
    if (o.xLabel) el("text", { x: left + 130, y: ly + 8, "font-size": 10, fill: "#5d6878" }, svg).textContent = o.xLabel;
    const fig = document.createElement("div");
    fig.className = "figure";
    fig.appendChild(svg);
    fig.dataset.digest = digest(matrix);
    container.appendChild(fig);
    return fig;
  }

  // Line chart: series [{name, color, points: [[x, y], ...], dashed}], opts {logX, logY, xLabel, yLabel, width, height, yFormat}
  function lineChart(container, series, opts) {
    const o = opts || {};
    const W = o.width || 520, H = o.height || 240, L = 62, R = 14, T = 22, B = 34;
    const pts = series.flatMap((s) => s.points).filter((p) => p[1] !== null && isFinite(p[1]) && (!o.logY || p[1] > 0));
    const tx = (x) => (o.logX ? Math.log10(x) : x), ty = (y) => (o.logY ? Math.log10(y) : y);
    let x0 = Math.min(...pts.map((p) => tx(p[0]))), x1 = Math.max(...pts.map((p) => tx(p[0])));
    let y0 = Math.min(...pts.map((p) => ty(p[1]))), y1 = Math.max(...pts.map((p) => ty(p[1])));
    if (o.yMin !== undefined) y0 = Math.min(y0, o.yMin);
    if (o.yMax !== undefined) y1 = Math.max(y1, o.yMax);
    if (!pts.length) { x0 = 0; x1 = 1; y0 = 0; y1 = 1; }
    if (x1 === x0) x1 = x0 + 1;
    if (y1 === y0) y1 = y0 + 1;
    const sx = (x) => L + ((tx(x) - x0) / (x1 - x0)) * (W - L - R);
    const sy = (y) => T + (1 - (ty(y) - y0) / (y1 - y0)) * (H - T - B);
    const svg = el("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img" });
    if (o.title) el("text", { x: L, y: 14, "font-size": 12, "font-weight": 600, fill: "#1d2430" }, svg).textContent = o.title;
    el("rect", { x: L, y: T, width: W - L - R, height: H - T - B, fill: "#fbfcfd", stroke: "#d9dee6" }, svg);
    // Ticks: five even steps, or the powers of ten inside a log axis (thinned to at most six).
    const ticks = (a, b, log) => {
      if (log && Math.floor(b) - Math.ceil(a) >= 1) {
        const all = [];
        for (let e = Math.ceil(a); e <= Math.floor(b); e++) all.push(e);
        const k = Math.ceil(all.length / 6);
        return all.filter((_, i) => i % k === 0);
      }
      return [0, 1, 2, 3, 4].map((i) => a + ((b - a) * i) / 4);
    };
    const yf = o.yFormat || ((v) => fmt(v, 3));
    for (const v of ticks(y0, y1, o.logY)) {
      const y = T + (1 - (v - y0) / (y1 - y0)) * (H - T - B);
      el("line", { x1: L, x2: W - R, y1: y, y2: y, stroke: "#eceff3" }, svg);
      el("text", { x: L - 6, y: y + 4, "text-anchor": "end", "font-size": 10, fill: "#5d6878" }, svg)
        .textContent = yf(o.logY ? 10 ** v : v);
    }
    for (const v of ticks(x0, x1, o.logX)) {
      const x = L + ((v - x0) / (x1 - x0)) * (W - L - R);
      el("text", { x, y: H - B + 14, "text-anchor": "middle", "font-size": 10, fill: "#5d6878" }, svg)
        .textContent = o.logX ? si(10 ** v, "").replace(" ", "") : fmt(v, 0);
    }
    if (o.xLabel) el("text", { x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle", "font-size": 11, fill: "#5d6878" }, svg).textContent = o.xLabel;
    for (const s of series) {
      const good = s.points.filter((p) => p[1] !== null && isFinite(p[1]) && (!o.logY || p[1] > 0));
      if (!good.length) continue;
      el("path", { d: good.map((p, i) => `${i ? "L" : "M"}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(""),
                   fill: "none", stroke: s.color, "stroke-width": 2, "stroke-dasharray": s.dashed ? "5 4" : "none" }, svg);
      if (s.marks) for (const p of good) el("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 2.5, fill: s.color }, svg);
    }
    if (o.marker !== undefined) {
      const x = sx(o.marker);
      el("line", { x1: x, x2: x, y1: T, y2: H - B, stroke: "#9aa3b2", "stroke-dasharray": "3 3" }, svg);
    }
    const fig = document.createElement("div");
    fig.className = "figure";
    const legend = document.createElement("div");
    legend.className = "legend";
    for (const s of series) {
      const item = document.createElement("span");
      item.innerHTML = `<i style="background:${s.color}"></i>`;
      item.append(s.name);
      legend.appendChild(item);
    }
    fig.append(svg, legend);
    fig.dataset.digest = digest(series.map((s) => s.points));
    container.appendChild(fig);
    return fig;
  }

  // The mask controls: a kind select plus one input per parameter of the chosen kind.
  async function maskControls(fieldset, initial) {
    const spec = await api("masks");
    const select = fieldset.querySelector("select[name=mask]");
    const params = fieldset.querySelector(".params");
    for (const kind of spec.kinds) {
      const opt = document.createElement("option");
      opt.value = kind; opt.textContent = kind.replace("_", " ");
      select.appendChild(opt);
    }
    select.value = initial || "none";
    function build() {
      params.innerHTML = "";
      for (const [name, p] of Object.entries(spec.params[select.value] || {})) {
        const label = document.createElement("label");
        label.className = p.type === "bool" ? "check" : "field";
        label.title = p.help;
        const input = document.createElement("input");
        input.dataset.param = name;
        if (p.type === "bool") {
          input.type = "checkbox"; input.checked = Boolean(p.default);
          label.append(input, name.replace("_", " "));
        } else {
          input.type = "text";
          const d = p.default;
          input.value = Array.isArray(d) ? d.join("+") : (typeof d === "number" ? String(d) : "");
          input.placeholder = typeof d === "string" ? d : (d === null ? "none" : "");
          const span = document.createElement("span");
          span.className = "name"; span.textContent = name.replace("_", " ");
          label.append(span, input);
        }
        params.appendChild(label);
      }
    }
    select.addEventListener("change", build);
    build();
    return () => {
      const values = {};
      for (const input of params.querySelectorAll("input")) {
        if (input.type === "checkbox") values[input.dataset.param] = input.checked;
        else if (input.value.trim() !== "") values[input.dataset.param] = input.value.trim();
      }
      return { mask: select.value, mask_params: values };
    };
  }

  // Range inputs show their value in the <output> beside them.
  function bindOutputs(root) {
    for (const input of root.querySelectorAll("input[type=range]")) {
      const out = input.parentElement.querySelector("output");
      if (!out) continue;
      const show = () => { out.textContent = input.dataset.log ? fmt(10 ** Number(input.value), 3) : input.value; };
      input.addEventListener("input", show);
      show();
    }
  }

  function value(root, name) {
    const input = root.querySelector(`[name=${name}]`);
    if (input.type === "checkbox") return input.checked;
    if (input.type === "range" && input.dataset.log) return 10 ** Number(input.value);
    if (input.type === "range" || input.type === "number") return input.value === "" ? null : Number(input.value);
    return input.value;
  }

  document.addEventListener("DOMContentLoaded", () => header(document.body.dataset.page));

  return { header, api, showError, live, fmt, si, heatmap, lineChart, maskControls, bindOutputs, value, digest };
})();
