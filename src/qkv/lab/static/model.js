// Model: qkv.inspect on the server's model. The head view (tokens joined by lines as strong as
// the weights, hover to highlight), every layer × head, the sortable head summary, the rollout
// and what an approximation would lose. The server computes; this file only draws.
"use strict";

(async () => {
  const controls = document.getElementById("controls");
  const layerSelect = controls.querySelector("[name=layer]");
  const headSelect = controls.querySelector("[name=head]");
  const SVG = "http://www.w3.org/2000/svg";
  let last = null;
  let sortKey = null, sortDir = 1;

  const limits = await Lab.api("limits");
  controls.querySelector("[name=text]").maxLength = limits.max_model_chars;
  document.getElementById("limits").textContent =
    `At most ${limits.max_model_chars} characters and ${limits.max_model_tokens} tokens; ` +
    `${limits.max_model_runs} run(s) of the model at once.`;
  Lab.bindOutputs(controls);

  function el(tag, attrs, parent) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (parent) parent.appendChild(node);
    return node;
  }
  const num = (x, d) => (x === null || x === undefined ? "n/a" : Lab.fmt(x, d === undefined ? 3 : d));

  function options(select, n, all) {
    const keep = select.value;
    select.innerHTML = "";
    for (let i = 0; i < n; i++) {
      const opt = document.createElement("option");
      opt.value = String(i); opt.textContent = String(i);
      select.appendChild(opt);
    }
    if (all) {
      const opt = document.createElement("option");
      opt.value = "all"; opt.textContent = "all (mean)";
      select.appendChild(opt);
    }
    select.value = keep !== "" && (keep === "all" || Number(keep) < n) ? keep : "0";
  }

  // The weights shown in the head view: one head, or the mean over the layer's heads.
  function shownMatrix(r, li, head) {
    const heads = r.weights[li];
    if (head !== "all") return heads[Number(head)];
    return heads[0].map((row, i) => row.map((_, j) => heads.reduce((s, h) => s + h[i][j], 0) / heads.length));
  }

  function headView(r, li, head) {
    const box = document.getElementById("headview");
    box.innerHTML = "";
    const w = shownMatrix(r, li, head), n = r.tokens.length;
    const rowH = 20, xq = 150, xk = 360, top = 28;
    const svg = el("svg", { width: 520, height: top + n * rowH + 8, class: "headview", role: "img" });
    const title = head === "all" ? `layer ${r.layer_ids[li]}, mean of its heads` :
      `layer ${r.layer_ids[li]} head ${r.head_ids[Number(head)]}: ${r.heads[li * r.head_ids.length + Number(head)].label}`;
    el("text", { x: 10, y: 14, "font-size": 12, "font-weight": 600, fill: "#1d2430" }, svg).textContent = title;
    const links = el("g", {}, svg);
    for (let i = 0; i < n; i++) {
      for (let j = 0; j < n; j++) {
        if (w[i][j] < 0.01) continue;
        el("line", { class: "link", x1: xq + 6, y1: top + i * rowH - 4, x2: xk - 6, y2: top + j * rowH - 4,
                     "stroke-width": 2, "stroke-opacity": Math.min(1, w[i][j]).toFixed(3),
                     "data-q": i, "data-k": j }, links);
      }
    }
    const tokens = [];
    for (let i = 0; i < n; i++) {
      for (const [side, x, anchor] of [["q", xq, "end"], ["k", xk, "start"]]) {
        const t = el("text", { class: "token", x, y: top + i * rowH, "text-anchor": anchor, "font-size": 13,
                                "data-side": side, "data-i": i, fill: "#1d2430" }, svg);
        t.textContent = r.tokens[i];
        tokens.push(t);
      }
    }
    // Hover a query token (left): what it attends to; a key token (right): what attends to it.
    for (const t of tokens) {
      t.addEventListener("mouseenter", () => {
        svg.classList.add("hovering");
        t.classList.add("on");
        for (const line of links.children) line.classList.toggle("on", line.dataset[t.dataset.side] === t.dataset.i);
      });
      t.addEventListener("mouseleave", () => {
        svg.classList.remove("hovering");
        t.classList.remove("on");
        for (const line of links.children) line.classList.remove("on");
      });
    }
    const fig = document.createElement("div");
    fig.className = "figure";
    fig.id = "headfigure";
    fig.appendChild(svg);
    fig.dataset.digest = Lab.digest([w, title]);
    box.appendChild(fig);
  }

  function grid(r) {
    const box = document.getElementById("grid");
    box.innerHTML = "";
    const n = r.tokens.length, cell = Math.max(1, Math.floor(56 / n)), side = n * cell;
    const thumbs = document.createElement("div");
    thumbs.className = "thumbs";
    thumbs.style.gridTemplateColumns = `3.5em repeat(${r.head_ids.length}, ${side + 2}px)`;
    r.layer_ids.forEach((layer, li) => {
      const name = document.createElement("span");
      name.className = "note"; name.textContent = `layer ${layer}`;
      thumbs.appendChild(name);
      r.head_ids.forEach((head, hi) => {
        const svg = el("svg", { width: side, height: side, "data-layer": li, "data-head": hi });
        const summary = r.heads[li * r.head_ids.length + hi];
        el("title", {}, svg).textContent = `layer ${layer} head ${head}: ${summary.label}`;
        const m = r.weights[li][hi];
        for (let i = 0; i < n; i++) {
          for (let j = 0; j < n; j++) {
            if (m[i][j] < 0.02) continue;
            el("rect", { x: j * cell, y: i * cell, width: cell, height: cell, fill: "#2457c5",
                         "fill-opacity": Math.min(1, m[i][j]).toFixed(2) }, svg);
          }
        }
        if (String(li) === layerSelect.value && String(hi) === headSelect.value) svg.classList.add("selected");
        svg.addEventListener("click", () => {
          layerSelect.value = String(li); headSelect.value = String(hi);
          redraw();
        });
        thumbs.appendChild(svg);
      });
    });
    box.appendChild(thumbs);
  }

  function headTable(r) {
    const table = document.getElementById("heads");
    const a = r.approximations, window = a.methods.indexOf("window");
    const rows = r.heads.map((s, k) => {
      const li = Math.floor(k / r.head_ids.length), hi = k % r.head_ids.length;
      return { layer: s.layer, head: s.head, pattern: s.label, score: s.score, entropy: s.entropy,
               outside: a.mass_outside[window][li][hi] };
    });
    const columns = [["layer", "layer"], ["head", "head"], ["pattern", "pattern"], ["score", "score"],
                     ["entropy", "entropy / log n"], ["outside", `mass outside window ${a.params.window}`]];
    if (sortKey) {
      rows.sort((x, y) => (x[sortKey] < y[sortKey] ? -1 : x[sortKey] > y[sortKey] ? 1 : 0) * sortDir);
    }
    table.innerHTML = "";
    const head = table.createTHead().insertRow();
    for (const [key, name] of columns) {
      const th = document.createElement("th");
      th.textContent = name; th.dataset.key = key;
      if (key === sortKey) th.dataset.dir = sortDir > 0 ? "asc" : "desc";
      th.addEventListener("click", () => {
        sortDir = sortKey === key ? -sortDir : 1;
        sortKey = key;
        headTable(r);
      });
      head.appendChild(th);
    }
    const body = table.createTBody();
    for (const row of rows) {
      const tr = body.insertRow();
      for (const [key] of columns) {
        const td = tr.insertCell();
        td.textContent = typeof row[key] === "number" && key !== "layer" && key !== "head" ? num(row[key], 2) : row[key];
        if (typeof row[key] === "number") td.className = "num";
      }
    }
  }

  function approxTable(r, li, head) {
    const a = r.approximations;
    const list = document.getElementById("approx-summary");
    list.innerHTML = "";
    for (const line of a.summary) {
      const item = document.createElement("li");
      item.textContent = line;
      list.appendChild(item);
    }
    const table = document.getElementById("approx");
    table.innerHTML = "";
    const one = head !== "all";
    const hi = one ? Number(head) : null;
    const title = one ? `layer ${r.layer_ids[li]} head ${r.head_ids[hi]}` : `layer ${r.layer_ids[li]}, mean of its heads`;
    const tr = table.createTHead().insertRow();
    for (const name of ["approximation", `output error (${title})`, "KL (nats)", "mass outside"]) {
      const th = document.createElement("th");
      th.textContent = name;
      tr.appendChild(th);
    }
    const mean = (xs) => {
      const good = xs.filter((x) => x !== null);
      return good.length ? good.reduce((s, x) => s + x, 0) / good.length : null;
    };
    const pick = (table3, m) => (one ? table3[m][li][hi] : mean(table3[m][li]));
    const body = table.createTBody();
    a.methods.forEach((method, m) => {
      const row = body.insertRow();
      row.insertCell().textContent = a.labels[m];
      for (const t of [a.error, a.kl, a.mass_outside]) {
        const td = row.insertCell();
        const v = pick(t, m);
        td.textContent = v === null ? (t === a.kl ? "∞ or n/a" : "n/a") : num(v, 3);
        td.className = "num";
      }
    });
  }

  function redraw() {
    const r = last;
    if (!r) return;
    const li = Number(layerSelect.value), head = headSelect.value;
    headView(r, li, head);
    grid(r);
    approxTable(r, li, head);
  }

  function draw(r) {
    last = r;
    options(layerSelect, r.layer_ids.length, false);
    options(headSelect, r.head_ids.length, true);
    document.getElementById("summary").textContent =
      `${r.model} (${r.architecture}): ${r.tokens.length} tokens, ${r.n_layers} layers × ${r.n_heads} heads` +
      (r.causal ? ", causal" : "");
    redraw();
    headTable(r);
    const rollout = document.getElementById("rollout");
    rollout.innerHTML = "";
    Lab.heatmap(rollout, r.rollout, {
      title: "attention rollout (Abnar & Zuidema 2020): row i, where token i's last-layer state comes from",
      rowLabels: r.tokens, colLabels: r.tokens.map((t) => t.slice(0, 4)), min: 0, width: 420,
      xLabel: "share",
    });
  }

  for (const select of [layerSelect, headSelect]) {
    select.addEventListener("change", (e) => { e.stopPropagation(); redraw(); });
  }
  Lab.live(controls, async () => {
    const body = { text: controls.querySelector("[name=text]").value, window: Lab.value(controls, "window") };
    if (!body.text.trim()) return null;
    // the server loads its model once (tens of seconds on a slow machine): say so until the first answer
    const summary = document.getElementById("summary");
    if (!last) summary.textContent = "Loading the model and running it on your text…";
    let r;
    try {
      r = await Lab.api("model", body);
    } catch (e) {
      if (!last) summary.textContent = "";
      throw e;
    }
    return () => draw(r);
  }, 400);
  controls.dispatchEvent(new Event("change"));
})().catch((e) => Lab.showError(e.message));
